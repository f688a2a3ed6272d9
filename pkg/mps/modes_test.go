package mps_test

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// TestNVMLModes: the GPU named by its UUID is put in the mode asked for,
// and its mode is read back; a GPU already in it is not set again; what
// NVML refuses is an error naming the GPU and the mode; an NVML that
// cannot be loaded is ErrNoModes.
func TestNVMLModes(t *testing.T) {
	tests := []struct {
		name    string
		setUp   func(*dgxa100.Server, *int)
		uuid    func(*dgxa100.Server) string
		mode    string
		sets    int
		wantErr string
		noModes bool
	}{
		{name: "Default to Exclusive_Process", mode: mps.ModeExclusive, sets: 1},
		{name: "already in it", mode: mps.ModeDefault},
		{name: "no such GPU", uuid: func(*dgxa100.Server) string { return "GPU-gone" }, mode: mps.ModeDefault,
			wantErr: "NVML: GPU GPU-gone: "},
		{name: "no such mode", mode: "Shared", wantErr: `no compute mode "Shared"`},
		{name: "refused", mode: mps.ModeExclusive, sets: 1,
			setUp: func(s *dgxa100.Server, sets *int) {
				s.Devices[1].(*dgxa100.Device).SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { *sets++; return nvml.ERROR_NO_PERMISSION }
			},
			wantErr: "setting compute mode Exclusive_Process: ERROR_NO_PERMISSION"},
		{name: "mode unknown", mode: mps.ModeExclusive,
			setUp: func(s *dgxa100.Server, _ *int) {
				s.Devices[1].(*dgxa100.Device).GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			},
			wantErr: "compute mode: ERROR_NOT_SUPPORTED"},
		{name: "no NVML", mode: mps.ModeDefault,
			setUp: func(s *dgxa100.Server, _ *int) {
				s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
			},
			wantErr: "NVML", noModes: true},
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
			modes := mps.NVMLModes{Lib: func() nvml.Interface { return s }}
			err := modes.Set(uuid, tc.mode)
			if tc.wantErr != "" {
				testutil.ErrorSays(t, err, tc.wantErr)
				if errors.Is(err, mps.ErrNoModes) != tc.noModes {
					t.Errorf("%v: ErrNoModes %v, want %v", err, !tc.noModes, tc.noModes)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if sets != tc.sets {
				t.Errorf("set %d times, want %d", sets, tc.sets)
			}
			if tc.wantErr == "" {
				if got, err := modes.Mode(uuid); err != nil || got != tc.mode {
					t.Errorf("GPU 1 in mode %s (%v), want %s", got, err, tc.mode)
				}
				if m, _ := s.Devices[0].GetComputeMode(); m != nvml.COMPUTEMODE_DEFAULT {
					t.Errorf("GPU 0, not named, put in mode %s", mps.ModeName(m))
				}
			}
		})
	}
}
