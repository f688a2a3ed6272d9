package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// prometheusConfig is the configuration of the test's Prometheus: it
// scrapes nri-gpu's pods' metrics ports (listed in %[1]s, as the
// Prometheus operator lists the chart's ServiceMonitor's endpoints: each
// with its node; Debian's Prometheus is built without Kubernetes
// discovery) labelled job nri-gpu, the DCGM-shaped exporter beside them,
// and evaluates the chart's rules. %[2]s is the exporter's address, %[3]s
// the rule file.
const prometheusConfig = `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%[3]s]
scrape_configs:
  - job_name: nri-gpu-pods
    file_sd_configs:
      - files: [%[1]s]
        refresh_interval: 1s
    relabel_configs:
      - target_label: job
        replacement: nri-gpu
  - job_name: dcgm
    static_configs:
      - targets: ['%[2]s']
`

// writeTargets lists, in file (Prometheus's file discovery), the metrics
// ports of nri-gpu's pods (metrics, dra-metrics) on their pod IPs, each
// labelled with its node, as the chart's ServiceMonitor has them scraped.
func writeTargets(t *testing.T, file string) {
	t.Helper()
	pods := nriPods(t)
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var groups []group
	for node, p := range pods {
		var targets []string
		for _, port := range p.Spec.Containers[0].Ports {
			if port.Name == "metrics" || port.Name == "dra-metrics" {
				targets = append(targets, net.JoinHostPort(p.Status.PodIP, fmt.Sprint(port.ContainerPort)))
			}
		}
		groups = append(groups, group{Targets: targets, Labels: map[string]string{"node": node}})
	}
	data, err := json.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".new", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
}

// fakeDCGM serves DCGM_FI_DEV_GPU_UTIL as NVIDIA's DCGM exporter does,
// labelled with each node's fake GPUs (gpu, UUID, device, Hostname):
// utilization util(node, i). It returns its address.
func fakeDCGM(t *testing.T, nodes []*harness.Node, util func(n, i int) int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge")
		for ni, n := range nodes {
			for i := range n.GPUs {
				fmt.Fprintf(w, "DCGM_FI_DEV_GPU_UTIL{gpu=\"%d\",UUID=\"%s\",device=\"nvidia%d\",modelName=\"Fake GPU\",Hostname=\"%s\"} %d\n", i, n.UUID(i), i, n.Name, util(ni, i))
			}
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// TestPrometheus: Debian's Prometheus scrapes nri-gpu and its DRA driver
// on both nodes, labelled as the chart's ServiceMonitor has them (job
// nri-gpu, node), with the chart's rules loaded and a DCGM-shaped
// exporter beside them. Asked through its HTTP API:
//   - which pod holds GPU 1 of node-a: an annotation pod; then a
//     device-plugin pod, then a claim pod, with node-a's other GPUs held
//     by another pod so that kubelet and the scheduler have GPU 1 alone
//     to give; each with its door (and claim);
//   - DCGM's utilization of that GPU joined on UUID: labelled with the
//     claim pod;
//   - the DRA driver's claims prepared and prepare results, and its
//     ResourceSlice following the pool within a second (p90);
//   - a shared GPU (GPU 2 of node-b shared 4 ways, through helm upgrade)
//     with two pods: 2 shares of 4 used, 2 free by the chart's recording
//     rule;
//   - every query of the chart's dashboard evaluates, and those of what
//     the cluster has return series.
func TestPrometheus(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	a, b := env.a, env.b
	nodes := []*harness.Node{a, b}
	util := func(n, i int) int { return 40 + 30*n + i }
	rules, err := filepath.Abs(chartDir + "/files/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.dir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	targets := filepath.Join(dir, "nri-gpu-targets.json")
	writeTargets(t, targets)
	prom, err := harness.StartPrometheus(dir, env.tools.Path(harness.PrometheusBinary),
		fmt.Sprintf(prometheusConfig, targets, fakeDCGM(t, nodes, util), rules))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prom.Stop)
	// query waits until expr's vector satisfies ok, and returns it.
	query := func(what, expr string, ok func(model.Vector) bool) model.Vector {
		t.Helper()
		var (
			vec  model.Vector
			last error
		)
		deadline := time.Now().Add(podWait)
		for {
			if vec, last = prom.Query(ctx, expr); last == nil && ok(vec) {
				return vec
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s gave %v (%v), not what was wanted, in %s; Prometheus's log ends:\n%s", what, expr, vec, last, podWait, prom.LogTail(10))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	one := func(v model.Vector) bool { return len(v) == 1 }
	// Both nodes' nri-gpu and DRA driver are scraped, labelled by node.
	query("nri-gpu and its DRA driver up on both nodes", `count by (node) (up{job="nri-gpu"} == 1)`, func(v model.Vector) bool {
		return len(v) == 2 && v[0].Value == 2 && v[1].Value == 2
	})

	// holder asks who holds GPU 1 of node-a, and checks it is pod, through
	// door (and claim).
	holder := func(pod, door, claim string) {
		t.Helper()
		v := query("the holder of GPU 1 of node-a", `nri_gpu_device_holder{node="`+a.Name+`",gpu="1"}`, func(v model.Vector) bool {
			return len(v) == 1 && string(v[0].Metric["pod"]) == pod
		})[0].Metric
		if v["door"] != model.LabelValue(door) || v["claim"] != model.LabelValue(claim) || v["UUID"] != model.LabelValue(a.UUID(1)) || v["namespace"] != "default" {
			t.Errorf("GPU 1 of node-a held by %v; want pod %s through %s (claim %q), UUID %s", v, pod, door, claim, a.UUID(1))
		}
		t.Logf("Prometheus: GPU 1 of node-a is held by %s/%s through %s %s", v["namespace"], v["pod"], v["door"], v["claim"])
	}

	createPod(t, gpuPod("default", "prom-annotation", 0, map[string]string{"gpus.nri-gpu.io": "1"}, a.Name))
	waitAllRunning(t, "default", "prom-annotation")
	holder("prom-annotation", "annotation", "")
	deletePod(t, "default", "prom-annotation")

	// The other GPUs held: kubelet and the scheduler have GPU 1 alone.
	var others []string
	for i := range a.GPUs {
		if i != 1 {
			others = append(others, fmt.Sprint(i))
		}
	}
	createPod(t, gpuPod("default", "prom-others", 0, map[string]string{"gpus.nri-gpu.io": strings.Join(others, ",")}, a.Name))
	waitAllRunning(t, "default", "prom-others")
	// A pod refused one of them, so that denials have series.
	createPod(t, gpuPod("default", "prom-refused", 0, map[string]string{"gpus.nri-gpu.io": "0"}, a.Name))
	refusedWith(t, "default", "prom-refused", "is held by pod default/prom-others")
	deletePod(t, "default", "prom-refused")
	query("the denial counted", `sum(nri_gpu_denials_total{node="`+a.Name+`",rule="exclusive"})`, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value >= 1
	})
	waitAllocatable(t, a, 1)
	createPod(t, scheduledOn(a, gpuPod("default", "prom-device-plugin", 1, nil, "")))
	waitAllRunning(t, "default", "prom-device-plugin")
	holder("prom-device-plugin", "device-plugin", "")
	deletePod(t, "default", "prom-device-plugin")

	waitSlice(t, a, "gpu-1")
	createTemplate(t, "default", "prom-gpu", harness.ClaimSpec(driverName, 1))
	createPod(t, claimPod("default", "prom-claim", a, "prom-gpu", ""))
	p := waitAllRunning(t, "default", "prom-claim")
	claim := allocatedClaim(t, p).Name
	holder("prom-claim", "dra", claim)

	// DCGM's series, joined on UUID, name the pod that holds the GPU.
	joined := query("DCGM's utilization joined with the holder", `DCGM_FI_DEV_GPU_UTIL * on (UUID, GPU_I_ID) group_right nri_gpu_device_holder{node="`+a.Name+`",gpu="1"}`, one)[0]
	if joined.Metric["pod"] != "prom-claim" || joined.Metric["claim"] != model.LabelValue(claim) || int(joined.Value) != util(0, 1) {
		t.Errorf("joined %v = %v; want pod prom-claim (claim %s) at DCGM's %d%%", joined.Metric, joined.Value, claim, util(0, 1))
	}
	t.Logf("Prometheus: DCGM_FI_DEV_GPU_UTIL of %s joined on UUID: %v = %v", a.UUID(1), joined.Metric, joined.Value)
	prepared := query("the DRA driver's claims prepared on node-a", `nri_gpu_dra_claims_prepared{node="`+a.Name+`"}`, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value >= 1
	})
	okPrepared := query("claims prepared ok on node-a", `sum(nri_gpu_dra_prepare_total{node="`+a.Name+`",result="ok"})`, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value >= 1
	})
	t.Logf("Prometheus: node-a's DRA driver holds %v claims prepared, prepared %v ok", prepared[0].Value, okPrepared[0].Value)
	// The slice followed the pool as the other doors' pods took GPUs.
	follow := query("the slice's follow time on node-a", `histogram_quantile(0.9, sum by (le) (nri_gpu_dra_slice_follow_seconds_bucket{node="`+a.Name+`"}))`, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value > 0 && v[0].Value <= 1
	})
	t.Logf("Prometheus: node-a's ResourceSlice followed the pool within %vs (p90)", follow[0].Value)

	// A GPU shared 4 ways, two pods on it.
	shared := valuesFile(t, "prom-shared-values.yaml", `config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=2"], replicas: 4}]
`)
	upgrade(t, env.values, shared)
	t.Cleanup(func() { upgrade(t, env.values) })
	for _, name := range []string{"prom-shared-1", "prom-shared-2"} {
		createPod(t, gpuPod("default", name, 0, map[string]string{"gpus.nri-gpu.io": "2"}, b.Name))
		waitAllRunning(t, "default", name)
	}
	sel := `{node="` + b.Name + `",gpu="2"}`
	query("2 shares of 4 used", `nri_gpu_device_shares_used`+sel+` / nri_gpu_device_shares`+sel, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value == 0.5
	})
	query("2 shares free (the chart's recording rule)", `nri_gpu:device_shares_free`+sel, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value == 2
	})
	query("two holders of the shared GPU", `count(nri_gpu_device_holder`+sel+`)`, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value == 2
	})

	dashboardQueries(t, prom)
}

// dashboardQueries runs every query of the chart's Grafana dashboard
// against prom, its node variable all nodes: each evaluates, and returns
// series but for the panels of what the cluster does not have (memory
// counted only with NVML or policy.sharing's memory; no MPS-shared GPU).
func dashboardQueries(t *testing.T, prom *harness.Prometheus) {
	t.Helper()
	data, err := os.ReadFile(chartDir + "/files/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	empty := map[string]bool{"Memory used per shared GPU": true, "MPS daemons": true}
	n := 0
	for _, p := range dash.Panels {
		// Every target evaluates; one at least has series (a counter
		// nothing has counted yet, unprepared claims, has none).
		testutil.Within(t, podWait, fmt.Sprintf("panel %q's queries", p.Title), func() bool {
			series := 0
			for _, target := range p.Targets {
				got, err := prom.Query(context.Background(), strings.ReplaceAll(target.Expr, "$node", ".*"))
				if err != nil {
					t.Logf("panel %q: %v", p.Title, err)
					return false
				}
				series += len(got)
			}
			return series > 0 || empty[p.Title]
		})
		n += len(p.Targets)
	}
	t.Logf("Prometheus: the dashboard's %d queries of %d panels evaluate", n, len(dash.Panels))
}
