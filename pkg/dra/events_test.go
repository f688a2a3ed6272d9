package dra_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// TestPostEvents: each event is created in its pod's namespace as a
// Warning about the pod (by UID, as kubectl describe finds it), reported
// by nri-gpu on the node; one the API server refuses is an error naming
// its pod, and the others are still created.
func TestPostEvents(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "gone" {
			return true, nil, errors.New(`namespaces "gone" not found`)
		}
		return false, nil, nil
	})
	events := []link.Event{
		{Namespace: "gone", Pod: "x", Reason: "StoppedByNRIGPU"},
		{Namespace: "tenant", Pod: "a", UID: "uid-a", Container: "c", Reason: "StoppedByNRIGPU", Action: "Stop", Note: "nri-gpu stopped container c"},
	}
	err := dra.PostEvents(context.Background(), client, "node-a", events)
	testutil.ErrorSays(t, err, "pod gone/x", `namespaces "gone" not found`)
	got, err := client.EventsV1().Events("tenant").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(got.Items) != 1 {
		t.Fatalf("events of tenant: %v, %v; want one", got, err)
	}
	e := got.Items[0]
	r := e.Regarding
	if r.Kind != "Pod" || r.Name != "a" || r.Namespace != "tenant" || r.UID != "uid-a" || e.Type != corev1.EventTypeWarning ||
		e.Reason != "StoppedByNRIGPU" || e.Action != "Stop" || e.Note != "nri-gpu stopped container c" ||
		e.ReportingController != dra.ReportingController || e.ReportingInstance != "node-a" || e.EventTime.IsZero() {
		t.Errorf("created %+v", e)
	}
}

// TestEventOf: what the API server bounds is cut to fit (a note of 1 KiB,
// whole characters; a reporting instance of 128 bytes), and two events
// of a pod have names of their own.
func TestEventOf(t *testing.T) {
	now := time.Now()
	long := link.Event{Namespace: "tenant", Pod: "a", Note: strings.Repeat("é", 1000)}
	e := dra.EventOf(long, strings.Repeat("n", 200), now)
	if len(e.Note) > 1024 || !utf8.ValidString(e.Note) || !strings.HasSuffix(e.Note, "...") {
		t.Errorf("a note of %d bytes is cut to %d (valid UTF-8 %v)", len(long.Note), len(e.Note), utf8.ValidString(e.Note))
	}
	if len(e.ReportingInstance) != 128 {
		t.Errorf("reporting instance of %d bytes", len(e.ReportingInstance))
	}
	short := dra.EventOf(link.Event{Namespace: "tenant", Pod: "a", Note: "why"}, "node-a", now)
	if short.Note != "why" {
		t.Errorf("a short note became %q", short.Note)
	}
	if later := dra.EventOf(long, "node-a", now.Add(time.Nanosecond)); later.Name == e.Name || !strings.HasPrefix(e.Name, "a.") {
		t.Errorf("names %q and %q", e.Name, later.Name)
	}
}
