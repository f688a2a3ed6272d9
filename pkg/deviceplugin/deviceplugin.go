// Package deviceplugin is the kubelet glue of nri-gpu: it offers kubelet
// the devices of a CDI kind as an extended resource through kubelet's
// device-plugin API (v1beta1), so that the scheduler and quotas count
// them, and answers kubelet's Allocate so that the runtime side injects
// exactly the devices kubelet chose. What the devices are, whether each is
// healthy and which to prefer come from a Source: nri-gpu's trusted specs
// and its one pool of holdings, shared with the NRI side.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/internal/perm"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var _ api.DevicePluginServer = (*Plugin)(nil)

// ErrUnknownDevice is wrapped by Allocate's error for a device ID the
// resource does not offer.
var ErrUnknownDevice = errors.New("unknown device")

// Device is a device a resource offers kubelet.
type Device struct {
	// ID is kubelet's name for it: its CDI device name within the kind
	// ("0", "GPU-<uuid>"), or a replica of a shared one (ReplicaID).
	ID string
	// Healthy says whether kubelet may hand it out.
	Healthy bool
}

// replicaSep separates a shared device's name from its replica's number
// in an ID, as NVIDIA's device plugin writes replicas.
const replicaSep = "::"

// ReplicaID is the ID of replica k of the shared device id: "0::1".
func ReplicaID(id string, k int) string { return id + replicaSep + strconv.Itoa(k) }

// DeviceOf returns the device an ID is of: the shared device of a
// replica's ID, else the ID itself.
func DeviceOf(id string) string {
	dev, _, _ := strings.Cut(id, replicaSep)
	return dev
}

// Source is where a resource's devices come from.
type Source interface {
	// Devices returns the resource's devices now, in order.
	Devices() []Device
	// Preferred chooses size devices among available, mustInclude
	// first, as nri-gpu would choose them.
	Preferred(available, mustInclude []string, size int) []string
}

// Plugin serves one extended resource to kubelet.
type Plugin struct {
	api.UnimplementedDevicePluginServer

	resource string
	kind     string
	dir      string
	socket   string
	mode     config.CDIDevices
	src      Source
	log      logrus.FieldLogger
	// poll is how often kubelet's socket and the devices are looked at.
	poll time.Duration

	mu      sync.Mutex
	changed chan struct{}
}

// Restoring is a Source whose pool is not to be told before it is
// restored (nri-gpu's, by the runtime's first Synchronize).
type Restoring interface {
	// Restored is closed once the pool is restored.
	Restored() <-chan struct{}
}

// New returns the device plugin of resource r, registering in kubelet's
// device-plugin directory dir and handing allocations over as mode says.
func New(r config.Resource, dir string, mode config.CDIDevices, src Source, log logrus.FieldLogger) *Plugin {
	return &Plugin{
		resource: r.Name,
		kind:     r.Kind,
		dir:      dir,
		mode:     mode,
		src:      src,
		log:      log.WithField("resource", r.Name),
		poll:     500 * time.Millisecond,
		changed:  make(chan struct{}),
	}
}

// Notify tells the plugin that devices, their health or what pods hold
// may have changed: ListAndWatch looks again at once.
func (p *Plugin) Notify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Plugin) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// Run serves kubelet until ctx is done: it waits for kubelet's
// registration socket, serves the device-plugin API on a socket of its
// own in the same directory and registers there; when kubelet restarts
// (it empties the directory and makes its socket anew) or nri-gpu's
// socket disappears, it does it all again.
func (p *Plugin) Run(ctx context.Context) error {
	kubeletSock := filepath.Join(p.dir, filepath.Base(api.KubeletSocket))
	first := true
	for {
		kubelet, err := p.waitFor(ctx, kubeletSock)
		if err != nil {
			return nil // ctx done
		}
		srv, err := p.serve()
		if err == nil {
			if err = p.register(ctx, kubeletSock); err != nil {
				srv.Stop()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.log.Warnf("registering with kubelet: %v; trying again", err)
			if !p.sleep(ctx, time.Second) {
				return nil
			}
			continue
		}
		p.log.Infof("registered with kubelet at %s as %s", kubeletSock, p.socket)
		if first {
			// kubelet runs a pod that asks for a resource no plugin has
			// registered yet, with nothing allocated, and tells no plugin.
			p.log.Warnf("kubelet hands out %s from now on; a pod it admitted before this registration (a static pod, or one bound to this node by name) got none and is not told: delete and recreate such pods", p.resource)
			first = false
		}
		p.waitRestart(ctx, kubeletSock, kubelet)
		srv.Stop()
		if ctx.Err() != nil {
			_ = os.Remove(p.socket)
			return nil
		}
		p.log.Info("kubelet restarted or nri-gpu's socket was removed; registering again")
	}
}

// waitFor waits until path exists and returns what it is; it says when
// it has to wait.
func (p *Plugin) waitFor(ctx context.Context, path string) (os.FileInfo, error) {
	if _, err := os.Stat(path); err != nil {
		p.log.Infof("waiting for kubelet's registration socket %s (start.devicePlugin.kubeletDir)", path)
	}
	for {
		if fi, err := os.Stat(path); err == nil {
			return fi, nil
		}
		if !p.sleep(ctx, p.poll) {
			return nil, ctx.Err()
		}
	}
}

// waitRestart returns when ctx is done, kubelet's socket is no longer the
// one registered with, or the plugin's own socket is gone.
func (p *Plugin) waitRestart(ctx context.Context, kubeletSock string, kubelet os.FileInfo) {
	for p.sleep(ctx, p.poll) {
		now, err := os.Stat(kubeletSock)
		if err != nil || !os.SameFile(now, kubelet) {
			return
		}
		if _, err := os.Stat(p.socket); err != nil {
			return
		}
	}
}

// sleep waits d, and reports false if ctx was done first.
func (p *Plugin) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// serve starts the gRPC server on a socket of a name not used before
// (the previous one removed): kubelet (1.37 at least) keeps an endpoint
// per socket path, and one it did not see go away (a client it dialled
// before it restarted, or before the pod of an earlier nri-gpu was
// replaced, reconnects to the new server at the same path) refuses every
// later registration there as "already connected", for as long as it
// runs. A new name each time is never refused.
func (p *Plugin) serve() (*grpc.Server, error) {
	if p.socket != "" {
		if err := removeStale(p.socket); err != nil {
			return nil, err
		}
	}
	p.socket = filepath.Join(p.dir, fmt.Sprintf("nri-gpu-%s-%s.sock", strings.ReplaceAll(p.resource, "/", "-"), strconv.FormatInt(time.Now().UnixNano(), 36)))
	return p.serveOn(p.socket)
}

// serveOn serves the device-plugin API on a unix socket at path, in the
// background, until the server returned is stopped.
func (p *Plugin) serveOn(path string) (*grpc.Server, error) {
	l, err := perm.ListenUnix(path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	api.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}

// removeStale removes the socket at path, if there is one.
func removeStale(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// register tells kubelet about the resource and the plugin's socket.
func (p *Plugin) register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version:      api.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &api.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

// GetDevicePluginOptions says the plugin chooses preferred allocations.
func (p *Plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends kubelet the devices and their health, once a
// Restoring source is restored, and again whenever they change: on
// Notify, and at least every poll interval (a device node that vanished).
// Until the first answer, kubelet keeps what it knew: after a restart
// the devices it marked unhealthy when the last endpoint went, through
// the relay the devices nri-gpu last told.
func (p *Plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	if r, ok := p.src.(Restoring); ok {
		select {
		case <-r.Restored():
		case <-stream.Context().Done():
			return nil
		}
	}
	var last []Device
	for sent := false; ; sent = true {
		changed := p.changes()
		devs := p.src.Devices()
		if !sent || !slices.Equal(devs, last) {
			if err := stream.Send(&api.ListAndWatchResponse{Devices: toAPI(devs)}); err != nil {
				return err
			}
			p.log.WithField("devices", Describe(devs)).Info("told kubelet the devices")
			last = devs
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		case <-time.After(p.poll):
		}
	}
}

func toAPI(devs []Device) []*api.Device {
	out := make([]*api.Device, 0, len(devs))
	for _, d := range devs {
		health := api.Unhealthy
		if d.Healthy {
			health = api.Healthy
		}
		out = append(out, &api.Device{ID: d.ID, Health: health})
	}
	return out
}

// Describe lists devices as the plugin logs them: "0 healthy, 1 unhealthy".
func Describe(devs []Device) string {
	var parts []string
	for _, d := range devs {
		h := "healthy"
		if !d.Healthy {
			h = "unhealthy"
		}
		parts = append(parts, d.ID+" "+h)
	}
	return strings.Join(parts, ", ")
}

// GetPreferredAllocation answers with the source's choice.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	resp := &api.PreferredAllocationResponse{}
	for _, r := range req.GetContainerRequests() {
		ids := p.src.Preferred(r.GetAvailableDeviceIDs(), r.GetMustIncludeDeviceIDs(), int(r.GetAllocationSize()))
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers, for each container, with the CDI devices of the IDs
// kubelet chose: as the cdi.k8s.io annotation of nri-gpu's device plugin,
// which nri-gpu's NRI side injects, or as CRI CDI devices, which the
// runtime injects itself. An Allotting source agrees first, or kubelet is
// answered its reason.
func (p *Plugin) Allocate(ctx context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	known := map[string]bool{}
	for _, d := range p.src.Devices() {
		known[d.ID] = true
	}
	vendor, class := parser.ParseQualifier(p.kind)
	resp := &api.AllocateResponse{}
	var ids []string // every container's, for the source to agree to
	for _, r := range req.GetContainerRequests() {
		ids = append(ids, r.GetDevicesIds()...)
		var names []string
		for _, id := range r.GetDevicesIds() {
			if !known[id] {
				return nil, fmt.Errorf("%w: %s has no device %q", ErrUnknownDevice, p.resource, id)
			}
			name := parser.QualifiedName(vendor, class, DeviceOf(id))
			if slices.Contains(names, name) {
				// The pool's rule, in its words (policy.ErrSameDeviceTwice).
				return nil, fmt.Errorf("kubelet chose %s for one container: %w", strings.Join(r.GetDevicesIds(), ", "), policy.SameDeviceTwice(name))
			}
			names = append(names, name)
		}
		c, err := p.answer(names)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	if a, ok := p.src.(Allotting); ok {
		if err := a.Allot(ctx, ids); err != nil {
			return nil, refused(fmt.Errorf("%s: kubelet chose %s: %w", p.resource, strings.Join(ids, ", "), err))
		}
	}
	for _, r := range req.GetContainerRequests() {
		p.log.WithField("devices", strings.Join(r.GetDevicesIds(), ",")).Info("kubelet allocated devices to a container")
	}
	return resp, nil
}

// answer is the answer for one container of the CDI devices names, as
// the plugin's mode hands them over.
func (p *Plugin) answer(names []string) (*api.ContainerAllocateResponse, error) {
	c := &api.ContainerAllocateResponse{}
	switch p.mode {
	case config.CDICRI:
		for _, n := range names {
			c.CdiDevices = append(c.CdiDevices, &api.CDIDevice{Name: n})
		}
	case config.CDINRIGPU:
		c.Annotations = map[string]string{policy.DevicePluginAnnotation(p.resource): strings.Join(names, ",")}
	default:
		ann, err := cdi.UpdateAnnotations(nil, policy.DevicePluginName, p.resource, names)
		if err != nil {
			return nil, err
		}
		c.Annotations = ann
	}
	return c, nil
}

// PreStartContainer is not used (the options do not ask for it).
func (p *Plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}
