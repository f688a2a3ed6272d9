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
	eventsWaiting = 256
	eventPost     = 30 * time.Second
)

// eventQueue is a plugin.EventSink that queues an event for the pod's
// events on the API server: one told while 256 wait is dropped, said in
// the log.
type eventQueue struct {
	queue chan link.Event
	log   logrus.FieldLogger
}

// Post queues e, or drops it when the queue is full.
func (q eventQueue) Post(e link.Event) {
	select {
	case q.queue <- e:
	default:
		q.log.Warnf("dropped an event of pod %s/%s (%s): %d wait to be posted", e.Namespace, e.Pod, e.Reason, cap(q.queue))
	}
}

// podEvents returns the sink that queues events for the pods' events
// (plugin.WithEvents), and run, which posts them until ctx is done:
// those told meanwhile together, by one nri-gpu-dra event process
// (Kubernetes' client is paid for only there, and only then).
func podEvents(cfg config.Events, node string, stderr io.Writer, log logrus.FieldLogger) (sink eventQueue, run func(context.Context), err error) {
	path, err := driverPath()
	if err != nil {
		return eventQueue{}, nil, fmt.Errorf("events: %w", err)
	}
	args := []string{"--node", nodeName(node)}
	if cfg.Kubeconfig != "" {
		args = append(args, "--kubeconfig", cfg.Kubeconfig)
	}
	sink = eventQueue{queue: make(chan link.Event, eventsWaiting), log: log}
	queue := sink.queue
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
	return sink, run, nil
}
