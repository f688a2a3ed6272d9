package dra

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// ReportingController is the controller nri-gpu's events name.
const ReportingController = "nri-gpu.io/nri-gpu"

// The most an event's note and its reporting instance may hold (the API
// server's bounds).
const (
	maxNote     = 1024
	maxInstance = 128
)

// PostEvents creates each event on the API server, as a Warning about
// its pod, reported by nri-gpu on node; the error joins those of the
// events not created.
func PostEvents(ctx context.Context, client kubernetes.Interface, node string, events []link.Event) error {
	var errs []error
	for _, e := range events {
		ev := EventOf(e, node, time.Now())
		if _, err := client.EventsV1().Events(e.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("event %s of pod %s/%s: %w", e.Reason, e.Namespace, e.Pod, err))
		}
	}
	return errors.Join(errs...)
}

// EventOf is the API object of an event about e's pod at now, reported
// on node.
func EventOf(e link.Event, node string, now time.Time) *eventsv1.Event {
	note := e.Note
	if len(note) > maxNote {
		note = strings.ToValidUTF8(note[:maxNote-3], "") + "..."
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      e.Pod + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: e.Namespace,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: ReportingController,
		ReportingInstance:   node[:min(len(node), maxInstance)],
		Action:              e.Action,
		Reason:              e.Reason,
		Regarding: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: e.Namespace, Name: e.Pod, UID: k8stypes.UID(e.UID),
		},
		Note: note,
		Type: corev1.EventTypeWarning,
	}
}
