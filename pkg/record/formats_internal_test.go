package record

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// fixtureBoot is the boot ID in testdata/formats/1-boot-id.json.
const fixtureBoot = "0f4b6c52-6a0e-4d55-9d0b-3c1a8e2f7b19"

func pod(name string) policy.Pod { return policy.Pod{ID: "id-" + name, Namespace: "ns", Name: name} }

func gpu(i string) specs.Device {
	return specs.Device{Name: "nvidia.com/gpu=" + i, Nodes: []string{"c 195:" + i}}
}

// formats are what each shape of testdata/formats holds, each the one
// before with what its shape added.
func formats() map[string]Content {
	a := policy.Holding{Pod: pod("a"), Named: []specs.Device{gpu("0")}}
	b := policy.Holding{Pod: pod("b"), Counted: []specs.Device{gpu("1")}}
	k := policy.Holding{Pod: pod("k"), Named: []specs.Device{gpu("2")}, Kubelet: []string{"nvidia.com/gpu=2"}}
	s := policy.Holding{Pod: pod("s"), Named: []specs.Device{gpu("4")}, Sole: []string{"nvidia.com/gpu=4"}}
	m := policy.Holding{Pod: pod("m"), Counted: []specs.Device{{Name: "nvidia.com/gpu=5:0",
		Nodes: []string{"c 195:5", "c 508:21", "c 508:22"}, Parts: []string{"c 508:21", "c 508:22"}}}}
	p := policy.Holding{Pod: pod("p"), Claims: []string{"uid-c"}}
	c := policy.ClaimHolding{Claim: policy.Claim{UID: "uid-c", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}},
		Devices: []policy.ClaimDevice{{Device: gpu("3"), Requests: []string{"gpu"}}}}
	shared := func(asked policy.GpuConfig) policy.ClaimHolding {
		return policy.ClaimHolding{Claim: policy.Claim{UID: "uid-sh", Namespace: "ns", Name: "sh", Pods: []policy.PodName{{Namespace: "ns", Name: "q"}}},
			Devices: []policy.ClaimDevice{{Device: gpu("6"), Requests: []string{"gpu"}, Use: policy.Use{Shares: 2, Memory: 10 << 30}, GpuConfig: asked}}}
	}
	asked := policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 40, PinnedMemory: 8 << 30}
	all := Content{Pods: []policy.Holding{a, b, k, s, m, p}, Claims: []policy.ClaimHolding{c, shared(asked)}}
	return map[string]Content{
		"1-pods.json":       {Pods: []policy.Holding{a, b}},
		"1-claims.json":     {Pods: []policy.Holding{a, b, k}, Claims: []policy.ClaimHolding{c}},
		"1-sole.json":       {Pods: []policy.Holding{a, b, k, s}, Claims: []policy.ClaimHolding{c}},
		"1-parts.json":      {Pods: []policy.Holding{a, b, k, s, m}, Claims: []policy.ClaimHolding{c}},
		"1-amounts.json":    {Pods: []policy.Holding{a, b, k, s, m}, Claims: []policy.ClaimHolding{c, shared(policy.GpuConfig{})}},
		"1-asked.json":      {Pods: []policy.Holding{a, b, k, s, m}, Claims: []policy.ClaimHolding{c, shared(asked)}},
		"1-pod-claims.json": all,
		"1-boot-id.json":    all,
		"1-mps-daemons.json": {Pods: all.Pods, Claims: all.Claims, Daemons: []mps.Entry{
			{Device: "nvidia.com/gpu=6", Control: "/usr/bin/nvidia-cuda-mps-control", Dir: "/run/nri-gpu/mps/GPU-6", GPU: "GPU-6", Was: "Default", State: mps.Running},
			{Device: "nvidia.com/gpu=7", Control: "/usr/bin/nvidia-cuda-mps-control", Dir: "/run/nri-gpu/mps/GPU-7", GPU: "GPU-7", Root: "/host", Was: "Default", State: mps.Starting},
		}},
	}
}

// fixture copies a file of testdata/formats to a state file of the
// test's own (Load reads only a file its user owns, of mode 0600).
func fixture(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "formats", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "allocations.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFormats: every record format nri-gpu has written is read, each
// holding what it kept; a newer one is refused, naming both versions,
// and the claims it keeps are still returned, so that their devices are
// not given away.
func TestFormats(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "formats", "1-*.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := formats()
	if len(files) != len(want) {
		t.Errorf("%d formats in testdata, %d said here: say what each holds", len(files), len(want))
	}
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			f := Open(fixture(t, name))
			f.boot = fixtureBoot
			got, err := f.Load()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
		})
	}
	for _, tc := range []struct{ name, file, boot, want string }{
		{name: "newer", file: "newer-2.json", boot: fixtureBoot, want: "written by a newer nri-gpu: format version 2, and this nri-gpu reads version 1 and older"},
		{name: "a field this format lacks", file: "1-claims.json", boot: fixtureBoot, want: `written by a newer nri-gpu: field "quota", which this nri-gpu cannot read`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := fixture(t, tc.file)
			if tc.name == "a field this format lacks" {
				addField(t, path)
			}
			f := Open(path)
			f.boot = tc.boot
			got, err := f.Load()
			if !errors.Is(err, ErrNewer) {
				t.Fatalf("Load: %v, want it refused as written by a newer nri-gpu", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) {
				t.Errorf("Load: %q, want it to say %q", msg, tc.want)
			}
			if len(got.Pods) > 0 {
				t.Errorf("pods returned from a newer record: %v; they are found again in their containers", got.Pods)
			}
			var uids []string
			for _, c := range got.Claims {
				uids = append(uids, c.Claim.UID+" "+specs.Names(c.Footprints())[0])
			}
			if want := claimsOf(t, tc.file); !cmp.Equal(want, uids) {
				t.Errorf("claims kept of a newer record: %v, want %v", uids, want)
			}
		})
	}
	// After a reboot and a downgrade: a newer record of another boot
	// holds nothing, and is no error.
	t.Run("newer, of another boot", func(t *testing.T) {
		f := Open(fixture(t, "newer-2.json"))
		f.boot = "a0c2e4f6-1111-4222-8333-944455556666"
		got, err := f.Load()
		if err != nil || len(got.Claims)+len(got.Pods) > 0 || got.EarlierBoot != fixtureBoot {
			t.Errorf("Load: %+v, %v; want nothing held, of boot %s", got, err, fixtureBoot)
		}
	})
}

// addField adds a field no format of this nri-gpu has to the record at
// path's first claim, as a newer nri-gpu might within the same version.
func addField(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	rec["claims"].([]any)[0].(map[string]any)["quota"] = 1
	if data, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// claimsOf returns, for each claim of the fixture, its UID and its
// first device.
func claimsOf(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "formats", file))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Claims []struct {
			UID     string `json:"uid"`
			Devices []struct {
				Name string `json:"name"`
			} `json:"devices"`
		} `json:"claims"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range rec.Claims {
		out = append(out, c.UID+" "+c.Devices[0].Name)
	}
	return out
}

// TestFormatWritten: Save writes the newest shape of testdata/formats,
// byte for byte, so that no change of the format goes unrecorded there.
func TestFormatWritten(t *testing.T) {
	f := Open(filepath.Join(t.TempDir(), "allocations.json"))
	f.boot = fixtureBoot
	if err := f.Save(func() Content { return formats()["1-mps-daemons.json"] }); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "formats", "1-mps-daemons.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("Save wrote\n%s\nnot the newest format in testdata/formats:\n%s\nadd the new shape there (and to TestFormats), keeping the others", got, want)
	}
}

// TestEarlierBoot: a record kept in another boot than this one holds
// nothing, and says which boot it was; one of this boot, and one of an
// nri-gpu that kept no boot ID, hold what they say.
func TestEarlierBoot(t *testing.T) {
	for _, tc := range []struct {
		name, file, boot string
		earlier          bool
	}{
		{name: "another boot", file: "1-boot-id.json", boot: "a0c2e4f6-1111-4222-8333-944455556666", earlier: true},
		{name: "this boot", file: "1-boot-id.json", boot: fixtureBoot},
		{name: "no boot ID kept", file: "1-pod-claims.json", boot: "a0c2e4f6-1111-4222-8333-944455556666"},
		{name: "this boot unknown", file: "1-boot-id.json", boot: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Open(fixture(t, tc.file))
			f.boot = tc.boot
			got, err := f.Load()
			if err != nil {
				t.Fatal(err)
			}
			held := len(got.Pods) + len(got.Claims)
			switch {
			case tc.earlier && (held > 0 || got.EarlierBoot != fixtureBoot):
				t.Errorf("a record of boot %s read in boot %s: %d holdings, earlier boot %q; want none, and the record's boot", fixtureBoot, tc.boot, held, got.EarlierBoot)
			case !tc.earlier && (held != 8 || got.EarlierBoot != ""):
				t.Errorf("%d holdings, earlier boot %q; want the record's 8, of this boot", held, got.EarlierBoot)
			}
		})
	}
	// What is kept now carries this boot's ID.
	f := Open(filepath.Join(t.TempDir(), "allocations.json"))
	f.boot = "this-boot"
	if err := f.Save(func() Content { return formats()["1-pods.json"] }); err != nil {
		t.Fatal(err)
	}
	f.boot = "next-boot"
	if got, err := f.Load(); err != nil || got.EarlierBoot != "this-boot" || len(got.Pods) > 0 {
		t.Errorf("a record saved in boot this-boot, read in next-boot: %+v, %v", got, err)
	}
}
