package mps

import (
	"context"
	"errors"
	"fmt"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// ErrNotServed is wrapped by the error for a container whose MPS-shared
// GPU cannot be given with its bounds: never given unbounded.
var ErrNotServed = errors.New("MPS-shared GPU not served")

// Client returns what a container given gpus, the MPS-shared GPUs among
// its devices, needs: for its one GPU (a client reaches one daemon; two
// are refused), the daemon's directories and the client's limits, once
// the daemon is ready (Ready); none for none. A GPU whose daemon is not
// ready is refused, saying how to have one (mps.daemon: external) or
// where to look (managed).
func (m *Manager) Client(ctx context.Context, gpus []Want, limits Limits) (*cdispec.ContainerEdits, error) {
	switch len(gpus) {
	case 0:
		return nil, nil
	case 1:
	default:
		var names []string
		for _, g := range gpus {
			names = append(names, fmt.Sprintf("%q", g.Device))
		}
		return nil, fmt.Errorf("%w: the container would have %d MPS-shared GPUs (%s), and an MPS client reaches one GPU's daemon; give each container one of them",
			ErrNotServed, len(gpus), strings.Join(names, ", "))
	}
	g := gpus[0]
	if err := m.Ready(ctx, g.Daemon); err != nil {
		how := fmt.Sprintf("run one with CUDA_MPS_PIPE_DIRECTORY=%s, CUDA_MPS_LOG_DIRECTORY=%s and %s as its /dev/shm (mps.daemon: external)",
			g.Daemon.PipeDir(), g.Daemon.LogDir(), g.Daemon.ShmDir())
		if m.start != nil {
			how = "nri-gpu starts it (mps.daemon: managed): its log says why it could not"
		}
		return nil, fmt.Errorf("%w: device %q: %s shares it with MPS, but %v; nri-gpu does not give an MPS-shared GPU unbounded: %s",
			ErrNotServed, g.Device, g.By, err, how)
	}
	return g.Daemon.ClientEdits(limits), nil
}

// Started returns nil when the daemon of each of gpus (those a claim
// asked for, after a Sync) is ready, and else why each is not, with errs
// (what the Sync could not do: a start not recorded, a daemon that did
// not start).
func (m *Manager) Started(ctx context.Context, gpus []Want, errs []error) error {
	var not []error
	for _, g := range gpus {
		if err := m.Ready(ctx, g.Daemon); err != nil {
			not = append(not, fmt.Errorf("%w: device %q: the MPS daemon its claim asked for does not run: %w", ErrNotServed, g.Device, err))
		}
	}
	if len(not) == 0 {
		return nil
	}
	return errors.Join(append(not, errs...)...)
}

// ShmCommand is nri-gpu's command that mounts a directory on /dev/shm
// and runs a program (InShm).
const ShmCommand = "mps-shm"
