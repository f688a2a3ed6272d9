package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// runExplain runs the plugin's own CreateContainer for a described pod and
// container and prints the adjustment it would return, or the denial.
func runExplain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	podAnn, ctrAnn := keyValues{}, keyValues{}
	fs.Var(podAnn, "annotation", "pod annotation KEY=VALUE (repeatable)")
	fs.Var(ctrAnn, "container-annotation", "container annotation KEY=VALUE (repeatable)")
	var (
		namespace = fs.String("namespace", "default", "pod namespace")
		pod       = fs.String("pod", "pod", "pod name")
		container = fs.String("container", "main", "container name")
		output    = fs.String("output", "text", "text or json")
		stateFile = fs.String("state-file", "", "the running plugin's state file (its --state-file), read and never written: explain as it would, with what pods and DRA claims hold")
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "nri-gpu explain: --output %q is neither text nor json\n", *output)
		return exitUsage
	}
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu explain: %v\n", err)
		return exitUsage
	}
	var opts []plugin.Option
	if *stateFile != "" {
		opts = append(opts, plugin.WithRecord(*stateFile))
	}
	p, err := plugin.New(cfg, quietLogger(), opts...)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu explain: %v\n", err)
		return exitUsage
	}
	defer p.Close()
	keptLines := keptAgainstPolicy(p)
	p.CheckHealth()

	adj, grant, err := p.Create(context.Background(),
		&api.PodSandbox{Id: "explain", Name: *pod, Namespace: *namespace, Annotations: podAnn},
		&api.Container{Id: "explain", PodSandboxId: "explain", Name: *container, Annotations: ctrAnn, Linux: &api.LinuxContainer{}})
	shared := p.SharedDevices()
	if *output == "text" {
		for _, l := range keptLines {
			fmt.Fprintf(stdout, "kept     %s (kept until the pod is removed)\n", l)
		}
		printShared(stdout, shared)
	}
	if err != nil {
		if *output == "json" {
			_ = json.NewEncoder(stdout).Encode(map[string]any{"denied": err.Error(), "keptAgainstPolicy": keptLines, "shared": shared})
		} else {
			fmt.Fprintf(stdout, "denied: %v\n", err)
		}
		return exitError
	}
	bounds := p.MemoryBounds("explain")
	if *output == "json" {
		printExplainJSON(stdout, adj, grant, keptLines, shared, bounds)
		return exitOK
	}
	printCount(stdout, grant)
	printAdjustment(stdout, adj)
	for _, b := range bounds {
		fmt.Fprintf(stdout, "memory   %s (%s): bounded by the driver to %s (soft %s) when the container starts\n",
			b.Device, b.UUID, policy.Quantity(int64(b.Hard)), policy.Quantity(int64(b.Soft)))
	}
	return exitOK
}

// keptAgainstPolicy returns what pods keep though the configuration in
// force would not give it (docs/policy.md), one line each.
func keptAgainstPolicy(p *plugin.Plugin) []string {
	var conflict *policy.ConflictError
	if !errors.As(p.HoldRecorded(), &conflict) {
		return nil
	}
	lines := conflict.Problems
	if conflict.More > 0 {
		lines = append(lines, fmt.Sprintf("(and %d more)", conflict.More))
	}
	return lines
}

// printExplainJSON prints what explain found, as JSON.
func printExplainJSON(w io.Writer, adj *api.ContainerAdjustment, grant policy.Grant, kept []string, shared []mps.Shared, bounds []plugin.MemoryBound) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	out := map[string]any{"adjustment": adj}
	if len(kept) > 0 {
		out["keptAgainstPolicy"] = kept
	}
	if len(shared) > 0 {
		out["shared"] = shared
	}
	if len(bounds) > 0 {
		out["memoryBounds"] = bounds
	}
	if len(grant.Counted) > 0 {
		out["count"] = map[string]any{"chosen": specs.Names(grant.Counted), "topologyScore": grant.Score, "free": grant.Considered.Free, "passedOver": grant.Considered.Passed}
	}
	_ = enc.Encode(out)
}

// printShared prints, per shared device, how it is shared and by whom.
func printShared(w io.Writer, shared []mps.Shared) {
	for _, s := range shared {
		users := "no one"
		if len(s.Users) > 0 {
			users = fmt.Sprintf("%d: %s", len(s.Users), strings.Join(s.Users, ", "))
		}
		fmt.Fprintf(w, "shared   %s by %s, used by %s\n", s.Device, s.Sharing, users)
		if s.Limits != "" {
			fmt.Fprintf(w, "shared   %s: %s\n", s.Device, s.Limits)
		}
	}
}

// printCount prints what a count request chose and passed over.
func printCount(w io.Writer, g policy.Grant) {
	if len(g.Counted) == 0 {
		return
	}
	score := "topology unknown or one device: spec order"
	if g.Score > 0 {
		score = fmt.Sprintf("topology score %d", g.Score)
	}
	fmt.Fprintf(w, "count    chose %s (%s)\n", strings.Join(specs.Names(g.Counted), ","), score)
	fmt.Fprintf(w, "count    free %s\n", strings.Join(g.Considered.Free, ","))
	for _, p := range g.Considered.Passed {
		fmt.Fprintf(w, "count    passed over %s: %s\n", p.Device, p.Reason)
	}
}

// printAdjustment prints an adjustment for a person.
func printAdjustment(w io.Writer, adj *api.ContainerAdjustment) {
	if adj == nil {
		fmt.Fprintln(w, "no devices requested: the container is left alone")
		return
	}
	for _, d := range adj.GetLinux().GetDevices() {
		fmt.Fprintf(w, "device   %s  %s %d:%d mode %v uid %d gid %d\n", d.Path, d.Type, d.Major, d.Minor,
			d.FileMode.Get(), d.Uid.GetValue(), d.Gid.GetValue())
		fmt.Fprintf(w, "cgroup   allow %s %d:%d %s\n", d.Type, d.Major, d.Minor, d.AccessString())
	}
	for _, r := range adj.GetLinux().GetResources().GetDevices() {
		fmt.Fprintf(w, "cgroup   allow %s %d:%d %s (where the runtime applies CDI's rules)\n", r.Type, r.Major.GetValue(), r.Minor.GetValue(), r.Access)
	}
	for _, m := range adj.GetMounts() {
		fmt.Fprintf(w, "mount    %s -> %s (%s)\n", m.Source, m.Destination, strings.Join(m.Options, ","))
	}
	for _, kv := range adj.GetEnv() {
		fmt.Fprintf(w, "env      %s=%s\n", kv.Key, kv.Value)
	}
	h := adj.GetHooks()
	for _, point := range []struct {
		name  string
		hooks []*api.Hook
	}{{"prestart", h.GetPrestart()}, {"createRuntime", h.GetCreateRuntime()}, {"createContainer", h.GetCreateContainer()},
		{"startContainer", h.GetStartContainer()}, {"poststart", h.GetPoststart()}, {"poststop", h.GetPoststop()}} {
		for _, hook := range point.hooks {
			fmt.Fprintf(w, "hook     %s %s %s (env %s)\n", point.name, hook.Path, strings.Join(hook.Args, " "), strings.Join(hook.Env, " "))
		}
	}
	for k, v := range adj.GetAnnotations() {
		fmt.Fprintf(w, "annotate %s=%s\n", k, v)
	}
}
