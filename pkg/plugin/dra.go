package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// DRAView is the devices a DRA driver offers, and what preparing a claim
// holds, in the plugin's specs and pool.
type DRAView struct {
	p   *Plugin
	cfg config.DRA
}

// Devices returns the devices to offer (inventory.Offers): of the
// configured kinds, matching the configured globs and allowed by
// policy.devices, which no pod holds through another door (an
// annotation, a count, the device plugin), each with why it is unhealthy
// where it is. Devices held by claims stay: the scheduler knows them
// allocated.
func (c *DRAView) Devices(ctx context.Context) ([]link.Device, error) {
	if err := c.p.life.restore.await(ctx, kubeletBound(ctx)); err != nil {
		return nil, err
	}
	_, snap, pol := c.p.decision()
	// One kubelet allocated a device-plugin pod is not offered.
	ch := policy.Choice{Hooks: snap.Hooks, Kubelet: c.p.kubeletAllocations(ctx, snap, policy.PodName{}, c.p.log)}
	return c.p.node.hw.Offers(snap, pol, c.p.node.alloc, c.cfg.Kinds, c.cfg.Devices, ch), nil
}

// Prepare holds a claim's devices in the pool, under the policy (the
// admission's every step: each must resolve in the trusted specs with
// its hooks allowed, be healthy and free of every other holding). A GPU
// policy.sharing leaves unshared whose claim asks for MPS has its daemon
// started before the claim is recorded, or the claim is not prepared.
func (c *DRAView) Prepare(ctx context.Context, claim policy.Claim, allocated []link.Allocated) error {
	if err := c.p.life.restore.await(ctx, kubeletBound(ctx)); err != nil {
		return fmt.Errorf("%s: %w", claim, err)
	}
	_, snap, pol := c.p.decision()
	asked := link.Asked(snap, allocated)
	log := c.p.log.WithFields(logrus.Fields{"namespace": claim.Namespace, "claim": claim.Name})
	ch := policy.Choice{Unhealthy: c.p.node.hw.Unhealthy(snap), Kubelet: c.p.kubeletAllocations(ctx, snap, policy.PodName{}, log)}
	admitted, err := c.p.node.alloc.AdmitClaim(pol, claim, asked, ch)
	if err != nil || admitted == nil {
		return err // refused, or kubelet asked again: nothing new to record
	}
	// One undo, whichever step fails: the claim is let go and the
	// daemons started for it stop, their GPUs back in Default (sync
	// stops those no holder wants any more).
	undo := func() {
		admitted()
		c.p.node.mps.sync(ctx)
	}
	// The daemons of the GPUs the claim has MPS run on for itself.
	own, err := c.p.node.mps.sharing(pol, snap).Own(claim, asked)
	if err != nil {
		undo()
		return err
	}
	if err := c.p.node.mps.startForClaim(ctx, own); err != nil {
		undo()
		return fmt.Errorf("%s: %w", claim, err)
	}
	// Not recorded, not prepared: kubelet tries again.
	if err := c.p.saveOrUndo(undo); err != nil {
		return fmt.Errorf("%s: %w", claim, err)
	}
	return nil
}

// Unprepare releases what a claim holds, and records it. When the record
// cannot be written it returns the error, and kubelet asks again: the
// devices are free meanwhile, but a restart would find the claim in the
// record (the DRA driver then releases it if the API server no longer
// has it on this node).
func (c *DRAView) Unprepare(ctx context.Context, uid string) error {
	return c.release(ctx, uid, func() ([]string, error) { return c.p.node.alloc.ReleaseClaim(uid), nil })
}

// Release releases what a claim the API server no longer has holds,
// unless the containers of pods the pool tracks still use it (an error
// wrapping policy.ErrClaimInUse).
func (c *DRAView) Release(ctx context.Context, uid string) error {
	return c.release(ctx, uid, func() ([]string, error) { return c.p.node.alloc.ReleaseUnused(uid) })
}

// release releases claim uid through forget, which returns the names of
// the devices it held, and records it.
func (c *DRAView) release(ctx context.Context, uid string, forget func() ([]string, error)) error {
	_, _, pol := c.p.decision()
	_, devs, _ := c.p.node.alloc.Claim(uid, nil)
	released, err := forget()
	if err != nil {
		return err
	}
	if len(released) > 0 {
		c.p.log.WithFields(logrus.Fields{"claim": uid, "devices": strings.Join(released, ",")}).Info("released devices of DRA claim")
	}
	if slices.ContainsFunc(devs, pol.OwnMPS) {
		c.p.node.mps.sync(ctx) // its daemon stops, its GPU back in its compute mode
	}
	if err := c.p.saveAndNotify(); err != nil {
		return fmt.Errorf("claim %s released, but %w", uid, err)
	}
	return nil
}

// Prepared returns the claims the pool holds.
func (c *DRAView) Prepared(context.Context) ([]policy.Claim, error) {
	var out []policy.Claim
	for _, h := range c.p.node.alloc.Claims() {
		out = append(out, h.Claim)
	}
	return out, nil
}
