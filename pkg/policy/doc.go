// Package policy turns a container's annotations into the qualified CDI
// device names it asks for, and decides whether it may have them.
//
// Requests come from two places:
//
//   - the pod annotation gpus.nri-gpu.io, in its container-scoped
//     (gpus.nri-gpu.io/container.<name>), pod-scoped (gpus.nri-gpu.io/pod)
//     or plain form, the first found winning as in NRI's
//     plugin.GetEffectiveAnnotation; its value is a comma-separated list of
//     qualified CDI names or short names of the default kind;
//   - the container annotations cdi.k8s.io/*, set by kubelet and device
//     plugins, parsed as CDI itself parses them.
//
// A denial wraps ErrDenied and names the rule, the request and the config
// key that would allow it. The package never logs: it returns decisions and
// errors for the plugin to report.
package policy
