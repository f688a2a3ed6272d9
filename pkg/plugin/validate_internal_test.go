package plugin

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
)

// TestEvents: nri-gpu subscribes to validation only where the runtime's
// NRI asks validators; an older runtime refuses a plugin that subscribes
// to an event it does not know (containerd 1.7 and 2.0/2.1 have NRI v0.8).
func TestEvents(t *testing.T) {
	for _, tc := range []struct {
		nri      string
		validate bool
	}{
		{"v0.6.1", false},
		{"v0.8.0", false},
		{"v0.9.9", false},
		{"v0.10.0", true},
		{"v0.11.0", true},
		{"v0.12.0", true},
		{"v1.0.0", true},
		{"0.0.0-unknown", false},
		{"unknown", false},
		{"", false},
	} {
		ev := events(tc.nri)
		if got := ev.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT); got != tc.validate {
			t.Errorf("NRI %q: validation subscribed %v, want %v", tc.nri, got, tc.validate)
		}
		for _, e := range []api.Event{api.Event_CREATE_CONTAINER, api.Event_START_CONTAINER, api.Event_STOP_CONTAINER, api.Event_REMOVE_CONTAINER, api.Event_STOP_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX} {
			if !ev.IsSet(e) {
				t.Errorf("NRI %q: %s not subscribed", tc.nri, e)
			}
		}
		if extra := ev &^ api.MustParseEventMask("CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox", "ValidateContainerAdjustment"); extra != 0 {
			t.Errorf("NRI %q: subscribed to events nri-gpu does not handle: %s", tc.nri, extra.PrettyString())
		}
	}
}
