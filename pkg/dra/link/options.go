package link

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// Options are what nri-gpu starts its DRA driver with, handed whole as
// its one command-line argument.
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
	// RollingUpdate, when set, is the UID of nri-gpu's pod: the driver
	// registers with kubelet for a rolling update (kubeletplugin's
	// RollingUpdate), beside the driver of the pod it replaces.
	RollingUpdate string `json:",omitempty"`
}

// Args returns the options as the driver's command-line arguments: one,
// the options whole as JSON, so that the driver is handed the block
// nri-gpu validated as it is (re-encoded flag by flag, a new key was
// once dropped on the way).
func (o Options) Args() []string {
	data, err := json.Marshal(o)
	if err != nil {
		panic(err) // strings, booleans and lists of strings always marshal
	}
	return []string{"--" + optionsFlag + "=" + string(data)}
}

// optionsFlag is the driver's one flag.
const optionsFlag = "options"

// ParseOptions parses the driver's command-line arguments, as Args writes
// them: strictly (a field it does not know is an error), the DRA block
// checked by the configuration's own validation; flag errors and usage
// go to stderr.
func ParseOptions(args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("nri-gpu-dra", flag.ContinueOnError)
	fs.SetOutput(stderr)
	raw := fs.String(optionsFlag, "", "the driver's options, as nri-gpu writes them (JSON)")
	var o Options
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *raw == "" {
		return o, fmt.Errorf("--%s is needed", optionsFlag)
	}
	dec := json.NewDecoder(strings.NewReader(*raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return o, fmt.Errorf("--%s: %w", optionsFlag, err)
	}
	if o.Node == "" {
		return o, fmt.Errorf("--%s: the node's name is needed", optionsFlag)
	}
	if err := o.DRA.Validate(); err != nil {
		return o, fmt.Errorf("--%s: %w", optionsFlag, err)
	}
	o.DRA.Enabled = true
	return o, nil
}
