package link_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// answers is a Finder that answers every container with uses and err.
func answers(uses []link.ClaimUse, err error) link.Finder {
	return finder(func(context.Context, link.PodRef, string) ([]link.ClaimUse, error) { return uses, err })
}

// TestUsed: a container gets the devices of the prepared claims its
// DRA driver says it uses, of the requests it names; a claim not
// reserved for its pod or not prepared refuses it; when the driver
// cannot tell, a pod that may use a prepared claim is refused
// (ErrClaimsUnknown) and another goes on without claims (ErrNoClaimMay).
func TestUsed(t *testing.T) {
	snap := testutil.Snapshot(t, testutil.GPUSpec(2))
	pol := policy.New(config.Policy{Devices: config.DefaultDevices})
	pool := policy.NewAllocations()
	gpu := func(i int) specs.Device { return snap.Footprints([]string{fmt.Sprintf("nvidia.com/gpu=%d", i)})[0] }
	claim := policy.ClaimHolding{Claim: policy.Claim{UID: "u1", Namespace: "team", Name: "gpus"},
		Devices: []policy.ClaimDevice{{Device: gpu(0), Requests: []string{"a"}}, {Device: gpu(1), Requests: []string{"b"}}}}
	if err := pool.RestoreClaims(pol, []policy.ClaimHolding{claim}); err != nil {
		t.Fatal(err)
	}
	down := errors.New("the API server does not answer")
	for _, tc := range []struct {
		name      string
		namespace string
		f         link.Finder
		uids      []string
		devices   []string
		err       error
		words     string
	}{
		{name: "every request", namespace: "team", f: answers([]link.ClaimUse{{UID: "u1", Namespace: "team", Name: "gpus"}}, nil),
			uids: []string{"u1"}, devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}},
		{name: "one request", namespace: "team", f: answers([]link.ClaimUse{{UID: "u1", Namespace: "team", Name: "gpus", Requests: []string{"b"}}}, nil),
			uids: []string{"u1"}, devices: []string{"nvidia.com/gpu=1"}},
		{name: "none", namespace: "team", f: answers(nil, nil)},
		{name: "no DRA driver", namespace: "team"},
		{name: "not prepared", namespace: "team", f: answers([]link.ClaimUse{{UID: "u2", Namespace: "team", Name: "other"}}, nil),
			err: policy.ErrNotPrepared, words: "claim team/other"},
		{name: "not reserved", namespace: "team", f: answers(nil, fmt.Errorf("claim x: %w", link.ErrNotReserved)), err: link.ErrNotReserved},
		{name: "cannot tell, a claim of the namespace prepared", namespace: "team", f: answers(nil, down), err: link.ErrClaimsUnknown, words: "team/gpus"},
		{name: "cannot tell, none of the namespace", namespace: "other", f: answers(nil, down), err: link.ErrNoClaimMay, words: down.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uids, devs, err := link.Used(context.Background(), tc.f, pool, link.PodRef{Namespace: tc.namespace, Name: "p", UID: "pu"}, "c")
			var names []string
			for _, d := range devs {
				names = append(names, d.Name)
			}
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v; want %v", err, tc.err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.words) {
				t.Errorf("error %q; want it to say %q", err, tc.words)
			}
			if diff := cmp.Diff(tc.uids, uids); diff != "" {
				t.Errorf("claims (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.devices, names); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
		})
	}
}
