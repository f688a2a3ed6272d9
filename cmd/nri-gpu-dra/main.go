// Command nri-gpu-dra is nri-gpu's Dynamic Resource Allocation driver. It
// is not run by hand: nri-gpu starts it when start.dra.enabled is set,
// with its ends of the link to nri-gpu as file descriptors 3 and 4, and
// it stops when nri-gpu does. Through Kubernetes' kubelet-plugin helper
// it publishes the node's devices as ResourceSlices and prepares the
// claims allocated on them in nri-gpu's pool; it tells nri-gpu which
// claims a container uses. It runs apart so that a node without DRA does
// not pay for Kubernetes' client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nri-gpu/nri-gpu/internal/logflags"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// registerRetry is how long the driver waits to register with kubelet
// again.
const registerRetry = 5 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
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
	client, err := kubeClient(opts.DRA.Kubeconfig)
	if err != nil {
		log.Errorf("dra: %v", err)
		return link.ExitConfig
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool := link.NewPoolClient(poolConn)
	defer pool.Close()
	d := dra.New(opts.DRA, opts.Node, pool, log)
	finder := dra.NewFinder(ctx, client, opts.DRA.DriverName, opts.Node)
	go func() {
		link.ServeDriver(driverConn, finder, d.Notify)
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

// kubeClient returns a client of the API server: from the kubeconfig
// file, or else the pod's service account.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
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
	return kubernetes.NewForConfig(rc)
}
