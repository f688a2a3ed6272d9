package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// fakePool is a Pool a test sets, recording what it was asked and the
// deadline each call saw.
type fakePool struct {
	mu        sync.Mutex
	devices   []Device
	prepared  []policy.Claim
	refuse    error
	calls     []string
	deadlines []time.Time
	// block, when set, holds every call until it is closed.
	block chan struct{}
	// inUse, when set, is Release's error.
	inUse error
}

func (f *fakePool) called(ctx context.Context, what string) {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, _ := ctx.Deadline()
	f.calls, f.deadlines = append(f.calls, what), append(f.deadlines, d)
}

func (f *fakePool) Devices(ctx context.Context) ([]Device, error) {
	f.called(ctx, "devices")
	return f.devices, f.refuse
}

func (f *fakePool) Prepare(ctx context.Context, c policy.Claim, devs []Allocated) error {
	f.called(ctx, fmt.Sprintf("prepare %s %v", c.UID, devs))
	return f.refuse
}

func (f *fakePool) Unprepare(ctx context.Context, uid string) error {
	f.called(ctx, "unprepare "+uid)
	return f.refuse
}

func (f *fakePool) Release(ctx context.Context, uid string) error {
	f.called(ctx, "release "+uid)
	if f.inUse != nil {
		return f.inUse
	}
	return f.refuse
}

func (f *fakePool) Prepared(ctx context.Context) ([]policy.Claim, error) {
	f.called(ctx, "prepared")
	return f.prepared, f.refuse
}

// pair returns the two ends of a new socket pair, as the link's.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	conn, end, err := socketpair()
	if err != nil {
		t.Fatal(err)
	}
	other, err := net.FileConn(end)
	end.Close()
	if err != nil {
		t.Fatal(err)
	}
	return conn, other
}

// linked serves pool on one end of a new socket pair and returns its
// client on the other.
func linked(t *testing.T, pool Pool) (*PoolClient, net.Conn) {
	t.Helper()
	conn, client := pair(t)
	served := make(chan struct{})
	go func() { ServePool(conn, pool); close(served) }()
	c := NewPoolClient(client)
	t.Cleanup(func() {
		c.Close()
		conn.Close()
		<-served
	})
	return c, conn
}

// TestPoolOverTheLink: what the driver asks nri-gpu's pool crosses whole
// (every field of a device's facts, a claim and its allocated devices),
// a refusal comes back as the pool's words, and the caller's deadline
// bounds the pool's work too.
func TestPoolOverTheLink(t *testing.T) {
	info := Info{Kind: "nvidia.com/gpu", Name: "0:1", Type: TypeMIG, Index: 0, Minor: 0, UUID: "MIG-1", ParentUUID: "GPU-0",
		Profile: "1g.10gb", ProductName: "NVIDIA H200", Brand: "Nvidia", Architecture: "Hopper", DriverVersion: "570.86.15",
		CUDAComputeCapability: "9.0", PCIBusID: "0000:3b:00.0", MemoryBytes: 141 << 30,
		Offer: &policy.Capacity{Shares: 3, Memory: 100 << 30, Default: 20 << 30, Minimum: 1 << 30, Maximum: 80 << 30, Step: 1 << 30}}
	claim := policy.Claim{UID: "uid-1", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}, {Namespace: "tenant", Name: "b"}}}
	pool := &fakePool{devices: []Device{{CDI: "nvidia.com/gpu=0:1", Info: info}}, prepared: []policy.Claim{claim}}
	c, _ := linked(t, pool)
	ctx := context.Background()

	devs, err := c.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pool.devices, devs); diff != "" {
		t.Errorf("devices over the link (-pool +driver):\n%s", diff)
	}
	got, err := c.Prepared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pool.prepared, got); diff != "" {
		t.Errorf("prepared claims over the link (-pool +driver):\n%s", diff)
	}
	allocated := []Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpus", "extra"}, Use: policy.Use{Shares: 2, Memory: 1 << 30}, MemoryAsked: true,
		GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 40, PinnedMemory: 1 << 29}}}
	if err := c.Prepare(ctx, claim, allocated); err != nil {
		t.Fatal(err)
	}
	if err := c.Unprepare(ctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"devices", "prepared", "prepare uid-1 [{nvidia.com/gpu=0 [gpus extra] 2 shares and 1Gi of memory true {mps 40 536870912}}]", "unprepare uid-1", "release uid-1"}
	if !slices.Equal(pool.calls, want) {
		t.Errorf("the pool was asked %q, want %q", pool.calls, want)
	}
	for i, d := range pool.deadlines {
		if !d.IsZero() {
			t.Errorf("%s: deadline %v, the caller had none", pool.calls[i], d)
		}
	}

	// The caller's deadline reaches the pool.
	deadline := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	pool.calls, pool.deadlines = nil, nil
	if err := c.Unprepare(dctx, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if len(pool.deadlines) != 1 || !pool.deadlines[0].Equal(deadline) {
		t.Errorf("the pool saw deadlines %v, want %v", pool.deadlines, deadline)
	}

	// A refusal is the pool's words, not a broken link.
	pool.refuse = errors.New("claim tenant/c: nvidia.com/gpu=0 is held by pod tenant/x")
	for name, call := range map[string]func() error{
		"prepare":   func() error { return c.Prepare(ctx, claim, allocated) },
		"unprepare": func() error { return c.Unprepare(ctx, "uid-1") },
		"release":   func() error { return c.Release(ctx, "uid-1") },
		"devices":   func() error { _, err := c.Devices(ctx); return err },
		"prepared":  func() error { _, err := c.Prepared(ctx); return err },
	} {
		err := call()
		if err == nil || err.Error() != pool.refuse.Error() || errors.Is(err, ErrLink) || errors.Is(err, policy.ErrClaimInUse) {
			t.Errorf("%s refused: got %v, want %q", name, err, pool.refuse)
		}
	}

	// A claim kept in use says so, as policy.ErrClaimInUse.
	pool.inUse = fmt.Errorf("claim tenant/c %w pod tenant/a", policy.ErrClaimInUse)
	if err := c.Release(ctx, "uid-1"); !errors.Is(err, policy.ErrClaimInUse) || err.Error() != pool.inUse.Error() {
		t.Errorf("release of a claim in use: got %v, want %q wrapping ErrClaimInUse", err, pool.inUse)
	}
}

// TestNothingOverTheLink: a pool with nothing to offer and nothing
// prepared (a node's first start) answers so, and the link stays up:
// JSON-RPC takes a null result for a broken answer, which once closed
// the link for good at every driver's first start.
func TestNothingOverTheLink(t *testing.T) {
	pool := &fakePool{}
	c, _ := linked(t, pool)
	ctx := context.Background()
	for range 2 {
		if devs, err := c.Devices(ctx); err != nil || len(devs) != 0 {
			t.Errorf("no devices: %v, %v", devs, err)
		}
		if claims, err := c.Prepared(ctx); err != nil || len(claims) != 0 {
			t.Errorf("no claims: %v, %v", claims, err)
		}
		if err := c.Unprepare(ctx, "uid-1"); err != nil {
			t.Errorf("unprepare: %v", err)
		}
	}
	select {
	case <-c.Down():
		t.Error("the link is down after empty answers")
	default:
	}
}

// TestLinkDown: a call the other end does not answer ends when the
// caller's context does, and a call over a closed link at once, both
// with ErrLink: nothing waits longer than its caller lets it.
func TestLinkDown(t *testing.T) {
	pool := &fakePool{block: make(chan struct{})}
	c, conn := linked(t, pool)
	defer close(pool.block)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Devices(ctx)
	if !errors.Is(err, ErrLink) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call the pool does not answer: %v, want ErrLink and the deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the call took %v past its 100ms deadline", took)
	}
	select {
	case <-c.Down():
		t.Error("the link is down after a call ran out of time: the pool may still answer")
	default:
	}
	conn.Close()
	err = c.Unprepare(context.Background(), "uid-1")
	if !errors.Is(err, ErrLink) {
		t.Errorf("a call over a closed link: %v, want ErrLink", err)
	}
	select {
	case <-c.Down():
	default:
		t.Error("the link is not down after the pool's end closed")
	}
}

// finderFunc is a Finder of a function.
type finderFunc func(context.Context, PodRef, string) ([]ClaimUse, error)

func (f finderFunc) Uses(ctx context.Context, pod PodRef, ctr string) ([]ClaimUse, error) {
	return f(ctx, pod, ctr)
}

// TestDriverOverTheLink: nri-gpu's question (which claims a container
// uses) crosses whole with its deadline; a claim not reserved for the
// pod is still ErrNotReserved on nri-gpu's side (nri-gpu refuses the
// container for it, and only for it); Notify reaches the driver; the
// driver's service ends when nri-gpu's end closes.
func TestDriverOverTheLink(t *testing.T) {
	conn, driverEnd := pair(t)
	uses := []ClaimUse{{UID: "uid-1", Namespace: "tenant", Name: "c", Requests: []string{"gpus"}}}
	var (
		seen     []string
		deadline time.Time
	)
	f := finderFunc(func(ctx context.Context, pod PodRef, ctr string) ([]ClaimUse, error) {
		seen = append(seen, pod.Namespace+"/"+pod.Name+"/"+pod.UID+"/"+ctr)
		deadline, _ = ctx.Deadline()
		switch pod.Name {
		case "unreserved":
			return nil, fmt.Errorf("claim tenant/c: %w tenant/unreserved", ErrNotReserved)
		case "down":
			return nil, errors.New("the API server is down")
		}
		return uses, nil
	})
	notified := make(chan struct{}, 1)
	served := make(chan struct{})
	var why atomic.Pointer[string]
	registered := func() error {
		if w := why.Load(); w != nil {
			return errors.New(*w)
		}
		return nil
	}
	go func() { ServeDriver(driverEnd, f, func() { notified <- struct{}{} }, registered); close(served) }()
	d := driverClient{newClient(conn)}
	if err := d.registered(context.Background()); err != nil {
		t.Errorf("registered: %v", err)
	}
	refused := "kubelet refused its registration: no"
	why.Store(&refused)
	if err := d.registered(context.Background()); !errors.Is(err, ErrNotRegistered) || !strings.Contains(err.Error(), refused) {
		t.Errorf("not registered: %v, want ErrNotRegistered in the driver's words", err)
	}

	want := time.Now().Add(10 * time.Second).Truncate(time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	got, err := d.uses(ctx, PodRef{Namespace: "tenant", Name: "a", UID: "pod-uid"}, "gpu")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(uses, got); diff != "" {
		t.Errorf("uses over the link (-driver +nri-gpu):\n%s", diff)
	}
	if !slices.Equal(seen, []string{"tenant/a/pod-uid/gpu"}) || !deadline.Equal(want) {
		t.Errorf("the driver was asked %q with deadline %v, want tenant/a/pod-uid/gpu and %v", seen, deadline, want)
	}
	_, err = d.uses(ctx, PodRef{Namespace: "tenant", Name: "unreserved"}, "gpu")
	if !errors.Is(err, ErrNotReserved) || err.Error() != "claim tenant/c: not reserved for the pod tenant/unreserved" {
		t.Errorf("a claim not reserved: %v, want ErrNotReserved in the driver's words", err)
	}
	_, err = d.uses(ctx, PodRef{Namespace: "tenant", Name: "down"}, "gpu")
	if err == nil || errors.Is(err, ErrNotReserved) || errors.Is(err, ErrLink) || err.Error() != "the API server is down" {
		t.Errorf("the API server down: %v, want the driver's words, neither ErrNotReserved nor ErrLink", err)
	}
	d.notify()
	select {
	case <-notified:
	case <-time.After(10 * time.Second):
		t.Error("Notify did not reach the driver")
	}
	d.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Error("the driver's service still runs with nri-gpu's end closed")
	}
}
