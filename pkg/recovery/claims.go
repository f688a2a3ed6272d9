package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// How long nri-gpu, back, goes on asking whether the running containers
// it did not create use claims (the DRA driver starts after it, and the
// API server may be slow to answer), and how long one question may take.
const (
	ClaimCheckFor = 2 * time.Minute
	claimAskFor   = 10 * time.Second
	claimRetry    = time.Second
)

// MayUseClaims returns those of found (running containers nri-gpu did
// not create) that may use one of the prepared claims: the containers of
// the pods of the claims' namespaces (policy.Claim.MayBeUsedBy).
func MayUseClaims(found []Stopping, claims []policy.ClaimHolding) []Stopping {
	return slices.DeleteFunc(found, func(s Stopping) bool {
		return !slices.ContainsFunc(claims, func(c policy.ClaimHolding) bool { return c.Claim.MayBeUsedBy(s.Pod.GetNamespace()) })
	})
}

// ClaimCheck tells whether a running container nri-gpu did not create
// has the devices of the prepared claims it uses.
type ClaimCheck struct {
	// Finder tells which claims a container uses (the DRA driver).
	Finder link.Finder
	// Pool holds the prepared claims.
	Pool *policy.Allocations
}

// Unserved says why the container is to be stopped ("" when it has the
// devices of every claim it uses): it names a claim not reserved for its
// pod, or lacks a claim's devices; and which claims it uses, as the DRA
// driver told. It asks the driver until it answers, ctx is done or
// deadline passes, and then returns its error.
func (c ClaimCheck) Unserved(ctx context.Context, s Stopping, deadline time.Time) (string, []link.ClaimUse, error) {
	ref := link.PodRef{Namespace: s.Pod.GetNamespace(), Name: s.Pod.GetName(), UID: s.Pod.GetUid()}
	for {
		ask, cancel := context.WithTimeout(ctx, min(claimAskFor, time.Until(deadline)))
		uses, err := c.Finder.Uses(ask, ref, s.Ctr.GetName())
		cancel()
		if errors.Is(err, link.ErrNotReserved) {
			return fmt.Sprintf("it names a claim not reserved for its pod: %v", err), nil, nil
		}
		if err == nil {
			return c.lacks(s.Ctr, uses), uses, nil
		}
		if time.Until(deadline) < claimRetry {
			return "", nil, err
		}
		select {
		case <-ctx.Done():
			return "", nil, err
		case <-time.After(claimRetry):
		}
	}
}

// lacks says which of the claims a container uses it lacks the devices
// of ("" when none).
func (c ClaimCheck) lacks(ctr *api.Container, uses []link.ClaimUse) string {
	var missing []string
	for _, u := range uses {
		_, devs, err := c.Pool.Claim(u.UID, u.Requests)
		if err != nil {
			missing = append(missing, fmt.Sprintf("claim %s/%s (%v)", u.Namespace, u.Name, err))
			continue
		}
		want := make([]specs.Device, 0, len(devs))
		for _, d := range devs {
			if len(d.Nodes) > 0 { // a device of no node is not seen in a container
				want = append(want, d.Device)
			}
		}
		if len(adjust.WithNodesOf(ctr, want)) < len(want) {
			missing = append(missing, fmt.Sprintf("the devices of claim %s/%s", u.Namespace, u.Name))
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "it was created while nri-gpu was not serving, without " + strings.Join(missing, ", ")
}
