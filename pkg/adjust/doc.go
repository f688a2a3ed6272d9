// Package adjust turns the container edits of resolved CDI devices into one
// NRI container adjustment.
//
// The edits are applied exactly as CDI applies them (the library's own
// ContainerEdits.Apply, spec-level edits once per spec, in the order
// Cache.InjectDevices uses) to an empty OCI spec, and the result is
// converted with NRI's own OCI converters. So the device nodes (with type,
// major, minor, mode and owner read from the host node), cgroup rules,
// mounts, env and hooks (each at its own hook point) are those that a
// runtime's own CDI injection would produce.
//
// Some edits have no NRI counterpart on containerd 1.7 (NRI v0.8):
// additionalGids, intelRdt and netDevices. Build fails on them, naming the
// device and the edit, unless told to skip them. Device-node cgroup
// permissions narrower than "rw" always fail: NRI grants "rw" for every
// device it adds, so honouring them is impossible and skipping them would
// widen access.
package adjust
