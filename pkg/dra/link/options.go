package link

import (
	"flag"
	"fmt"
	"io"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// Options are what nri-gpu starts its DRA driver with, as command-line
// arguments.
type Options struct {
	// DRA is the start.dra block of nri-gpu's configuration; the driver
	// uses its driverName, kubeconfig, pluginDir, registryDir,
	// unhealthyTaint and cdiDevices (kinds and devices are nri-gpu's to
	// judge).
	DRA config.DRA
	// Node is the node's name.
	Node string
	// LogLevel and LogFormat are nri-gpu's --log-level and --log-format.
	LogLevel, LogFormat string
}

// Args returns the options as the driver's command-line arguments.
func (o Options) Args() []string {
	args := []string{
		"--driver-name=" + o.DRA.DriverName,
		"--node-name=" + o.Node,
		"--plugin-dir=" + o.DRA.PluginDir,
		"--registry-dir=" + o.DRA.RegistryDir,
		"--unhealthy-taint=" + o.DRA.UnhealthyTaint,
		"--cdi-devices=" + string(o.DRA.CDIDevices),
		"--log-level=" + o.LogLevel,
		"--log-format=" + o.LogFormat,
	}
	if o.DRA.Kubeconfig != "" {
		args = append(args, "--kubeconfig="+o.DRA.Kubeconfig)
	}
	return args
}

// ParseOptions parses the driver's command-line arguments, as Args writes
// them; flag errors and usage go to stderr.
func ParseOptions(args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("nri-gpu-dra", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.StringVar(&o.DRA.DriverName, "driver-name", "", "the DRA driver's name")
	fs.StringVar(&o.Node, "node-name", "", "the node's name")
	fs.StringVar(&o.DRA.PluginDir, "plugin-dir", "", "kubelet's plugins directory")
	fs.StringVar(&o.DRA.RegistryDir, "registry-dir", "", "kubelet's plugin registration directory")
	fs.StringVar(&o.DRA.UnhealthyTaint, "unhealthy-taint", "", "the effect of an unhealthy device's taint: NoSchedule or NoExecute")
	fs.StringVar((*string)(&o.DRA.CDIDevices), "cdi-devices", string(config.CDICRI), "who injects a claim's devices: cri (the runtime, through kubelet's CDI devices) or nri-gpu")
	fs.StringVar(&o.DRA.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, f := range []struct{ name, value string }{
		{"driver-name", o.DRA.DriverName}, {"node-name", o.Node}, {"plugin-dir", o.DRA.PluginDir}, {"registry-dir", o.DRA.RegistryDir},
		{"unhealthy-taint", o.DRA.UnhealthyTaint},
	} {
		if f.value == "" {
			return o, fmt.Errorf("--%s is needed", f.name)
		}
	}
	if t := o.DRA.UnhealthyTaint; t != config.TaintNoSchedule && t != config.TaintNoExecute {
		return o, fmt.Errorf("--unhealthy-taint=%q: want %s or %s", t, config.TaintNoSchedule, config.TaintNoExecute)
	}
	if c := o.DRA.CDIDevices; c != config.CDICRI && c != config.CDINRIGPU {
		return o, fmt.Errorf("--cdi-devices=%q: want %s or %s", c, config.CDICRI, config.CDINRIGPU)
	}
	o.DRA.Enabled = true
	return o, nil
}
