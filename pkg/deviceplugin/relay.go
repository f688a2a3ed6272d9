package deviceplugin

// The relay: kubelet's endpoint for a resource kept by a process of its
// own (nri-gpu relay, a container of nri-gpu's pod), which asks nri-gpu's
// device plugin, served beside it on a socket of its own (ServeAt), what
// the devices are. When nri-gpu's process dies, kubelet's connection to
// the relay does not: kubelet keeps the devices nri-gpu last told, and
// admits a pod asking for the resource, whose container nri-gpu then
// serves once it is back (docs/operations.md), instead of rejecting the
// pod for good because its last endpoint went away.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/nri-gpu/nri-gpu/internal/perm"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// RelaySocket is the socket in dir at which nri-gpu serves resource's
// device plugin to the relay.
func RelaySocket(dir, resource string) string {
	return filepath.Join(dir, strings.ReplaceAll(resource, "/", "-")+".sock")
}

// ServeAt serves the device-plugin API at path (a stale socket there
// replaced) until ctx is done, registering nowhere: the relay asks it.
func (p *Plugin) ServeAt(ctx context.Context, path string) error {
	if err := perm.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := removeStale(path); err != nil {
		return err
	}
	srv, err := p.serveOn(path)
	if err != nil {
		return err
	}
	p.log.Infof("serving the device-plugin API to nri-gpu relay at %s", path)
	<-ctx.Done()
	srv.Stop()
	_ = os.Remove(path)
	return nil
}

// preferWait bounds how long the relay asks nri-gpu for a preferred
// allocation before choosing itself.
const preferWait = 2 * time.Second

// allotWait bounds how long the relay asks nri-gpu to agree to an
// allocation: beyond nri-gpu's own wait for its restore (10 s).
const allotWait = 15 * time.Second

// Upstream is the Source of the relay: the devices nri-gpu's device
// plugin last told (kept while nri-gpu is away), and its preferred
// allocations while it answers.
type Upstream struct {
	path string
	log  logrus.FieldLogger
	// retry is how long it waits to connect again.
	retry time.Duration

	// answered is closed once nri-gpu has told its devices.
	answered chan struct{}
	once     sync.Once

	mu     sync.Mutex
	devs   []Device
	client api.DevicePluginClient
}

var (
	_ Source    = (*Upstream)(nil)
	_ Allotting = (*Upstream)(nil)
)

// NewUpstream returns the source that asks nri-gpu's device plugin at
// path.
func NewUpstream(path string, log logrus.FieldLogger) *Upstream {
	return &Upstream{path: path, log: log, retry: 200 * time.Millisecond, answered: make(chan struct{})}
}

// Answered is closed once nri-gpu has told its devices: the relay
// registers with kubelet only then, so that it never tells kubelet no
// devices (kubelet would take the last list told, from any endpoint of
// the resource, as the devices).
func (u *Upstream) Answered() <-chan struct{} { return u.answered }

// Run follows nri-gpu's device list until ctx is done, connecting again
// whenever the connection ends, and calls changed after each list.
func (u *Upstream) Run(ctx context.Context, changed func()) {
	away := false
	for ctx.Err() == nil {
		answered, err := u.follow(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		if answered || !away {
			u.log.Warnf("nri-gpu's device plugin does not answer (%v): kubelet keeps the devices it last told until it does", err)
			away = true
		}
		u.log.Debugf("trying nri-gpu's device plugin again in %s (%v)", u.retry, err)
		select {
		case <-ctx.Done():
		case <-time.After(u.retry):
		}
	}
}

// follow connects to nri-gpu's device plugin and takes each device list
// it sends until the stream ends; it says whether one came.
func (u *Upstream) follow(ctx context.Context, changed func()) (bool, error) {
	conn, err := grpc.NewClient("unix://"+u.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	client := api.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		return false, err
	}
	defer u.setClient(nil)
	for answered := false; ; answered = true {
		resp, err := stream.Recv()
		if err != nil {
			return answered, err
		}
		devs := fromAPI(resp.GetDevices())
		u.mu.Lock()
		u.devs, u.client = devs, client
		u.mu.Unlock()
		if !answered {
			u.log.WithField("devices", Describe(devs)).Info("nri-gpu's device plugin answers")
			u.once.Do(func() { close(u.answered) })
		}
		changed()
	}
}

func (u *Upstream) setClient(c api.DevicePluginClient) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.client = c
}

// Devices returns the devices nri-gpu last told.
func (u *Upstream) Devices() []Device {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.devs)
}

// Preferred asks nri-gpu; while it does not answer, it takes mustInclude
// and then the first of available, as kubelet would without a preference.
func (u *Upstream) Preferred(available, mustInclude []string, size int) []string {
	u.mu.Lock()
	client := u.client
	u.mu.Unlock()
	if client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), preferWait)
		defer cancel()
		resp, err := client.GetPreferredAllocation(ctx, &api.PreferredAllocationRequest{ContainerRequests: []*api.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
		}}})
		if err == nil && len(resp.GetContainerResponses()) == 1 {
			return resp.GetContainerResponses()[0].GetDeviceIDs()
		}
	}
	return kubeletOrder(available, mustInclude, size)
}

// Allot asks nri-gpu's device plugin to agree (its Allocate, which holds
// the devices as kubelet's in the pool, or refuses one another door took
// since it was listed healthy), and refuses what it denies. While nri-gpu
// does not answer, or cannot tell yet (restoring), it agrees: the
// container's creation is judged by nri-gpu's NRI side in any case, and
// kubelet keeps serving pods while nri-gpu is away.
func (u *Upstream) Allot(ctx context.Context, ids []string) error {
	u.mu.Lock()
	client := u.client
	u.mu.Unlock()
	if client == nil {
		return nil
	}
	req := &api.AllocateRequest{}
	for _, id := range ids {
		req.ContainerRequests = append(req.ContainerRequests, &api.ContainerAllocateRequest{DevicesIds: []string{id}})
	}
	ctx, cancel := context.WithTimeout(ctx, allotWait)
	defer cancel()
	_, err := client.Allocate(ctx, req)
	if s, ok := status.FromError(err); ok && s.Code() == codes.FailedPrecondition {
		return fmt.Errorf("%w: %s", errDeniedUpstream, s.Message())
	}
	if err != nil {
		u.log.Warnf("nri-gpu's device plugin did not agree to kubelet's allocation of %s (%v): the container's creation is judged as it comes", strings.Join(ids, ", "), err)
	}
	return nil
}

// kubeletOrder is the choice of size devices when nri-gpu cannot be
// asked: mustInclude, then the first of available (kubelet's own order).
func kubeletOrder(available, mustInclude []string, size int) []string {
	out := slices.Clone(mustInclude)
	for _, id := range available {
		if len(out) >= size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func fromAPI(devs []*api.Device) []Device {
	out := make([]Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, Device{ID: d.GetID(), Healthy: d.GetHealth() == api.Healthy})
	}
	return out
}
