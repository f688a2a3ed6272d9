package nvidia_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// TestSetComputeMode: the GPU named by its UUID is put in the mode asked
// for, and its mode before is returned; a GPU already in it is not set
// again; what NVML refuses is an error naming the GPU and the mode.
func TestSetComputeMode(t *testing.T) {
	tests := []struct {
		name    string
		setUp   func(*dgxa100.Server, *int)
		uuid    func(*dgxa100.Server) string
		mode    nvml.ComputeMode
		was     nvml.ComputeMode
		sets    int
		wantErr string
	}{
		{name: "Default to Exclusive_Process", mode: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, was: nvml.COMPUTEMODE_DEFAULT, sets: 1},
		{name: "already in it", mode: nvml.COMPUTEMODE_DEFAULT, was: nvml.COMPUTEMODE_DEFAULT},
		{name: "no such GPU", uuid: func(*dgxa100.Server) string { return "GPU-gone" }, mode: nvml.COMPUTEMODE_DEFAULT,
			wantErr: "NVML: GPU GPU-gone: "},
		{name: "refused", mode: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, was: nvml.COMPUTEMODE_DEFAULT, sets: 1,
			setUp: func(s *dgxa100.Server, sets *int) {
				s.Devices[1].(*dgxa100.Device).SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { *sets++; return nvml.ERROR_NO_PERMISSION }
			},
			wantErr: "setting compute mode Exclusive_Process: ERROR_NO_PERMISSION"},
		{name: "mode unknown", mode: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS,
			setUp: func(s *dgxa100.Server, _ *int) {
				s.Devices[1].(*dgxa100.Device).GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			},
			wantErr: "compute mode: ERROR_NOT_SUPPORTED"},
		{name: "no NVML", mode: nvml.COMPUTEMODE_DEFAULT,
			setUp: func(s *dgxa100.Server, _ *int) {
				s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
			},
			wantErr: "NVML"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testutil.NVML(2)
			sets := 0
			d := s.Devices[1].(*dgxa100.Device)
			set := d.SetComputeModeFunc
			d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return { sets++; return set(m) }
			if tc.setUp != nil {
				tc.setUp(s, &sets)
			}
			uuid, _ := d.GetUUID()
			if tc.uuid != nil {
				uuid = tc.uuid(s)
			}
			was, err := nvidia.SetComputeMode(s, uuid, tc.mode)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if was != tc.was || sets != tc.sets {
				t.Errorf("was %s, set %d times; want %s, %d", nvidia.ModeName(was), sets, nvidia.ModeName(tc.was), tc.sets)
			}
			if tc.wantErr == "" {
				if m, _ := d.GetComputeMode(); m != tc.mode {
					t.Errorf("GPU 1 in mode %s, want %s", nvidia.ModeName(m), nvidia.ModeName(tc.mode))
				}
				if m, _ := s.Devices[0].GetComputeMode(); m != nvml.COMPUTEMODE_DEFAULT {
					t.Errorf("GPU 0, not named, put in mode %s", nvidia.ModeName(m))
				}
			}
		})
	}
}
