// Package plugin is nri-gpu's NRI plugin and the wiring of its center:
// the one request path every door's devices go through, over one pool of
// holdings (pkg/policy), one snapshot of trusted specs per request
// (pkg/specs) and one adjustment (pkg/adjust).
//
// A container's creation (create.go) is decided, built, then committed:
// what it asks is parsed and each device looked up once in the request's
// snapshot (adjust.Creation); the pool plans the grant without holding it,
// under the one admission (pkg/policy); the adjustment is built and an
// MPS-shared GPU's daemon asked; only then is the grant held and
// recorded (pkg/record's Keeper), with one undo. The files are named for
// what they serve, each the methods of one type:
//
//	plugin.go        the Plugin, its configuration, Configure and Reload
//	options.go       the options New takes, and the doors' interfaces
//	overrides.go     what the command line sets over every configuration
//	connection.go    what the plugin knows of its connection to the runtime
//	serve.go         the connection to the runtime, reconnecting
//	create.go        CreateContainer: decide, build, commit
//	synchronize.go   Synchronize, the pods' end, and the record kept
//	unserved.go      containers the runtime created while nri-gpu was away, stopped
//	validate.go      ValidateContainerAdjustment
//	health.go        the GPUs' health watched (pkg/inventory, NVML)
//	deviceplugin.go  the device plugin's view (pkg/deviceplugin)
//	dra.go           the pool as the DRA driver process asks it (pkg/dra/link)
//	kubelet.go       the devices kubelet allocated (its pod-resources API)
//	mps.go           MPS as pkg/mps runs it
//	metrics.go       the node as the metrics tell it (pkg/metrics)
//	explain.go       what explain and devices show
//	generate.go      spec generation from NVML (pkg/specs/nvidia)
//	errors.go        the package's errors, and what a denial is counted as
//
// The glue logs each decision once; the packages below it never log.
package plugin
