package policy

import "github.com/nri-gpu/nri-gpu/pkg/specs"

// Usage is what a device offers and who uses how much of it, as the pool
// counts it through every door: for showing who holds which GPU and how
// full a shared one is.
type Usage struct {
	// Capacity is what the device offers all its users together: the
	// policy.sharing entry's shares and memory where it shares the
	// device, else one share.
	Capacity Capacity
	// Used is what its users consume of it together. A user of
	// overlapping hardware that is not the same device ("all", a MIG
	// device of a shared GPU) takes all of it.
	Used Use
	// Users are its holders, one entry each: claims by UID, then pods
	// by ID.
	Users []User
}

// User is a holder of a device and what it consumes of it.
type User struct {
	// Pod is the pod that holds it, when Claim is nil.
	Pod Pod
	// Claim is the prepared DRA claim that holds it.
	Claim *Claim
	// Device is the device it holds: the one asked of, another name of
	// it, or hardware that overlaps it (a MIG device of a GPU, "all").
	Device specs.Device
	// Kubelet says kubelet allocated it to the pod (a device plugin's);
	// Counted that the pod got it for a count request; Found that it was
	// found in the pod's containers with no record of how it got it.
	Kubelet, Counted, Found bool
	// Use is what it consumes of the device.
	Use Use
}

// Usage returns what device d offers under p and who uses how much of it,
// on the pool as it is, whichever door each user came through.
func (a *Allocations) Usage(p *Policy, d specs.Device) Usage {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.judge(p, who{exclusive: true}, d)
	u := Usage{Capacity: Capacity{Shares: 1}}
	if v.share != nil {
		u.Capacity = v.capacity
	}
	whole := Use{Shares: u.Capacity.Shares, Memory: u.Capacity.Memory}
	seen := map[string]bool{}
	for _, h := range a.users(who{}, d) {
		if seen[h.key()] {
			continue
		}
		seen[h.key()] = true
		use := whole
		if v.share != nil && !h.Found && h.Device.Same(d) {
			use = v.capacity.use(h.Use)
		}
		h.Use = use
		u.Users = append(u.Users, h)
	}
	// Judged as an exclusive asker, every holder of a device no entry
	// shares keeps it, and of a shared one those that take all of it.
	switch {
	case len(v.blocked) > 0:
		u.Used = whole
	case v.share != nil:
		u.Used = v.used
	}
	return u
}
