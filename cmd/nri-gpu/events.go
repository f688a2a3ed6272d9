package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// Events waiting to be posted at most, and how long one post may take.
const (
	eventQueue = 256
	eventPost  = 30 * time.Second
)

// podEvents returns tell, which queues an event for the pod's events on
// the API server (plugin.WithEvents), and run, which posts them until
// ctx is done: those told meanwhile together, by one nri-gpu-dra event
// process (Kubernetes' client is paid for only there, and only then).
// An event told while 256 wait is dropped, said in the log.
func podEvents(cfg config.Events, node string, stderr io.Writer, log logrus.FieldLogger) (tell func(link.Event), run func(context.Context), err error) {
	path, err := driverPath()
	if err != nil {
		return nil, nil, fmt.Errorf("events: %w", err)
	}
	args := []string{"--node", nodeName(node)}
	if cfg.Kubeconfig != "" {
		args = append(args, "--kubeconfig", cfg.Kubeconfig)
	}
	queue := make(chan link.Event, eventQueue)
	tell = func(e link.Event) {
		select {
		case queue <- e:
		default:
			log.Warnf("dropped an event of pod %s/%s (%s): %d wait to be posted", e.Namespace, e.Pod, e.Reason, eventQueue)
		}
	}
	run = func(ctx context.Context) {
		for {
			var batch []link.Event
			select {
			case <-ctx.Done():
				return
			case e := <-queue:
				batch = append(batch, e)
			}
			for more := true; more; {
				select {
				case e := <-queue:
					batch = append(batch, e)
				default:
					more = false
				}
			}
			pctx, cancel := context.WithTimeout(ctx, eventPost)
			if err := link.PostEvents(pctx, path, args, batch, stderr); err != nil {
				log.Warnf("posting %d events of pods: %v", len(batch), err)
			}
			cancel()
		}
	}
	return tell, run, nil
}
