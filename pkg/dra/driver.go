// Package dra is the Dynamic Resource Allocation glue of nri-gpu, run by
// its DRA driver process (nri-gpu-dra): through Kubernetes' kubelet-plugin
// helper it publishes the node's devices as ResourceSlices, prepares and
// unprepares the claims kube-scheduler allocated on them, and (Finder)
// tells which prepared claims a container being created uses, from the
// API server. What the devices are, and what preparing a claim holds,
// come from a link.Pool: nri-gpu's trusted specs and its one pool of
// holdings, shared with the NRI side and the device plugin, asked over
// the link to nri-gpu.
package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// ErrUnknownDevice is wrapped by the error preparing a claim allocated a
// device the driver does not offer on this node.
var ErrUnknownDevice = errors.New("not a device nri-gpu offers on this node")

// Driver is nri-gpu's DRA driver on one node.
type Driver struct {
	cfg  config.DRA
	node string
	src  link.Pool
	log  logrus.FieldLogger
	// Sysfs, when set, replaces the host's /sys for PCIe roots.
	Sysfs fs.ReadLinkFS
	// RollingUpdate, when set, is the UID of the pod the driver runs in:
	// it registers for kubelet's rolling update (two instances on the
	// node while one replaces the other, kubelet asking the newer).
	RollingUpdate types.UID
	// poll is how often the devices are looked at without Notify.
	poll time.Duration
	// Metrics, when set, records the claims prepared and unprepared, and
	// how long the ResourceSlice takes to follow a change.
	Metrics *metrics.DRA

	mu sync.Mutex
	// names are the CDI names of the devices offered so far, by their
	// ResourceSlice name, and infos what is known of them.
	names   map[string]string
	infos   map[string]link.Info
	changed chan struct{}
	// off are the features the API server dropped fields of (an older
	// release, or a gate turned off): DRADeviceTaints,
	// DRAConsumableCapacity.
	off map[string]bool

	// helper is the kubelet-plugin helper while Run serves kubelet;
	// failed why the last Run could not.
	helper atomic.Pointer[kubeletplugin.Helper]
	failed atomic.Pointer[error]
}

// The API server features whose fields the driver publishes, as
// resourceslice.DroppedFieldsError names them.
const (
	featureTaints   = "DRADeviceTaints"
	featureCapacity = "DRAConsumableCapacity"
)

// New returns the driver of node, configured by cfg.
func New(cfg config.DRA, node string, src link.Pool, log logrus.FieldLogger) *Driver {
	return &Driver{
		cfg:     cfg,
		node:    node,
		src:     src,
		log:     log.WithField("driver", cfg.DriverName),
		poll:    2 * time.Second,
		names:   map[string]string{},
		infos:   map[string]link.Info{},
		changed: make(chan struct{}),
		off:     map[string]bool{},
	}
}

// start serves kubelet through the kubelet-plugin helper, its sockets
// named to fit (socketsOf), and returns the helper; nil and why not (nil
// once ctx is done).
func (d *Driver) start(ctx context.Context, client kubernetes.Interface) (*kubeletplugin.Helper, error) {
	socks, err := socketsOf(d.cfg.DriverName, filepath.Join(d.cfg.PluginDir, d.cfg.DriverName), d.cfg.RegistryDir, d.RollingUpdate)
	if err != nil {
		return nil, d.fail(err)
	}
	if socks.Why != "" {
		d.log.Warnf("DRA driver registering without a rolling update (%s): an update of nri-gpu then stops the old driver before the new one registers, and kubelet's calls meanwhile fail and are retried", socks.Why)
	}
	opts := append([]kubeletplugin.Option{
		kubeletplugin.DriverName(d.cfg.DriverName),
		kubeletplugin.NodeName(d.node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.HealthService(true),
	}, socks.options(d.RollingUpdate)...)
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, d.fail(err)
	}
	d.helper.Store(helper)
	how := ""
	if socks.RollingUpdate {
		how = fmt.Sprintf(", for a rolling update (pod %s)", d.RollingUpdate)
	}
	d.log.Infof("DRA driver registering with kubelet at %s (its service at %s) for node %s%s", socks.Registrar, socks.Plugin, d.node, how)
	return helper, nil
}

// fail keeps why Run could not serve kubelet, for Registered, and returns
// it.
func (d *Driver) fail(err error) error {
	err = fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
	d.failed.Store(&err)
	return err
}

// Registered returns nil once kubelet has registered the driver (it told
// the helper so), and says why not otherwise: not serving kubelet (and
// why the last try failed), or kubelet has not registered it, or refused.
func (d *Driver) Registered() error {
	h := d.helper.Load()
	if h == nil {
		if err := d.failed.Load(); err != nil {
			return fmt.Errorf("not serving kubelet: %w", *err)
		}
		return errors.New("not serving kubelet yet")
	}
	switch st := h.RegistrationStatus(); {
	case st == nil:
		return errors.New("kubelet has not registered it yet (its plugin watcher has not found the registration socket, or not asked it)")
	case !st.PluginRegistered:
		return fmt.Errorf("kubelet refused its registration: %s", st.Error)
	}
	return nil
}

// Notify tells the driver that devices, their health or what is held may
// have changed: it publishes its ResourceSlice again at once if so.
func (d *Driver) Notify() {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *Driver) changes() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// sweepJitter is how much later than sweepInterval a sweep may come, as
// a fraction of it.
const sweepJitter = 0.1

// Run registers with kubelet through the kubelet-plugin helper and keeps
// the node's ResourceSlice current until ctx is done. At start, and every
// sweepInterval after, it releases the prepared claims the API server no
// longer has here (ReleaseGone).
func (d *Driver) Run(ctx context.Context, client kubernetes.Interface) error {
	helper, err := d.start(ctx, client)
	if helper == nil {
		return err // nil once ctx is done
	}
	defer func() {
		d.helper.Store(nil)
		helper.Stop()
	}()
	if err := d.ReleaseGone(ctx, client); err != nil {
		d.log.Warnf("prepared claims not checked against the API server (they stay held until kubelet unprepares them or nri-gpu starts again): %v", err)
	}
	if err := d.PrepareHeld(ctx, client); err != nil {
		d.log.Warnf("claims in use on this node not all held (their pods' next containers are refused): %v", err)
	}
	// Each sweep comes 0–10% later than sweepInterval, so that the
	// drivers of nodes started together do not ask the API server
	// together.
	sweep := time.NewTimer(wait.Jitter(d.cfg.SweepInterval, sweepJitter))
	defer sweep.Stop()
	var (
		last []resourceapi.Device
		// told is when nri-gpu told of a change not yet published.
		told time.Time
	)
	for published := false; ; {
		changed := d.changes()
		devs, err := d.offer(ctx)
		if err != nil {
			d.log.Warnf("the node's ResourceSlice not published again: %v", err)
		} else if published && equality.Semantic.DeepEqual(devs, last) {
			told = time.Time{} // nothing the slice shows changed
		} else {
			res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
				d.node: {Slices: []resourceslice.Slice{{Devices: devs}}},
			}}
			if err := helper.PublishResources(ctx, res); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
			}
			d.log.WithField("devices", describe(devs)).Info("published the node's ResourceSlice")
			if !told.IsZero() {
				d.Metrics.SliceFollowed(time.Since(told))
				told = time.Time{}
			}
			last, published = devs, true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			if told.IsZero() {
				told = time.Now()
			}
		case <-time.After(d.poll):
		case <-sweep.C:
			if err := d.ReleaseGone(ctx, client); err != nil {
				d.log.Warnf("prepared claims not checked against the API server (checked again in %s): %v", d.cfg.SweepInterval, err)
			}
			sweep.Reset(wait.Jitter(d.cfg.SweepInterval, sweepJitter))
		}
	}
}

// offer returns the ResourceSlice devices of the pool's devices, and
// remembers their CDI names.
func (d *Driver) offer(ctx context.Context) ([]resourceapi.Device, error) {
	devs, err := d.src.Devices(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]resourceapi.Device, 0, len(devs))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dev := range devs {
		if d.off[featureTaints] && dev.Info.Unhealthy != nil {
			continue // without taints, an unhealthy device leaves the slice
		}
		if d.off[featureCapacity] {
			dev.Info.Offer = nil // one claim at a time, as an unshared GPU
		}
		entry := DeviceOf(dev.Info, d.Sysfs)
		entry.Taints = Taints(d.cfg, dev.Info.Unhealthy)
		d.names[entry.Name] = dev.CDI
		d.infos[entry.Name] = dev.Info
		out = append(out, entry)
	}
	return out, nil
}

func describe(devs []resourceapi.Device) string {
	if len(devs) == 0 {
		return "none"
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	return strings.Join(names, ",")
}

// cdiName returns the CDI name of a device the driver offers.
func (d *Driver) cdiName(ctx context.Context, device string) (string, bool, error) {
	d.mu.Lock()
	name, ok := d.names[device]
	d.mu.Unlock()
	if ok {
		return name, true, nil
	}
	// A device offered since the last look, or after a restart.
	if _, err := d.offer(ctx); err != nil {
		return "", false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	name, ok = d.names[device]
	return name, ok, nil
}

// PrepareResourceClaims holds each claim's devices on this node in the
// pool and returns their CDI device IDs, which kubelet hands the runtime.
// A claim that cannot be prepared gets its reason, which kubelet puts in
// the pod's events; preparing a claim again (kubelet does, after a
// restart) returns the same devices.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		done := d.Metrics.Start(true)
		res, err := d.prepare(ctx, c)
		done(err != nil)
		log := d.log.WithFields(logrus.Fields{"namespace": c.Namespace, "claim": c.Name})
		if err != nil {
			log.Errorf("claim not prepared: %v", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("nri-gpu: %w", err)}
			continue
		}
		var names []string
		for _, dev := range res.Devices {
			names = append(names, dev.DeviceName)
		}
		log.WithField("devices", strings.Join(names, ",")).Info("prepared claim")
		out[c.UID] = res
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	claim := policy.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" {
			claim.Pods = append(claim.Pods, policy.PodName{Namespace: c.Namespace, Name: r.Name})
		}
	}
	var (
		res       kubeletplugin.PrepareResult
		allocated []link.Allocated
	)
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName || r.Pool != d.node {
			continue
		}
		name, ok, err := d.cdiName(ctx, r.Device)
		if err != nil {
			return res, fmt.Errorf("%s: device %q of pool %q: %w", claim, r.Device, r.Pool, err)
		}
		if !ok {
			return res, fmt.Errorf("%s: device %q of pool %q: %w", claim, r.Device, r.Pool, ErrUnknownDevice)
		}
		i := slices.IndexFunc(allocated, func(a link.Allocated) bool { return a.CDI == name })
		if i < 0 {
			allocated = append(allocated, link.Allocated{CDI: name})
			i = len(allocated) - 1
		}
		a := &allocated[i]
		a.Requests = append(a.Requests, resourceclaim.BaseRequestRef(r.Request))
		// One share of a device per request (ShareID): a claim allocated
		// one device twice consumes both.
		if n, ok := r.ConsumedCapacity[CapacityShares]; ok {
			a.Use.Shares += int(n.Value())
		} else if r.ShareID != nil {
			a.Use.Shares++
		}
		if m, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			a.Use.Memory += m.Value()
		}
		a.MemoryAsked = a.MemoryAsked || asksMemory(c, r.Request)
		d.mu.Lock()
		info := d.infos[r.Device]
		d.mu.Unlock()
		if a.GpuConfig, err = d.askedOf(c, r.Request, info.Index, info.UUID); err != nil {
			return res, fmt.Errorf("%s: %w", claim, err)
		}
		dev := kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID}
		if d.cfg.CDIDevices != config.CDINRIGPU {
			// For the runtime's own CDI, where it is on; nri-gpu injects
			// the claim's devices either way where it is not.
			dev.CDIDeviceIDs = []string{name}
		}
		res.Devices = append(res.Devices, dev)
	}
	if err := d.src.Prepare(ctx, claim, allocated); err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	return res, nil
}

// asksMemory reports whether the claim's request (or subrequest,
// "request/sub") names an amount of memory.
func asksMemory(c *resourceapi.ResourceClaim, request string) bool {
	base, sub, _ := strings.Cut(request, "/")
	for _, r := range c.Spec.Devices.Requests {
		if r.Name != base {
			continue
		}
		if sub == "" && r.Exactly != nil && r.Exactly.Capacity != nil {
			_, ok := r.Exactly.Capacity.Requests[CapacityMemory]
			return ok
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub && s.Capacity != nil {
				_, ok := s.Capacity.Requests[CapacityMemory]
				return ok
			}
		}
	}
	return false
}

// UnprepareResourceClaims releases what each claim holds. A claim not
// prepared (any more) is no error; a release that cannot be recorded is,
// so that kubelet asks again rather than forget a claim the record still
// holds.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		log := d.log.WithFields(logrus.Fields{"namespace": c.Namespace, "claim": c.Name})
		done := d.Metrics.Start(false)
		err := d.src.Unprepare(ctx, string(c.UID))
		done(err != nil)
		if err != nil {
			log.Errorf("claim not unprepared: %v", err)
			out[c.UID] = fmt.Errorf("nri-gpu: %w", err)
			continue
		}
		log.Info("unprepared claim")
		out[c.UID] = nil
	}
	return out, nil
}

// ReleaseGone releases the prepared claims that the API server no longer
// has (deleted, or replaced by another of the same name) or no longer
// allocates on this node through this driver: kubelet will never
// unprepare them (it forgot them, or nri-gpu restarted after an
// unprepare it could not record), and their devices would stay held for
// good. A claim the API server cannot be asked about stays held, and the
// error says so.
func (d *Driver) ReleaseGone(ctx context.Context, client kubernetes.Interface) error {
	prepared, err := d.src.Prepared(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range prepared {
		why, err := d.gone(ctx, client, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c, err))
			continue
		}
		if why == "" {
			continue
		}
		log := d.log.WithFields(logrus.Fields{"namespace": c.Namespace, "claim": c.Name})
		if err := d.src.Release(ctx, c.UID); errors.Is(err, policy.ErrClaimInUse) {
			log.Infof("kept a prepared claim that %s: %v (released at a sweep once they have ended)", why, err)
			continue
		} else if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c, err))
			continue
		}
		log.Infof("released a prepared claim that %s", why)
	}
	return errors.Join(errs...)
}

// gone says why claim c is no longer prepared on this node ("" when it
// is).
func (d *Driver) gone(ctx context.Context, client kubernetes.Interface, c policy.Claim) (string, error) {
	got, err := client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "the API server no longer has", nil
	case err != nil:
		return "", err
	case string(got.UID) != c.UID:
		return fmt.Sprintf("the API server has replaced (UID %s, not %s)", got.UID, c.UID), nil
	case got.Status.Allocation == nil:
		return "is no longer allocated", nil
	case d.here(got):
		return "", nil
	}
	return "is no longer allocated on this node", nil
}

// here reports whether the claim is allocated a device of this driver on
// this node.
func (d *Driver) here(c *resourceapi.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	return slices.ContainsFunc(c.Status.Allocation.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
		return r.Driver == d.cfg.DriverName && r.Pool == d.node
	})
}

// PrepareHeld prepares in the pool the claims of this node's pods that
// the API server allocates here through this driver and reserves for
// them, and that the pool does not hold: a lost record (set aside when it
// could not be read, or a node's /run emptied under running pods) forgot
// them, and kubelet, which prepared them once, does not ask again; their
// devices would be handed out through other doors while their pods run.
// It reads what the driver may read anyway (the node's pods, each claim
// by name), never every claim of the cluster. A claim the pool refuses
// now stays unheld, and the error names it.
func (d *Driver) PrepareHeld(ctx context.Context, client kubernetes.Interface) error {
	prepared, err := d.src.Prepared(ctx)
	if err != nil {
		return err
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.node).String()})
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, c := range prepared {
		held[c.UID] = true
	}
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != d.node {
			continue // the field selector asks for these alone; a client may ignore it
		}
		var names []string
		for j := range pod.Spec.ResourceClaims {
			name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[j])
			if err != nil || name == nil {
				continue // not made yet, or not needed: kubelet has not prepared it either
			}
			names = append(names, *name)
		}
		if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
			names = append(names, ext.ResourceClaimName) // for its extended resources
		}
		for _, name := range names {
			c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				errs = append(errs, fmt.Errorf("claim %s/%s of pod %s/%s: %w", pod.Namespace, name, pod.Namespace, pod.Name, err))
				continue
			}
			if held[string(c.UID)] || !d.here(c) || !resourceclaim.IsReservedForPod(pod, c, false) {
				continue
			}
			held[string(c.UID)] = true
			if _, err := d.prepare(ctx, c); err != nil {
				errs = append(errs, err)
				continue
			}
			d.log.WithFields(logrus.Fields{"namespace": c.Namespace, "claim": c.Name}).Info("prepared a claim in use on this node that nri-gpu's record did not hold")
		}
	}
	return errors.Join(errs...)
}

// HandleError logs what went wrong in the background (publishing the
// ResourceSlice); the helper retries. Where the API server dropped fields
// of a feature it does not have on (Kubernetes before 1.36, or a gate
// turned off), the driver publishes without them from then on, and says
// so once: without device taints an unhealthy device leaves the slice;
// without consumable capacity a shared GPU is offered to one claim at a
// time.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if !errors.As(err, &dropped) {
		d.log.Warnf("%s: %v", msg, err)
		return
	}
	d.mu.Lock()
	var news []string
	for _, f := range dropped.DisabledFeatures() {
		if !d.off[f] {
			d.off[f] = true
			news = append(news, f)
		}
	}
	d.mu.Unlock()
	for _, f := range news {
		switch f {
		case featureTaints:
			d.log.Warnf("the API server does not keep device taints (%s is off there, as before Kubernetes 1.36): an unhealthy device leaves the ResourceSlice instead of staying tainted", f)
		case featureCapacity:
			d.log.Warnf("the API server does not keep consumable capacity (%s is off there, as before Kubernetes 1.36): a GPU policy.sharing shares is offered to one claim at a time", f)
		default:
			d.log.Warnf("the API server dropped fields of the ResourceSlice (%s is off there): %v", f, err)
		}
	}
	if len(news) > 0 {
		d.Notify()
	}
}

// healthTimeout is how long kubelet keeps a device's health without a
// new report before it shows it as unknown; reports go at least every
// healthResend.
const (
	healthTimeout = 30 * time.Second
	healthResend  = 10 * time.Second
)

// WatchHealthStatus reports the health of the devices the driver offers
// to kubelet, which shows it in the status of the pods whose claims have
// them (allocatedResourcesStatus): at once, when it changes, and every
// healthResend, until ctx is done.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	var (
		last []kubeletplugin.DeviceHealth
		sent time.Time
	)
	for {
		changed := d.changes()
		devs, err := d.src.Devices(ctx)
		if err == nil {
			now := time.Now()
			report := healthOf(d.node, devs, now)
			if !sent.IsZero() && now.Sub(sent) < healthResend && sameHealth(report.Devices, last) {
				report.Devices = nil // nothing new to tell yet
			}
			if report.Devices != nil {
				select {
				case <-ctx.Done():
					return nil
				case reports <- report:
					last, sent = report.Devices, now
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(d.poll):
		}
	}
}

// healthOf is the health of devs, as of now.
func healthOf(node string, devs []link.Device, now time.Time) kubeletplugin.DeviceHealthReport {
	out := kubeletplugin.DeviceHealthReport{Devices: []kubeletplugin.DeviceHealth{}}
	for _, dev := range devs {
		h := kubeletplugin.DeviceHealth{PoolName: node, DeviceName: dev.Info.DeviceName(), Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthTimeout}
		if u := dev.Info.Unhealthy; u != nil {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, u.Reason
		}
		out.Devices = append(out.Devices, h)
	}
	return out
}

// sameHealth reports whether a and b say the same of the same devices.
func sameHealth(a, b []kubeletplugin.DeviceHealth) bool {
	return slices.EqualFunc(a, b, func(x, y kubeletplugin.DeviceHealth) bool {
		return x.DeviceName == y.DeviceName && x.Health == y.Health && x.Message == y.Message
	})
}
