package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The file descriptors on which the driver inherits its ends of the link.
const (
	poolFD   = 3
	driverFD = 4
)

// ExitConfig is the exit status of a driver whose configuration cannot
// work (no node name, no credentials for the API server).
const ExitConfig = 2

// ErrDriverConfig is wrapped by Run's error when the driver quit with
// ExitConfig: starting it again would not help.
var ErrDriverConfig = errors.New("the DRA driver's configuration cannot work")

// ErrNotRunning is wrapped by the error of asking a driver that is not
// running (not yet started, or started again after it quit).
var ErrNotRunning = errors.New("the DRA driver is not running")

// stopWait is how long a driver told to stop has before it is killed.
const stopWait = 10 * time.Second

var _ Finder = (*Process)(nil)

// Process is nri-gpu's DRA driver as nri-gpu runs it: a process of its
// own, served the pool over the link, asked which claims a container
// uses, and told when what is held changes.
type Process struct {
	path   string
	args   []string
	stderr io.Writer
	pool   Pool

	mu     sync.Mutex
	driver *driverClient // nil while no driver runs
}

// NewProcess returns the driver that runs the program at path with args,
// its standard output and error to stderr, serving it pool.
func NewProcess(path string, args []string, stderr io.Writer, pool Pool) *Process {
	return &Process{path: path, args: args, stderr: stderr, pool: pool}
}

// Run starts the driver and serves it the pool until it quits, which is
// an error, or ctx is done: the driver is then told to stop (SIGTERM) and
// killed if it has not within 10 s. The error wraps ErrDriverConfig when the
// driver's configuration cannot work.
func (p *Process) Run(ctx context.Context) error {
	poolConn, poolEnd, err := socketpair()
	if err != nil {
		return err
	}
	defer poolConn.Close()
	driverConn, driverEnd, err := socketpair()
	if err != nil {
		poolEnd.Close()
		return err
	}
	defer driverConn.Close()
	cmd := exec.CommandContext(ctx, p.path, p.args...)
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	cmd.ExtraFiles = []*os.File{poolEnd, driverEnd} // fds 3 and 4
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopWait
	err = cmd.Start()
	poolEnd.Close()
	driverEnd.Close()
	if err != nil {
		return fmt.Errorf("DRA driver: %w", err)
	}
	go ServePool(poolConn, p.pool)
	client := &driverClient{newClient(driverConn)}
	p.set(client)
	exited := make(chan struct{})
	go func() {
		// A link that broke is not mended: the driver is started anew.
		select {
		case <-client.Down():
			_ = cmd.Process.Kill()
		case <-exited:
		}
	}()
	err = cmd.Wait()
	close(exited)
	p.set(nil)
	client.Close()
	if ctx.Err() != nil {
		return nil
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == ExitConfig {
		return fmt.Errorf("%w: %s exited with status %d", ErrDriverConfig, p.path, ExitConfig)
	}
	if err == nil {
		err = errors.New("exited")
	}
	return fmt.Errorf("DRA driver %s: %w", p.path, err)
}

func (p *Process) set(c *driverClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.driver = c
}

func (p *Process) running() *driverClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.driver
}

// Uses asks the driver which prepared claims the container uses.
func (p *Process) Uses(ctx context.Context, pod PodRef, container string) ([]ClaimUse, error) {
	d := p.running()
	if d == nil {
		return nil, ErrNotRunning
	}
	return d.uses(ctx, pod, container)
}

// Registered returns nil once kubelet has registered the running driver,
// and says why not otherwise: ErrNotRunning, ErrNotRegistered, or the
// link's error.
func (p *Process) Registered(ctx context.Context) error {
	d := p.running()
	if d == nil {
		return ErrNotRunning
	}
	return d.registered(ctx)
}

// Notify tells the driver that devices, their health or what is held may
// have changed; a driver not running learns it when it starts.
func (p *Process) Notify() {
	if d := p.running(); d != nil {
		d.notify()
	}
}

// socketpair returns the two ends of a new connection: one for this
// process, one for a child to inherit.
func socketpair() (net.Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("link: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "link")
	defer ours.Close()
	conn, err := net.FileConn(ours)
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("link: %w", err)
	}
	return conn, os.NewFile(uintptr(fds[1]), "link"), nil
}

// Inherited returns the driver's ends of the link, which nri-gpu passes
// it: the pool's, to ask with NewPoolClient, and its own, to serve with
// ServeDriver.
func Inherited() (pool, driver net.Conn, err error) {
	if pool, err = inherit(poolFD); err != nil {
		return nil, nil, err
	}
	if driver, err = inherit(driverFD); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, driver, nil
}

func inherit(fd uintptr) (net.Conn, error) {
	f := os.NewFile(fd, "link") // nil only for an invalid number, which 3 and 4 are not
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("file descriptor %d is not the link to nri-gpu (nri-gpu-dra is started by nri-gpu): %w", fd, err)
	}
	return conn, nil
}
