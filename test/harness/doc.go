// Package harness runs a throwaway containerd with NRI, runc, crictl and a
// fake GPU host in a temp dir, for nri-gpu's end-to-end tests and demo.
//
// Everything lives under one directory: containerd's root, state and
// sockets, the NRI socket, the CDI spec dirs and the fake GPU's device
// nodes. Stop removes the pods, stops containerd and its shims, and
// unmounts whatever is left mounted below the directory, so nothing of a
// run outlives it. No image is ever pulled: a one-layer busybox image is
// built from the host's busybox-static binary and imported.
package harness
