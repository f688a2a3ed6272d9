package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// runDevices prints the devices nri-gpu can inject and, where NVML
// answers, the GPUs it sees and whether each has a CDI device.
func runDevices(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	var (
		driverRoot = fs.String("driver-root", config.DefaultDriverRoot, "root of the driver's files, for NVML")
		stateFile  = fs.String("state-file", record.DefaultPath, "nri-gpu's state file, read and never written, for who shares each shared device")
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu devices: %v\n", err)
		return exitUsage
	}
	snap, err := specs.Load(cfg.CDISpecDirs)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu devices: %v\n", err)
		return exitError
	}

	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "DEVICE\tSPEC\tSTATUS\n")
	cdiNames := map[string]bool{}
	for _, e := range snap.Entries() {
		status := "ok"
		if e.Untrusted != nil {
			status = "not trusted"
		} else {
			cdiNames[e.Footprint.Name] = true
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", e.Footprint.Name, e.Spec, status)
	}
	_ = w.Flush()
	for path, errs := range snap.Problems {
		for _, err := range errs {
			fmt.Fprintf(stdout, "spec %s not used: %v\n", path, err)
		}
	}
	if len(cfg.Policy.Sharing) > 0 {
		printSharing(stdout, cfg, *stateFile)
	}

	inv, err := nvidia.Discover(nvidia.Library(*driverRoot))
	if err != nil {
		fmt.Fprintf(stdout, "\nGPUs: %v\n(without NVML, nri-gpu takes every device as healthy and knows no GPU topology)\n", err)
		return exitOK
	}
	// Health as a check sees it now (a lost GPU); the running plugin also
	// counts critical Xid errors since it started (its log, and the
	// nri_gpu_unhealthy_gpus metric).
	unhealthy := map[string]string{}
	if m, err := nvidia.NewMonitor(nvidia.Library(*driverRoot)); err == nil {
		m.Check()
		unhealthy = m.Unhealthies()
		m.Close()
	}
	fmt.Fprintf(stdout, "\nGPUs (NVIDIA driver %s):\n", inv.DriverVersion)
	w = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "INDEX\tUUID\tMODEL\tMEMORY\tMIG\tHEALTH\tCDI DEVICE\n")
	for _, g := range inv.GPUs {
		mig := "off"
		if g.MIGEnabled {
			mig = fmt.Sprintf("on (%d devices)", len(g.MIGs))
		}
		health := "healthy"
		if why, bad := unhealthy[nvidia.GPUNode(g.Minor)]; bad {
			health = "unhealthy: " + why
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\n", g.Index, g.UUID, g.Model, g.MemoryBytes>>20, mig, health,
			cdiDevice(cdiNames, cfg.DefaultKind, fmt.Sprint(g.Index), g.UUID))
	}
	_ = w.Flush()
	fmt.Fprintln(stdout, "(health: what a check sees now; the running plugin also counts critical Xid errors since it started, in its log and in nri_gpu_unhealthy_gpus; devices of other vendors are taken as healthy)")
	if topo, err := nvidia.DiscoverTopology(nvidia.Library(*driverRoot)); err == nil && len(inv.GPUs) > 1 {
		printTopology(stdout, inv.GPUs, topo)
	}
	return exitOK
}

// printSharing prints the devices policy.sharing shares, and who uses
// each as the state file says.
func printSharing(out io.Writer, cfg *config.Config, stateFile string) {
	var opts []plugin.Option
	record := "users as the state file " + stateFile + " says"
	if _, err := os.Stat(stateFile); err == nil {
		opts = append(opts, plugin.WithRecord(stateFile))
	} else {
		record = fmt.Sprintf("users unknown: %v", err)
	}
	p, err := plugin.New(cfg, quietLogger(), opts...)
	if err != nil {
		fmt.Fprintf(out, "\nShared devices: %v\n", err)
		return
	}
	defer p.Close()
	_ = p.HoldRecorded() // what pods keep against the policy: explain says it
	fmt.Fprintf(out, "\nShared devices (%s):\n", record)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "DEVICE\tSHARING\tUSERS\tLIMITS\n")
	for _, s := range p.SharedDevices() {
		users := "-"
		if len(s.Users) > 0 {
			users = strings.Join(s.Users, ", ")
		}
		limits := s.Limits
		if limits == "" {
			limits = "none (time-slicing)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Device, s.Sharing, users, limits)
	}
	_ = w.Flush()
}

// printTopology prints how closely each pair of GPUs is connected, as
// count requests score it.
func printTopology(out io.Writer, gpus []nvidia.GPU, topo nvidia.Topology) {
	fmt.Fprintf(out, "\nTopology (count requests take the free set scoring highest: NVLink %d+links, board %d, one PCIe switch %d, several %d, host bridge %d, NUMA node %d, across sockets %d):\n",
		nvidia.ScoreNVLink, nvidia.ScoreBoard, nvidia.ScoreSwitch, nvidia.ScoreSwitches, nvidia.ScoreHostBridge, nvidia.ScoreNUMA, nvidia.ScoreSystem)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprint(w, "GPU")
	for _, g := range gpus {
		fmt.Fprintf(w, "\t%d", g.Index)
	}
	fmt.Fprintln(w)
	for _, a := range gpus {
		fmt.Fprintf(w, "%d", a.Index)
		for _, b := range gpus {
			if a.Index == b.Index {
				fmt.Fprint(w, "\t-")
				continue
			}
			fmt.Fprintf(w, "\t%d", topo.Score(nvidia.GPUNode(a.Minor), nvidia.GPUNode(b.Minor)))
		}
		fmt.Fprintln(w)
	}
	_ = w.Flush()
}

// cdiDevice names the CDI device of a GPU, by index or UUID, or says
// there is none.
func cdiDevice(names map[string]bool, kind string, ids ...string) string {
	var found []string
	for _, id := range ids {
		if name := kind + "=" + id; names[name] {
			found = append(found, name)
		}
	}
	if len(found) == 0 {
		return "none (run nri-gpu generate)"
	}
	return strings.Join(found, ", ")
}
