package plugin

import (
	"context"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// kubeletPatience bounds the wait for kubelet to say what it allocated.
const kubeletPatience = time.Second

// allocatedByKubelet returns what a request that asks for devices other
// than kubelet's must not take: the devices kubelet allocated other pods
// through nri-gpu's device plugins. kubelet allocates them when it admits
// a pod, before its containers are created and so before the pool knows
// them, and keeps them for the pod: a count request that took one would
// leave that pod's container refused until the count request's pod ends.
func (p *Plugin) allocatedByKubelet(ctx context.Context, r *creation, w policy.Want, log logrus.FieldLogger) []policy.KubeletAllocation {
	if w.Count == 0 && !slices.ContainsFunc(w.Named, func(d policy.Asked) bool { return d.Request == nil || !d.Request.FromKubelet() }) {
		return nil
	}
	return p.kubeletAllocations(ctx, r.Snap, adjust.PodOf(r.pod).Named(), log)
}

// kubeletAllocations returns the devices kubelet allocated pods (but
// pod; the zero PodName for none) through nri-gpu's device plugins, by
// their names in snap; none without a device plugin. A shared device's
// replicas are left out (kubelet counts them itself). When kubelet does
// not answer, that is logged and nothing is returned: the pool still
// refuses a device to a second holder, the kubelet pod's container then.
func (p *Plugin) kubeletAllocations(ctx context.Context, snap *specs.Snapshot, pod policy.PodName, log logrus.FieldLogger) []policy.KubeletAllocation {
	if len(p.doors.kubelet) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletPatience)
	defer cancel()
	out, err := deviceplugin.KubeletAllocations(ctx, p.inForce.start.DevicePlugin.PodResources, p.doors.kubelet, snap, pod)
	if err != nil {
		log.Warnf("not told which devices kubelet allocated (a count request or a claim may take one kubelet gave a pod whose container is not created yet): %v", err)
	}
	return out
}
