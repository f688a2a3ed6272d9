package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// PodForwarder gives the pods of a node that have a label a port on
// their own loopback that reaches an address on the machine's loopback,
// as kube-proxy would give them the kubernetes Service: the cluster runs
// no kube-proxy (it would need iptables), and every server the tests
// start listens on loopback only. It follows the pods as they come and
// go.
type PodForwarder struct {
	node   *Node
	label  string
	port   int
	target string

	mu        sync.Mutex
	listeners map[string]net.Listener // by pod sandbox ID
	// slow is how long each answer from the target is held before the
	// pod gets it (Slow); Forever holds it until Slow changes it.
	slow time.Duration
	// slowed is closed when slow changes.
	slowed chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// Forever, given to Slow, holds every answer until Slow is called again:
// a target that never answers.
const Forever time.Duration = -1

// Slow holds what the target sends on every connection, open or new,
// for d before the pods get it (0: at once; Forever: until Slow is
// called again, when what was held goes on), as a slow or hung API
// server would: the pods' requests still reach it.
func (f *PodForwarder) Slow(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slow = d
	close(f.slowed)
	f.slowed = make(chan struct{})
}

// hold waits as Slow says before what the target sent goes on.
func (f *PodForwarder) hold() {
	for {
		f.mu.Lock()
		d, changed := f.slow, f.slowed
		f.mu.Unlock()
		switch {
		case d == 0:
			return
		case d > 0:
			time.Sleep(d)
			return
		}
		select {
		case <-changed:
		case <-f.stop:
			return
		}
	}
}

// ForwardToPods starts forwarding 127.0.0.1:port in each ready pod
// sandbox of the node labelled label (key=value) to target.
func (n *Node) ForwardToPods(label string, port int, target string) *PodForwarder {
	f := &PodForwarder{node: n, label: label, port: port, target: target,
		listeners: map[string]net.Listener{}, slowed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go f.run()
	return f
}

// Stop stops forwarding and closes every listener.
func (f *PodForwarder) Stop() {
	close(f.stop)
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, l := range f.listeners {
		l.Close()
		delete(f.listeners, id)
	}
}

func (f *PodForwarder) run() {
	defer close(f.done)
	for {
		f.sync()
		select {
		case <-f.stop:
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// sync listens in each ready sandbox not yet served, and stops serving
// those gone.
func (f *PodForwarder) sync() {
	out, err := f.node.Ctd.Crictl("pods", "--label", f.label, "--state", "ready", "-q")
	if err != nil {
		return
	}
	ready := map[string]bool{}
	for _, id := range strings.Fields(out) {
		ready[id] = true
		f.mu.Lock()
		_, served := f.listeners[id]
		f.mu.Unlock()
		if served {
			continue
		}
		ns, err := f.sandboxNetNS(id)
		if err != nil {
			continue
		}
		l, err := listenIn(ns, fmt.Sprintf("127.0.0.1:%d", f.port))
		if err != nil {
			continue
		}
		f.mu.Lock()
		f.listeners[id] = l
		f.mu.Unlock()
		go f.serve(l)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, l := range f.listeners {
		if !ready[id] {
			l.Close()
			delete(f.listeners, id)
		}
	}
}

// sandboxNetNS returns the path of a sandbox's network namespace, as
// the machine's mount namespace reaches it: its process's (the pause
// container's, containerd's or CRI-O's), or, where the runtime runs none
// (CRI-O drops it for a pod of the host's PID namespace, as nri-gpu's
// is), the namespace file its spec names, seen through the node's root.
func (f *PodForwarder) sandboxNetNS(id string) (string, error) {
	out, err := f.node.Ctd.Crictl("inspectp", id)
	if err != nil {
		return "", err
	}
	var st struct {
		Info struct {
			Pid         int `json:"pid"`
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string } `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return "", err
	}
	if st.Info.Pid != 0 {
		return fmt.Sprintf("/proc/%d/ns/net", st.Info.Pid), nil
	}
	for _, ns := range st.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return fmt.Sprintf("/proc/%d/root%s", f.node.holder.Pid(), ns.Path), nil
		}
	}
	return "", fmt.Errorf("sandbox %s: neither a process nor a network namespace", id)
}

// serve copies each connection accepted in the pod to a connection to
// the target, made in the machine's network namespace.
func (f *PodForwarder) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			t, err := net.DialTimeout("tcp", f.target, 5*time.Second)
			if err != nil {
				return
			}
			defer t.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(t, c); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, heldReader{t, f.hold}); done <- struct{}{} }()
			<-done
		}()
	}
}

// heldReader is a reader whose each read is held (hold) before it is
// handed on.
type heldReader struct {
	r    io.Reader
	hold func()
}

func (h heldReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if n > 0 {
		h.hold()
	}
	return n, err
}

// listenIn listens on addr in the network namespace at nsPath: the
// socket stays in that namespace, while this process's other sockets are
// in its own. The thread that switches namespaces is given back only
// once it is in its own namespace again (else it ends with the
// goroutine).
func listenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer own.Close()
		ns, err := os.Open(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", addr)
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread ends with this goroutine.
			if l != nil {
				l.Close()
			}
			ch <- result{err: err}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}
