package main

import (
	"context"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// doors are what serve the pool beside the runtime's requests, each run
// until its context is done: early ones before the plugin is built (the
// DRA driver of a rolling update, registered with kubelet while the
// nri-gpu this one takes over from still serves), the others once it is;
// views are what they serve, given the plugin's views once it is built.
type doors struct {
	opts         []plugin.Option
	early, later []func(context.Context)
	resources    map[*deviceplugin.Later]config.Resource
	dra          *link.Later
	draCfg       config.DRA
}

// serveViews gives the doors the plugin's views of what they serve.
func (d *doors) serveViews(p *plugin.Plugin) {
	for view, r := range d.resources {
		view.Set(p.Resource(r))
	}
	if d.dra != nil {
		d.dra.Set(p.DRAView(d.draCfg))
	}
}
