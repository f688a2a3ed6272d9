package adjust_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/corpus"
)

// TestCorpusParity injects every device of every published spec of the
// corpus (test/corpus) as the CDI library does (Cache.InjectDevices) and
// as nri-gpu does (Build, applied as NRI applies an adjustment), into the
// same container spec, for a runtime that applies cgroup rules, net
// devices and RDT (containerd 2.x) and one that applies none of them
// (containerd 1.7), and compares them field by field. The differences
// allowed are each asserted as exactly that difference.
func TestCorpusParity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making the corpus's device nodes needs root")
	}
	all, err := corpus.Specs()
	if err != nil {
		t.Fatal(err)
	}
	runtimes := []adjust.Runtime{adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0")}
	for _, s := range all {
		// Each spec in a directory of its own: two publishers may use
		// the same device names.
		dir := t.TempDir()
		if _, err := s.Install(dir, t.TempDir(), "/usr/bin/recording-hook"); err != nil {
			t.Fatal(err)
		}
		snap, err := specs.Load([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Problems) > 0 {
			t.Fatalf("%s not loaded: %v", s.File, snap.Problems)
		}
		cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range s.Devices() {
			for _, rt := range runtimes {
				t.Run(s.File+"/"+name+"/"+rt.Name+"-"+rt.Version, func(t *testing.T) {
					viaCDI := baseSpec()
					if _, err := cache.InjectDevices(viaCDI, name); err != nil {
						t.Fatalf("the CDI library: %v", err)
					}
					e, err := snap.Lookup(name)
					if err != nil {
						t.Fatal(err)
					}
					res, err := adjust.Build([]*cdi.Device{e.Device}, snap.HostNodes, adjust.Options{Runtime: rt})
					if refused := refusedOn(rt, e.Device); refused != "" {
						if !errors.Is(err, adjust.ErrUnsupportedEdit) || !strings.Contains(err.Error(), refused) {
							t.Fatalf("error %v, want %s refused as unsupported", err, refused)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					adj := res.Adjustment
					if !rt.CgroupRules && adj.GetLinux() != nil {
						adj.Linux.Resources = nil // NRI before v0.9 ignores them
					}
					compare(t, viaCDI, adjustedByNRI(t, adj), rt, res)
				})
			}
		}
	}
}

// refusedOn names the edit of d that rt cannot apply and that changes
// what the container can do, or returns "".
func refusedOn(rt adjust.Runtime, d *cdi.Device) string {
	for _, e := range []*cdi.ContainerEdits{{ContainerEdits: &d.GetSpec().ContainerEdits}, {ContainerEdits: &d.ContainerEdits}} {
		switch {
		case e.IntelRdt != nil && (!rt.RDT || e.IntelRdt.L3CacheSchema != "" || e.IntelRdt.MemBwSchema != ""):
			return "intelRdt"
		case len(e.NetDevices) > 0 && !rt.NetDevices:
			return "netDevices"
		}
		for _, n := range e.DeviceNodes {
			if p := n.Permissions; !rt.CgroupRules && p != "" && !(strings.Contains(p, "r") && strings.Contains(p, "w")) {
				return "cgroup permissions"
			}
		}
	}
	return ""
}

// compare compares the container of the CDI library with nri-gpu's, less
// the differences allowed, each checked to be exactly that.
func compare(t *testing.T, viaCDI, viaNRI *oci.Spec, rt adjust.Runtime, res *adjust.Result) {
	t.Helper()
	// A hook whose spec gives no env gets nri-gpu's minimal one.
	if viaCDI.Hooks != nil {
		for _, point := range [][]oci.Hook{viaCDI.Hooks.Prestart, viaCDI.Hooks.CreateRuntime, viaCDI.Hooks.CreateContainer, //nolint:staticcheck // CDI specs may use prestart
			viaCDI.Hooks.StartContainer, viaCDI.Hooks.Poststart, viaCDI.Hooks.Poststop} {
			for i := range point {
				if len(point[i].Env) == 0 {
					point[i].Env = []string{specs.HookEnv}
				}
			}
		}
	}
	// Additional groups are left out for a root process, and reported.
	if gids := viaCDI.Process.User.AdditionalGids; len(gids) > 0 {
		if len(res.Unneeded) == 0 || res.Unneeded[0].Edit != adjust.EditAdditionalGIDs {
			t.Errorf("additional groups %v left out without being reported: %+v", gids, res.Unneeded)
		}
		viaCDI.Process.User.AdditionalGids = nil
	} else if len(res.Unneeded) > 0 {
		t.Errorf("reported as left out: %+v, but CDI adds no groups", res.Unneeded)
	}

	if diff := cmp.Diff(viaCDI.Process, viaNRI.Process); diff != "" {
		t.Errorf("process (-cdi +nri-gpu):\n%s", diff)
	}
	if diff := cmp.Diff(viaCDI.Mounts, viaNRI.Mounts); diff != "" {
		t.Errorf("mounts (-cdi +nri-gpu):\n%s", diff)
	}
	if diff := cmp.Diff(viaCDI.Hooks, viaNRI.Hooks); diff != "" {
		t.Errorf("hooks (-cdi +nri-gpu):\n%s", diff)
	}
	if diff := cmp.Diff(viaCDI.Linux.Devices, viaNRI.Linux.Devices); diff != "" {
		t.Errorf("device nodes (-cdi +nri-gpu):\n%s", diff)
	}
	if diff := cmp.Diff(viaCDI.Linux.NetDevices, viaNRI.Linux.NetDevices); diff != "" {
		t.Errorf("net devices (-cdi +nri-gpu):\n%s", diff)
	}
	if diff := cmp.Diff(viaCDI.Linux.IntelRdt, viaNRI.Linux.IntelRdt); diff != "" {
		t.Errorf("RDT (-cdi +nri-gpu):\n%s", diff)
	}
	// The device access the cgroup rules give, device by device: the same
	// where the runtime applies cgroup rules; without them, NRI's "rw"
	// (and "m" for block devices) instead of CDI's "rwm".
	for _, d := range viaCDI.Linux.Devices {
		want, got := testutil.DeviceAccess(viaCDI, d), testutil.DeviceAccess(viaNRI, d)
		if !rt.CgroupRules && d.Type == "c" && want == "rwm" {
			want = "rw"
		}
		if want != got {
			t.Errorf("device %s (%s %d:%d): access %q through nri-gpu, %q through CDI", d.Path, d.Type, d.Major, d.Minor, got, want)
		}
	}
}
