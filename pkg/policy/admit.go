package policy

import (
	"errors"
	"slices"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Want is what one container of a pod asks the pool for.
type Want struct {
	// Pod is the container's pod.
	Pod Pod
	// Named are the devices asked for by name, resolved in the
	// request's snapshot.
	Named []Asked
	// Count asks for that many devices chosen as Choice says (0: none).
	Count int
	// Choice is what a count request chooses among, and how, and what
	// the node says of its devices (health, kubelet's allocations).
	Choice Choice
	// Claims are the UIDs of the prepared DRA claims the container uses:
	// the devices they hold are the pod's to use, and stay the claims'
	// holdings (they are not among Named); Used are those devices,
	// resolved, which the container is to be given.
	Claims []string
	Used   []Asked
}

// question returns the admission of what w asks, under a.mu.
func (a *Allocations) question(p *Policy, w Want) *question {
	return &question{p: p, a: a, pod: w.Pod, own: a.pods[w.Pod.ID], door: NRI, uses: w.Claims,
		named: w.Named, used: w.Used, count: w.Count, choice: a.withAllotted(w.Choice), exclusive: p.exclusive}
}

// A Plan is what a container would be granted, decided on the pool as it
// was: nothing is held until Commit.
type Plan struct {
	want Want
	// counted are the devices for the count request: the pod's own, or
	// chosen now (fresh).
	counted []specs.Device
	fresh   bool
	score   int
	// considered is what a fresh choice chose among and passed over.
	considered Considered
}

// Devices are the named devices and then the counted ones.
func (pl Plan) Devices() []specs.Device {
	return slices.Concat(footprintsOf(pl.want.Named), pl.counted)
}

// Counted are the devices for the pod's count request.
func (pl Plan) Counted() []specs.Device { return pl.counted }

// Grant is what Commit gives a container.
type Grant struct {
	// Pod is the pod the grant is for.
	Pod Pod
	// Devices are the named devices and then the counted ones.
	Devices []specs.Device
	// Counted are the devices chosen for the pod's count request.
	Counted []specs.Device
	// Considered is what the count request chose among and passed over.
	Considered Considered
	// Score is how closely the devices chosen for a count request are
	// connected: the sum of Links over their pairs (0 when one device was
	// chosen, the topology is unknown, or the pod had them already).
	Score int

	// added, addedKubelet, addedCount and addedClaims say what this
	// grant added to the pod's holding, for Revert.
	added        []string
	addedKubelet []string
	addedCount   bool
	addedClaims  []string
}

// ErrStale is wrapped by Commit's error when the pool changed since the
// plan so that its choice for a count request no longer holds (another
// request took a device it chose): plan again.
var ErrStale = errors.New("the pool changed since the plan")

// Plan decides, under p's rules (the admission's every step), whether a
// container of w.Pod may have the named devices and, for a count
// request, chooses w.Count devices as w.Choice says: free ones the
// container can have, the most closely connected set where the topology
// is known, else the first in spec order. It holds nothing. Containers
// of one pod share its devices: a pod's count request is answered with
// the same devices every time.
func (a *Allocations) Plan(p *Policy, w Want) (Plan, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.question(p, w)
	if err := q.decide(ofRequests, ofPool); err != nil {
		return Plan{}, err
	}
	q.plan.want = w
	return q.plan, nil
}

// Commit holds what the plan grants, if it still holds on the pool as
// it is now: the admission's steps that read what others hold are taken
// again (another pod may have taken a named device meanwhile: denied as
// Plan would), and a fresh choice for a count request must still be
// free (else ErrStale: plan again). What it returns is undone by
// Revert.
func (a *Allocations) Commit(p *Policy, pl Plan) (Grant, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := pl.want
	q := a.question(p, w)
	q.committing, q.plan = true, pl
	if err := q.decide(ofPool, ofPool); err != nil {
		return Grant{}, err
	}
	own := q.own
	if own == nil {
		own = &holding{pod: w.Pod}
	}
	// The pod's counted devices are replaced whole, never modified in
	// place, so the grant may share them.
	g := Grant{Pod: w.Pod, Devices: pl.Devices(), Counted: pl.counted, Score: pl.score, Considered: pl.considered}
	for _, d := range w.Named {
		if !slices.ContainsFunc(own.named, func(h specs.Device) bool { return h.Name == d.Name }) {
			own.named = append(own.named, d.Device)
			g.added = append(g.added, d.Name)
		}
		if d.fromKubelet() && !slices.Contains(own.kubelet, d.Name) {
			own.kubelet = append(own.kubelet, d.Name)
			g.addedKubelet = append(g.addedKubelet, d.Name)
		}
		if d.fromKubelet() {
			a.consumeAllotted(d.Device)
		}
	}
	for _, uid := range w.Claims {
		if !slices.Contains(own.claims, uid) {
			own.claims = append(own.claims, uid)
			g.addedClaims = append(g.addedClaims, uid)
		}
	}
	g.addedCount = own.counted == nil && pl.counted != nil
	own.counted = pl.counted
	a.pods[w.Pod.ID] = own
	return g, nil
}

// Added reports whether the grant added to what its pod holds (a device
// not held before, a count grant, or a claim its containers had not
// used): what must be recorded before the container may have it (a
// claim a pod's containers use stays held while the pod lives, across a
// restart too).
func (g Grant) Added() bool {
	return len(g.added) > 0 || len(g.addedKubelet) > 0 || g.addedCount || len(g.addedClaims) > 0
}

// Revert undoes what a grant added, when the container it was for could
// not be given its devices after all.
func (a *Allocations) Revert(g Grant) {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := a.pods[g.Pod.ID]
	if own == nil {
		return
	}
	own.named = slices.DeleteFunc(own.named, func(d specs.Device) bool { return slices.Contains(g.added, d.Name) })
	own.kubelet = slices.DeleteFunc(own.kubelet, func(n string) bool { return slices.Contains(g.addedKubelet, n) })
	if g.addedCount {
		own.counted = nil
	}
	own.claims = slices.DeleteFunc(own.claims, func(uid string) bool { return slices.Contains(g.addedClaims, uid) })
	if own.empty() && len(own.claims) == 0 {
		delete(a.pods, g.Pod.ID)
	}
}

// Release forgets what a pod holds, and returns the names it held.
func (a *Allocations) Release(podID string) []string {
	names, _ := a.ReleaseIf(podID, func() bool { return true })
	return names
}

// ReleaseIf forgets what a pod holds, as Release does, if ended says,
// asked under the pool's lock, that the pod has ended: the check and the
// release are one step, which no admission comes between. It returns
// the names the pod held and what ended said.
func (a *Allocations) ReleaseIf(podID string, ended func() bool) ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !ended() {
		return nil, false
	}
	return a.release(podID), true
}

// release forgets what a pod holds, under a.mu.
func (a *Allocations) release(podID string) []string {
	h := a.pods[podID]
	delete(a.pods, podID)
	if h == nil {
		return nil
	}
	return specs.Names(h.all())
}
