// Package plugin is nri-gpu's NRI plugin and the wiring of its center:
// the one request path every door's devices go through, over one pool of
// holdings (pkg/policy), one snapshot of trusted specs per request
// (pkg/specs) and one adjustment (pkg/adjust).
//
// A container's creation (request.go) is decided, built, then committed:
// what it asks is parsed and checked by the policy and each device
// resolved once; the pool plans the grant without holding it; the
// adjustment is built and an MPS-shared GPU's daemon asked; only then is
// the grant held and recorded (pkg/record), with one undo. The files are
// named for what they serve:
//
//	plugin.go        the Plugin, its configuration, Configure and Reload
//	serve.go         the connection to the runtime, reconnecting
//	request.go       CreateContainer: decide, build, commit
//	synchronize.go   Synchronize, the pods' end, and the record kept
//	validate.go      ValidateContainerAdjustment
//	inventory.go     the node's hardware for every door: devices, NVML
//	                 facts, health and topology, and what is free
//	deviceplugin.go  the device plugin's view (pkg/deviceplugin)
//	dra.go           the pool as the DRA driver process asks it, and a
//	                 container's claims as it answers (pkg/dra/link)
//	mps.go           MPS clients' edits, and the managed daemons (pkg/mps)
//	generate.go      spec generation from NVML (pkg/specs/nvidia)
//	errors.go        the package's errors, and what a denial is counted as
//
// The glue logs each decision once; the packages below it never log.
package plugin
