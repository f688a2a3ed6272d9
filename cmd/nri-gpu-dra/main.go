// Command nri-gpu-dra is nri-gpu's Dynamic Resource Allocation driver,
// and the poster of its events (nri-gpu-dra event). It is not run by
// hand: nri-gpu starts it when start.dra.enabled is set,
// with its ends of the link to nri-gpu as file descriptors 3 and 4, and
// it stops when nri-gpu does. Through Kubernetes' kubelet-plugin helper
// it publishes the node's devices as ResourceSlices and prepares the
// claims allocated on them in nri-gpu's pool; it tells nri-gpu which
// claims a container uses. It runs apart so that a node without DRA does
// not pay for Kubernetes' client; for the same reason nri-gpu, when
// start.events.enabled, posts the events it tells of pods through it, a
// short-lived process each time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nri-gpu/nri-gpu/internal/logflags"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// registerRetry is how long the driver waits to register with kubelet
// again.
const registerRetry = 5 * time.Second

// eventTimeout bounds the event command.
const eventTimeout = 30 * time.Second

func main() {
	if len(os.Args) > 1 && os.Args[1] == link.EventCommand {
		os.Exit(postEvents(os.Args[2:], os.Stdin, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stderr))
}

// postEvents is the event command (link.PostEvents): it posts the
// events read on stdin as their pods', with the client of --kubeconfig
// (or the pod's service account), reported by --node, and exits 0 once
// all are posted.
func postEvents(args []string, stdin io.Reader, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu-dra "+link.EventCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig file to reach the API server with (empty: the pod's service account)")
	node := fs.String("node", "", "the node the events are reported on")
	if err := fs.Parse(args); err != nil {
		return link.ExitConfig
	}
	events, err := link.ReadEvents(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu-dra: events: %v\n", err)
		return link.ExitConfig
	}
	client, err := kubeClient(*kubeconfig, nil)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu-dra: events: %v\n", err)
		return link.ExitConfig
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	if err := dra.PostEvents(ctx, client, *node, events); err != nil {
		fmt.Fprintf(stderr, "nri-gpu-dra: events: %v\n", err)
		return 1
	}
	return 0
}

func run(args []string, stderr io.Writer) int {
	opts, err := link.ParseOptions(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu-dra: %v\n", err)
		return link.ExitConfig
	}
	log := logrus.StandardLogger()
	log.SetOutput(stderr)
	if err := logflags.Apply(log, opts.LogLevel, opts.LogFormat); err != nil {
		fmt.Fprintf(stderr, "nri-gpu-dra: %v\n", err)
		return link.ExitConfig
	}
	poolConn, driverConn, err := link.Inherited()
	if err != nil {
		log.Errorf("nri-gpu-dra: %v", err)
		return link.ExitConfig
	}
	pool := link.NewPoolClient(poolConn)
	defer pool.Close()
	m, err := serveMetrics(opts.DRA.MetricsAddress, pool.Prepared, log)
	if err != nil {
		log.Errorf("dra: metrics: %v", err)
		return link.ExitConfig
	}
	client, err := kubeClient(opts.DRA.Kubeconfig, m.CountAPIErrors)
	if err != nil {
		log.Errorf("dra: %v", err)
		return link.ExitConfig
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := dra.New(opts.DRA, opts.Node, pool, log)
	d.Metrics = m
	d.RollingUpdate = types.UID(opts.RollingUpdate)
	finder := dra.NewFinder(ctx, client, opts.DRA.DriverName, opts.Node)
	go func() {
		link.ServeDriver(driverConn, finder, d.Notify, d.Registered)
		cancel() // nri-gpu stopped, or died
	}()
	go func() {
		<-pool.Down()
		cancel()
	}()
	for {
		err := d.Run(ctx, client)
		if ctx.Err() != nil {
			break
		}
		log.Warnf("%v; trying again", err)
		select {
		case <-ctx.Done():
		case <-time.After(registerRetry):
		}
	}
	select {
	case <-pool.Down():
		// nri-gpu starts the driver again, with a new link.
		log.Error("nri-gpu-dra: the link to nri-gpu broke")
		return 1
	default:
		return 0
	}
}

// preparedWait bounds how long a scrape waits for nri-gpu to say how
// many claims it holds prepared.
const preparedWait = time.Second

// serveMetrics serves the driver's metrics on addr, and returns them; nil
// (metrics off) where addr is empty. prepared tells the claims the pool
// holds prepared.
func serveMetrics(addr string, prepared func(context.Context) ([]policy.Claim, error), log logrus.FieldLogger) (*metrics.DRA, error) {
	if addr == "" {
		return nil, nil
	}
	m := metrics.NewDRA(func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), preparedWait)
		defer cancel()
		claims, err := prepared(ctx)
		if err != nil {
			return math.NaN() // not known now
		}
		return float64(len(claims))
	})
	at, errs, err := m.Serve(addr)
	if err != nil {
		return nil, err
	}
	log.Infof("DRA driver metrics at http://%s/metrics", at)
	go func() { log.Errorf("DRA driver metrics stopped: %v", <-errs) }()
	return m, nil
}

// kubeClient returns a client of the API server: from the kubeconfig
// file, or else the pod's service account.
func kubeClient(kubeconfig string, wrap func(http.RoundTripper) http.RoundTripper) (kubernetes.Interface, error) {
	var (
		rc  *rest.Config
		err error
	)
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			err = fmt.Errorf("%w: set dra.kubeconfig, or run nri-gpu in a pod with a service account token", err)
		}
	}
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "nri-gpu"
	rc.Wrap(wrap)
	return kubernetes.NewForConfig(rc)
}
