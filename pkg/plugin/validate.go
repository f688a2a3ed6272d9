package plugin

import (
	"context"
	"fmt"

	"github.com/Masterminds/semver/v3"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

var _ stub.ValidateContainerAdjustmentInterface = (*Plugin)(nil)

// validationSince is the first NRI version whose runtime side asks
// validators (containerd 2.2 and later). An older runtime refuses a plugin
// that subscribes to an event it does not know.
var validationSince = semver.MustParse("0.10.0")

// events returns the NRI events the plugin subscribes to on a runtime
// whose NRI version is nriVersion: those every NRI-enabled containerd
// knows, and ValidateContainerAdjustment where the runtime asks validators.
func events(nriVersion string) api.EventMask {
	m := api.MustParseEventMask("CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")
	if v, err := semver.NewVersion(nriVersion); err == nil && !v.LessThan(validationSince) {
		m.Set(api.Event_VALIDATE_CONTAINER_ADJUSTMENT)
	}
	return m
}

// ValidateContainerAdjustment refuses a container that would get a device
// twice: from nri-gpu's own edits, and from the runtime's CDI because
// another plugin asked for it with AddCDIDevice, as NVIDIA's NRI plugin
// does for nvidia.cdi.k8s.io. Only here does NRI show a plugin what the
// others asked for. The container is not created; its pod keeps what it
// holds, as after any failed creation, until it is removed.
func (p *Plugin) ValidateContainerAdjustment(_ context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	err := adjust.InjectedTwice(p.state().specs.Snapshot(), req)
	if err != nil {
		pod, ctr := req.GetPod(), req.GetContainer()
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()}).
			Errorf("refused: %v", err)
		p.metrics.Refused(rule(err))
		return bounded(fmt.Errorf("nri-gpu: container %q of pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err))
	}
	return nil
}
