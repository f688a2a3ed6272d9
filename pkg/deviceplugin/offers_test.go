package deviceplugin_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

func says(devs []deviceplugin.Device) string {
	var out []string
	for _, d := range devs {
		h := "unhealthy"
		if d.Healthy {
			h = "healthy"
		}
		out = append(out, d.ID+" "+h)
	}
	return fmt.Sprint(out)
}

// TestOfferedDevices: a device is listed healthy while the pool has room
// for it, a shared one as its replicas, the first Room of them healthy;
// one offered before and gone since stays listed, unhealthy, in the
// place it was first offered.
func TestOfferedDevices(t *testing.T) {
	var o deviceplugin.Offered
	for i, tc := range []struct {
		offers []deviceplugin.Offer
		want   string
	}{
		{[]deviceplugin.Offer{{ID: "0", Room: 1}, {ID: "1", Replicas: 3, Room: 2}, {ID: "2", Room: 0}},
			"[0 healthy 1::0 healthy 1::1 healthy 1::2 unhealthy 2 unhealthy]"},
		{[]deviceplugin.Offer{{ID: "2", Room: 1}, {ID: "1", Replicas: 3, Room: 3}},
			"[0 unhealthy 1::0 healthy 1::1 healthy 1::2 healthy 2 healthy]"},
		{[]deviceplugin.Offer{{ID: "3", Room: 1}},
			"[0 unhealthy 1::0 unhealthy 1::1 unhealthy 1::2 unhealthy 2 unhealthy 3 healthy]"},
	} {
		if got := says(o.Devices(tc.offers)); got != tc.want {
			t.Errorf("step %d: got %s, want %s", i, got, tc.want)
		}
	}
}

// TestPrefer: kubelet's preferred allocation: mustInclude first, then one
// replica per device, the least used first, the most closely linked
// where the topology is known, else the first listed; a second replica
// of a device only to make up size.
func TestPrefer(t *testing.T) {
	devs := func(ids ...string) []deviceplugin.Device {
		var out []deviceplugin.Device
		for _, id := range ids {
			out = append(out, deviceplugin.Device{ID: id, Healthy: true})
		}
		return out
	}
	footprint := func(id string) specs.Device { return specs.Device{Name: "example.com/gpu=" + id} }
	// GPUs 0 and 2 are linked closely, every other pair loosely.
	links := func(a, b specs.Device) int {
		pair := []string{a.Name, b.Name}
		slices.Sort(pair)
		if slices.Equal(pair, []string{"example.com/gpu=0", "example.com/gpu=2"}) {
			return 10
		}
		return 1
	}
	four := devs("0", "1", "2", "3")
	shared := devs("0::0", "0::1", "1::0", "1::1")
	for _, tc := range []struct {
		name                   string
		devs                   []deviceplugin.Device
		available, mustInclude []string
		size                   int
		links                  func(a, b specs.Device) int
		want                   []string
	}{
		{"the first listed", four, []string{"0", "1", "2", "3"}, nil, 2, nil, []string{"0", "1"}},
		{"only what is available", four, []string{"1", "3"}, nil, 2, nil, []string{"1", "3"}},
		{"mustInclude first", four, []string{"0", "1", "2", "3"}, []string{"3"}, 2, nil, []string{"3", "0"}},
		{"the closest to mustInclude", four, []string{"0", "1", "2", "3"}, []string{"0"}, 2, links, []string{"0", "2"}},
		{"the closest pair", devs("1", "0", "2"), []string{"1", "0", "2"}, nil, 2, links, []string{"0", "2"}},
		{"the least used device", shared, []string{"0::1", "1::0", "1::1"}, nil, 1, nil, []string{"1::0"}},
		{"one replica per device first", shared, []string{"0::0", "0::1", "1::0", "1::1"}, []string{"1::0"}, 2, nil, []string{"1::0", "0::0"}},
		{"a second replica to make up size", shared, []string{"0::0", "0::1"}, nil, 2, nil, []string{"0::0", "0::1"}},
		{"no more than available", four, []string{"2"}, nil, 3, nil, []string{"2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := deviceplugin.Prefer(tc.devs, tc.available, tc.mustInclude, tc.size, footprint, tc.links)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOffers: a device plugin offers each device by its name within its
// kind, with room for one holder while no pod holds it through another
// door and it is healthy, a shared one its replicas with the room they
// have left.
func TestOffers(t *testing.T) {
	snap := testutil.Snapshot(t, testutil.GPUSpec(3))
	pol := policy.New(config.Policy{Devices: config.DefaultDevices, Namespaces: []string{"*"},
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}})
	gpus := snap.Candidates(config.DefaultKind)
	held := policy.NewAllocations()
	if err := held.Restore(pol, []policy.Holding{
		{Pod: policy.Pod{ID: "a", Namespace: "ns", Name: "a"}, Named: gpus[0:1]},
		{Pod: policy.Pod{ID: "b", Namespace: "ns", Name: "b"}, Named: gpus[1:2]},
	}); err != nil {
		t.Fatal(err)
	}
	sick := errors.New("lost")
	for _, tc := range []struct {
		name     string
		hardware []specs.Device
		pool     *policy.Allocations
		ch       policy.Choice
		want     []deviceplugin.Offer
	}{
		{name: "free", hardware: gpus, pool: policy.NewAllocations(),
			want: []deviceplugin.Offer{{ID: "0", Room: 1}, {ID: "1", Replicas: 2, Room: 2}, {ID: "2", Room: 1}}},
		{name: "one of them", hardware: gpus[1:2], pool: policy.NewAllocations(),
			want: []deviceplugin.Offer{{ID: "1", Replicas: 2, Room: 2}}},
		{name: "held by annotations", hardware: gpus, pool: held,
			want: []deviceplugin.Offer{{ID: "0", Room: 0}, {ID: "1", Replicas: 2, Room: 1}, {ID: "2", Room: 1}}},
		{name: "unhealthy", hardware: gpus, pool: policy.NewAllocations(),
			ch: policy.Choice{Unhealthy: func(d specs.Device) error {
				if d.Name == "nvidia.com/gpu=2" {
					return sick
				}
				return nil
			}},
			want: []deviceplugin.Offer{{ID: "0", Room: 1}, {ID: "1", Replicas: 2, Room: 2}, {ID: "2", Room: 0}}},
		{name: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ch.Hooks == nil {
				tc.ch.Hooks = snap.Hooks
			}
			if got := deviceplugin.Offers(tc.hardware, pol, tc.pool, tc.ch); !slices.Equal(got, tc.want) {
				t.Errorf("offers %+v, want %+v", got, tc.want)
			}
		})
	}
}
