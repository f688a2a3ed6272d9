package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// nodeNameEnv names the node when dra.nodeName does not (the chart sets
// it from the pod's spec.nodeName).
const nodeNameEnv = "NODE_NAME"

// startDRA starts the DRA driver of cfg beside the NRI side, over p's
// specs and pool, and has p inject the claims its containers use. It
// returns an error for a configuration that cannot work (no node name, no
// credentials); registering with kubelet is retried until ctx is done.
func startDRA(ctx context.Context, cfg config.DRA, p *plugin.Plugin, log logrus.FieldLogger) error {
	node := cfg.NodeName
	if node == "" {
		node = os.Getenv(nodeNameEnv)
	}
	if node == "" {
		return fmt.Errorf("dra: no node name: set dra.nodeName or the %s environment variable", nodeNameEnv)
	}
	client, err := kubeClient(cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("dra: %w", err)
	}
	d := dra.New(cfg, node, p.DRAView(cfg), log)
	p.UseClaims(dra.NewFinder(ctx, client, cfg.DriverName, node))
	p.OnHeldChange(d.Notify)
	go func() {
		for {
			err := d.Run(ctx, client)
			if ctx.Err() != nil {
				return
			}
			log.Warnf("%v; trying again", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}()
	return nil
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
