// Package policy decides who may have which device: it reads what a
// container asks for, judges it under the configured rules, and keeps
// the one pool of holdings every door asks.
//
// Requests (request.go) come from the pod annotation gpus.nri-gpu.io (in
// its container-scoped gpus.nri-gpu.io/container.<name>, pod-scoped
// gpus.nri-gpu.io/pod or plain form, the first found winning as in NRI's
// plugin.GetEffectiveAnnotation; a comma-separated list of qualified CDI
// names or short names of the default kind) and its count form
// gpu-count.nri-gpu.io; from the container annotations cdi.k8s.io/* that
// kubelet and device plugins set, parsed as CDI itself parses them; and
// from the CDI devices the runtime reports it injects. The rules
// (policy.go) are policy.namespaces, devices, exclusive, maxDevicesPerPod,
// hookPaths, allowUnhealthy and sharing.
//
// The pool (pool.go) records which pod and which prepared DRA claim holds
// which devices, and answers every door one question (Room): how many
// more users may this device take through this door, 0 or 1 for a device
// that is not shared, the replicas left for one that is. A container's
// grant is planned without holding anything (admit.go: Plan), then held
// by Commit if the pool still allows it; a count request chooses the
// least used, most closely connected free devices (choose.go); claims
// are prepared into the same pool (claims.go); after a restart the pool
// is rebuilt and checked (restore.go).
//
// A denial wraps ErrDenied and names the rule, the request and the config
// key that would allow it. The package never logs: it returns decisions and
// errors for the plugin to report.
package policy
