package link

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
)

// EventCommand is the driver program's command that posts events: it
// reads them on its standard input, one JSON object a line, posts each
// as its pod's, and exits.
const EventCommand = "event"

// Bounds on what EventCommand reads: events, and the bytes of one (less
// than maxEventLine, its newline aside).
const (
	maxEvents    = 1024
	maxEventLine = 16 << 10
)

// ErrTooManyEvents is returned by ReadEvents for more than it reads.
var ErrTooManyEvents = errors.New("too many events")

// Event is what nri-gpu did to a container of a pod, for the pod's
// events: its reason ("StoppedByNRIGPU"), the action ("Stop") and a
// note saying why, for people.
type Event struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	UID       string `json:"uid"`
	Container string `json:"container"`
	Reason    string `json:"reason"`
	Action    string `json:"action"`
	Note      string `json:"note"`
}

// PostEvents runs the driver program at path as "path event args...",
// the events on its standard input, its output to stderr, until it exits
// or ctx is done.
func PostEvents(ctx context.Context, path string, args []string, events []Event, stderr io.Writer) error {
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, path, append([]string{EventCommand}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = &in, stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", path, EventCommand, err)
	}
	return nil
}

// ReadEvents reads the events PostEvents writes: at most 1024, each a
// line of less than 16 KiB.
func ReadEvents(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxEventLine)
	var events []Event
	for sc.Scan() {
		if len(events) == maxEvents {
			return nil, fmt.Errorf("%w: more than %d", ErrTooManyEvents, maxEvents)
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("event %d: %w", len(events)+1, err)
		}
		events = append(events, e)
	}
	return events, sc.Err()
}
