package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/rpc"
	"net/rpc/jsonrpc"
	"sync"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// The services' names on the link.
const (
	poolName   = "Pool"
	driverName = "Driver"
)

// Bounded is embedded in the arguments of a call that can wait: the
// caller's deadline, which the serving end keeps too.
type Bounded struct {
	// Deadline is the caller's; zero for none.
	Deadline time.Time `json:",omitzero"`
}

func (b Bounded) context() (context.Context, context.CancelFunc) {
	if b.Deadline.IsZero() {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), b.Deadline)
}

func bounded(ctx context.Context) Bounded {
	d, _ := ctx.Deadline()
	return Bounded{Deadline: d}
}

// PrepareArgs are Pool.Prepare's arguments.
type PrepareArgs struct {
	Bounded
	Claim   policy.Claim
	Devices []Allocated
}

// UnprepareArgs are Pool.Unprepare's arguments.
type UnprepareArgs struct {
	Bounded
	UID string
}

// ReleaseReply is Pool.Release's reply.
type ReleaseReply struct {
	// InUse is the error, when it wraps policy.ErrClaimInUse.
	InUse string `json:",omitempty"`
}

// UsesArgs are Driver.Uses's arguments.
type UsesArgs struct {
	Bounded
	Pod       PodRef
	Container string
}

// DevicesReply is Pool.Devices's reply. Every reply is an object: JSON-RPC
// takes a null result (a nil slice) for a broken answer and closes the
// link.
type DevicesReply struct{ Devices []Device }

// PreparedReply is Pool.Prepared's reply.
type PreparedReply struct{ Claims []policy.Claim }

// RegisteredReply is Driver.Registered's reply.
type RegisteredReply struct {
	// Why says why kubelet has not registered the driver; "" when it has.
	Why string `json:",omitempty"`
}

// UsesReply is Driver.Uses's reply.
type UsesReply struct {
	Uses []ClaimUse
	// NotReserved is the error, when it wraps ErrNotReserved.
	NotReserved string `json:",omitempty"`
}

// poolService serves a Pool on the link. Its methods are net/rpc's
// spelling of Pool's.
type poolService struct{ pool Pool }

// Devices calls Pool.Devices.
func (s *poolService) Devices(in Bounded, out *DevicesReply) (err error) {
	ctx, cancel := in.context()
	defer cancel()
	out.Devices, err = s.pool.Devices(ctx)
	return err
}

// Prepare calls Pool.Prepare.
func (s *poolService) Prepare(in PrepareArgs, _ *struct{}) error {
	ctx, cancel := in.context()
	defer cancel()
	return s.pool.Prepare(ctx, in.Claim, in.Devices)
}

// Unprepare calls Pool.Unprepare.
func (s *poolService) Unprepare(in UnprepareArgs, _ *struct{}) error {
	ctx, cancel := in.context()
	defer cancel()
	return s.pool.Unprepare(ctx, in.UID)
}

// Release calls Pool.Release.
func (s *poolService) Release(in UnprepareArgs, out *ReleaseReply) error {
	ctx, cancel := in.context()
	defer cancel()
	err := s.pool.Release(ctx, in.UID)
	if errors.Is(err, policy.ErrClaimInUse) {
		out.InUse = err.Error()
		return nil
	}
	return err
}

// Prepared calls Pool.Prepared.
func (s *poolService) Prepared(in Bounded, out *PreparedReply) (err error) {
	ctx, cancel := in.context()
	defer cancel()
	out.Claims, err = s.pool.Prepared(ctx)
	return err
}

// driverService serves the driver's Finder, Notify and registration on
// the link.
type driverService struct {
	finder     Finder
	notify     func()
	registered func() error
}

// Uses calls Finder.Uses.
func (s *driverService) Uses(in UsesArgs, out *UsesReply) error {
	ctx, cancel := in.context()
	defer cancel()
	uses, err := s.finder.Uses(ctx, in.Pod, in.Container)
	if errors.Is(err, ErrNotReserved) {
		out.NotReserved = err.Error()
		return nil
	}
	out.Uses = uses
	return err
}

// Notify calls the driver's notify.
func (s *driverService) Notify(struct{}, *struct{}) error {
	s.notify()
	return nil
}

// Registered calls the driver's registered.
func (s *driverService) Registered(_ Bounded, out *RegisteredReply) error {
	if err := s.registered(); err != nil {
		out.Why = err.Error()
	}
	return nil
}

// serve serves rcvr as name on conn until conn closes.
func serve(conn io.ReadWriteCloser, name string, rcvr any) {
	srv := rpc.NewServer()
	if err := srv.RegisterName(name, rcvr); err != nil {
		panic(err) // the services' methods are fixed
	}
	srv.ServeCodec(jsonrpc.NewServerCodec(conn))
}

// ServePool serves pool on conn (nri-gpu's end of the link) until conn
// closes.
func ServePool(conn io.ReadWriteCloser, pool Pool) {
	serve(conn, poolName, &poolService{pool: pool})
}

// ServeDriver serves f, notify and registered (whether kubelet has
// registered the driver: nil when it has) on conn (the driver's end of
// the link) until conn closes: when nri-gpu stops or dies.
func ServeDriver(conn io.ReadWriteCloser, f Finder, notify func(), registered func() error) {
	serve(conn, driverName, &driverService{finder: f, notify: notify, registered: registered})
}

// ErrNotRegistered is wrapped by Process.Registered's error when the
// driver runs but kubelet has not registered it.
var ErrNotRegistered = errors.New("kubelet has not registered the DRA driver")

// ErrLink is wrapped by the error of a call the other end did not
// answer: the link is down (the other process quit) or the caller's
// context ended first.
var ErrLink = errors.New("no answer over the link between nri-gpu and its DRA driver")

// client is a client of the other end of the link that says when the
// link broke: net/rpc then fails every call for good.
type client struct {
	c    *rpc.Client
	once sync.Once
	down chan struct{}
}

func newClient(conn io.ReadWriteCloser) *client {
	return &client{c: jsonrpc.NewClient(conn), down: make(chan struct{})}
}

// Down is closed once a call found the link broken (the other end quit,
// or its answer could not be read) or the client was closed.
func (c *client) Down() <-chan struct{} { return c.down }

func (c *client) broken() { c.once.Do(func() { close(c.down) }) }

// Close closes the link.
func (c *client) Close() error {
	c.broken()
	return c.c.Close()
}

// call calls method, waiting no longer than ctx lets it.
func (c *client) call(ctx context.Context, method string, args, reply any) error {
	done := c.c.Go(method, args, reply, make(chan *rpc.Call, 1)).Done
	select {
	case r := <-done:
		var remote rpc.ServerError
		if r.Error == nil || errors.As(r.Error, &remote) {
			return r.Error
		}
		c.broken()
		return fmt.Errorf("%s: %w: %w", method, ErrLink, r.Error)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w: %w", method, ErrLink, context.Cause(ctx))
	}
}

var _ Pool = (*PoolClient)(nil)

// PoolClient is nri-gpu's pool as its DRA driver asks it, over the link.
// Its Down is closed once the link broke: the driver then quits, and
// nri-gpu starts it again.
type PoolClient struct{ *client }

// NewPoolClient returns the pool served on conn.
func NewPoolClient(conn io.ReadWriteCloser) *PoolClient {
	return &PoolClient{newClient(conn)}
}

// Devices returns the pool's devices to offer.
func (p *PoolClient) Devices(ctx context.Context) ([]Device, error) {
	var out DevicesReply
	err := p.call(ctx, poolName+".Devices", bounded(ctx), &out)
	return out.Devices, err
}

// Prepare asks the pool to hold a claim's devices.
func (p *PoolClient) Prepare(ctx context.Context, claim policy.Claim, devices []Allocated) error {
	return p.call(ctx, poolName+".Prepare", PrepareArgs{Bounded: bounded(ctx), Claim: claim, Devices: devices}, &struct{}{})
}

// Unprepare asks the pool to release what a claim holds.
func (p *PoolClient) Unprepare(ctx context.Context, uid string) error {
	return p.call(ctx, poolName+".Unprepare", UnprepareArgs{Bounded: bounded(ctx), UID: uid}, &struct{}{})
}

// Release asks the pool to release a claim the API server no longer has
// here, unless it is still in use.
func (p *PoolClient) Release(ctx context.Context, uid string) error {
	var out ReleaseReply
	if err := p.call(ctx, poolName+".Release", UnprepareArgs{Bounded: bounded(ctx), UID: uid}, &out); err != nil {
		return err
	}
	if out.InUse != "" {
		return inUse(out.InUse)
	}
	return nil
}

// Prepared returns the claims the pool holds.
func (p *PoolClient) Prepared(ctx context.Context) ([]policy.Claim, error) {
	var out PreparedReply
	err := p.call(ctx, poolName+".Prepared", bounded(ctx), &out)
	return out.Claims, err
}

// notReserved is an error from the other end that wraps ErrNotReserved.
type notReserved string

func (e notReserved) Error() string { return string(e) }
func (e notReserved) Unwrap() error { return ErrNotReserved }

// inUse is an error from the other end that wraps policy.ErrClaimInUse.
type inUse string

func (e inUse) Error() string { return string(e) }
func (e inUse) Unwrap() error { return policy.ErrClaimInUse }

// driverClient is the DRA driver as nri-gpu asks it, over the link.
type driverClient struct{ *client }

func (d driverClient) uses(ctx context.Context, pod PodRef, container string) ([]ClaimUse, error) {
	var out UsesReply
	if err := d.call(ctx, driverName+".Uses", UsesArgs{Bounded: bounded(ctx), Pod: pod, Container: container}, &out); err != nil {
		return nil, err
	}
	if out.NotReserved != "" {
		return nil, notReserved(out.NotReserved)
	}
	return out.Uses, nil
}

// registered asks the driver whether kubelet has registered it.
func (d driverClient) registered(ctx context.Context) error {
	var out RegisteredReply
	if err := d.call(ctx, driverName+".Registered", bounded(ctx), &out); err != nil {
		return err
	}
	if out.Why != "" {
		return fmt.Errorf("%w: %s", ErrNotRegistered, out.Why)
	}
	return nil
}

// notify tells the driver, without waiting for its answer.
func (d driverClient) notify() {
	d.c.Go(driverName+".Notify", struct{}{}, &struct{}{}, make(chan *rpc.Call, 1))
}
