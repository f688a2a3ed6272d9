package link_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// eventsOut is where the test binary, as the event command, writes its
// arguments and the events it read.
const eventsOut = "LINK_TEST_EVENTS_OUT"

// eventCommand is a stand-in for nri-gpu-dra event: it writes what it
// was given to the file eventsOut names, and fails when told to.
func eventCommand() int {
	events, err := link.ReadEvents(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	data, _ := json.Marshal(map[string]any{"args": os.Args[1:], "events": events})
	if err := os.WriteFile(os.Getenv(eventsOut), data, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if slices.Contains(os.Args, "--fail") {
		fmt.Fprintln(os.Stderr, "the API server refused")
		return 1
	}
	return 0
}

// TestPostEvents: the events reach the driver program's event command,
// each whole, with the arguments given; a command that fails is an
// error with what it said.
func TestPostEvents(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "got.json")
	t.Setenv(driverEnv, link.EventCommand)
	t.Setenv(eventsOut, out)
	events := []link.Event{
		{Namespace: "tenant", Pod: "a", UID: "uid-a", Container: "c", Reason: "StoppedByNRIGPU", Action: "Stop", Note: "why\nand more"},
		{Namespace: "tenant", Pod: "b", UID: "uid-b", Container: "d", Reason: "NotStoppedByNRIGPU", Action: "Stop", Note: "why not"},
	}
	var stderr strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := link.PostEvents(ctx, self, []string{"--node", "node-a"}, events, &stderr); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Args   []string
		Events []link.Event
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Args, []string{link.EventCommand, "--node", "node-a"}) || !slices.Equal(got.Events, events) {
		t.Errorf("the command got %v, %+v; want the event command, --node node-a, and %+v", got.Args, got.Events, events)
	}

	stderr.Reset()
	err = link.PostEvents(ctx, self, []string{"--fail"}, events, &stderr)
	testutil.ErrorSays(t, err, "event", "exit status 1")
	if !strings.Contains(stderr.String(), "the API server refused") {
		t.Errorf("the command's output %q is not passed on", stderr.String())
	}
}

// TestReadEvents: what the event command reads is bounded: at most 1024
// events, each a JSON object on a line of less than 16 KiB.
func TestReadEvents(t *testing.T) {
	line := `{"namespace":"tenant","pod":"a","reason":"StoppedByNRIGPU"}` + "\n"
	for _, tc := range []struct {
		name  string
		input string
		want  int
		err   string
		is    error
	}{
		{name: "none", input: "", want: 0},
		{name: "two", input: line + line, want: 2},
		{name: "as many as read", input: strings.Repeat(line, 1024), want: 1024},
		{name: "too many", input: strings.Repeat(line, 1025), err: "more than 1024", is: link.ErrTooManyEvents},
		{name: "as long as read", input: noteLine(16<<10 - 1), want: 1},
		{name: "too long", input: noteLine(16 << 10), err: "too long"},
		{name: "not JSON", input: line + "}{\n", err: "event 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := link.ReadEvents(strings.NewReader(tc.input))
			if tc.err != "" {
				testutil.ErrorSays(t, err, tc.err)
				if tc.is != nil && !errors.Is(err, tc.is) {
					t.Errorf("%v is not %v", err, tc.is)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("read %d events, %v; want %d", len(got), err, tc.want)
			}
			if tc.want > 0 && (got[0].Pod != "a" || got[0].Reason != "StoppedByNRIGPU") {
				t.Errorf("read %+v", got[0])
			}
		})
	}
}

// noteLine is an event of pod a as a JSON line of n bytes, its newline
// aside.
func noteLine(n int) string {
	head, tail := `{"pod":"a","reason":"StoppedByNRIGPU","note":"`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail + "\n"
}
