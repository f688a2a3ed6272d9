package link

import (
	"context"
	"errors"
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// ErrClaimsUnknown is wrapped by Used's error for a container of a pod
// that may use a prepared claim (one of the claim's namespace), when the
// driver cannot tell in time which claims the container uses (the API
// server is down or slow): it would run without its devices.
var ErrClaimsUnknown = errors.New("which DRA claims the container uses cannot be told")

// ErrNoClaimMay is wrapped by Used's error when the driver cannot tell
// which claims a container uses, but no prepared claim may be used by
// its pod: the container is created without claims.
var ErrNoClaimMay = errors.New("no DRA claim of this pod's namespace is prepared here")

// Used returns the UIDs of the prepared claims the container uses, as f
// says, and their devices in pool (those of the requests it names). A
// claim the container names that is not reserved for its pod is an error
// (ErrNotReserved), as is one pool has not prepared. When f cannot tell,
// the error wraps ErrClaimsUnknown if a prepared claim may be used by the
// pod (policy.Claim.MayBeUsedBy), ErrNoClaimMay otherwise. It waits as
// long as ctx lets it. Without a driver (f nil: DRA is off) a container
// uses no claim.
func Used(ctx context.Context, f Finder, pool *policy.Allocations, pod PodRef, container string) ([]string, []policy.ClaimDevice, error) {
	if f == nil {
		return nil, nil, nil
	}
	uses, err := f.Uses(ctx, pod, container)
	if errors.Is(err, ErrNotReserved) {
		return nil, nil, err
	}
	if err != nil {
		for _, c := range pool.Claims() {
			if c.Claim.MayBeUsedBy(pod.Namespace) {
				return nil, nil, fmt.Errorf("%s was prepared, and this pod may use it: %w: %w", c.Claim, ErrClaimsUnknown, err)
			}
		}
		return nil, nil, fmt.Errorf("%w; created without claims: %w", ErrNoClaimMay, err)
	}
	return UsedOf(pool, uses)
}

// UsedOf returns the UIDs of the prepared claims of uses and their
// devices in pool (those of the requests each names), as Used does once
// the driver has told which claims a container uses.
func UsedOf(pool *policy.Allocations, uses []ClaimUse) ([]string, []policy.ClaimDevice, error) {
	var (
		uids []string
		devs []policy.ClaimDevice
	)
	for _, u := range uses {
		_, d, err := pool.Claim(u.UID, u.Requests)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s/%s: %w (kubelet prepares a claim before the pod's containers are created)", u.Namespace, u.Name, err)
		}
		uids = append(uids, u.UID)
		devs = append(devs, d...)
	}
	return uids, devs, nil
}
