// Package helm renders deploy/helm/nri-gpu as `helm template` does, with
// Helm's own chart loader and engine, for the default values and the
// multi-tenant ones, and checks the result: every manifest decodes
// strictly into its Kubernetes type, the configuration passes nri-gpu's
// own validation, and the DaemonSet matches the one the e2e suite runs
// (config/kubernetes/daemonset.yaml, TestDaemonSet) where it matters:
// args, mounts, volumes, securityContext, probes.
package helm

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

const chartDir = "../../../deploy/helm/nri-gpu"

// rendered is what the chart renders, by kind.
type rendered struct {
	daemonSet      appsv1.DaemonSet
	configMap      corev1.ConfigMap
	serviceAccount *corev1.ServiceAccount
	service        *corev1.Service
	serviceMonitor map[string]any
	// With metrics.prometheusRule.enabled and metrics.dashboard.enabled.
	prometheusRule map[string]any
	dashboard      *corev1.ConfigMap
	// The DRA driver's, with config.dra.enabled.
	clusterRole        *rbacv1.ClusterRole
	clusterRoleBinding *rbacv1.ClusterRoleBinding
	deviceClass        *resourceapi.DeviceClass
	// The events', with config.events.enabled.
	eventsRole        *rbacv1.ClusterRole
	eventsRoleBinding *rbacv1.ClusterRoleBinding
	// Where the cluster serves MutatingAdmissionPolicy.
	required        *admissionv1.MutatingAdmissionPolicy
	requiredBinding *admissionv1.MutatingAdmissionPolicyBinding
}

func render(t *testing.T, valuesFile string) rendered {
	t.Helper()
	return renderWith(t, valuesFile)
}

// renderWith renders as render does, for a cluster that serves the API
// versions given too (helm template's --api-versions).
func renderWith(t *testing.T, valuesFile string, apiVersions ...string) rendered {
	t.Helper()
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(caps.APIVersions, apiVersions...)
	return renderFor(t, valuesFile, caps)
}

// renderAt renders as render does, for a cluster of Kubernetes version.
func renderAt(t *testing.T, valuesFile, version string) rendered {
	t.Helper()
	caps := chartutil.DefaultCapabilities.Copy()
	v, err := chartutil.ParseKubeVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *v
	return renderFor(t, valuesFile, caps)
}

// renderFor renders as render does, for a cluster of those capabilities.
func renderFor(t *testing.T, valuesFile string, caps *chartutil.Capabilities) rendered {
	t.Helper()
	chart, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := chartutil.Values{}
	if valuesFile != "" {
		if vals, err = chartutil.ReadValuesFile(chartDir + "/" + valuesFile); err != nil {
			t.Fatal(err)
		}
	}
	rv, err := chartutil.ToRenderValues(chart, vals, chartutil.ReleaseOptions{Name: "nri-gpu", Namespace: "nri-gpu", IsInstall: true}, caps)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chart, rv)
	if err != nil {
		t.Fatal(err)
	}
	var r rendered
	for name, file := range files {
		if strings.HasSuffix(name, ".tpl") {
			continue
		}
		for _, text := range strings.Split(file, "\n---\n") {
			if strings.TrimSpace(text) == "" {
				continue
			}
			r.add(t, name, text)
		}
	}
	return r
}

// add decodes one rendered manifest into r, strictly.
func (r *rendered) add(t *testing.T, name, text string) {
	t.Helper()
	var head struct{ Kind string }
	if err := yaml.Unmarshal([]byte(text), &head); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var into any
	switch head.Kind {
	case "DaemonSet":
		into = &r.daemonSet
	case "ConfigMap":
		into = &r.configMap
		if strings.HasSuffix(name, "/dashboard.yaml") {
			r.dashboard = &corev1.ConfigMap{}
			into = r.dashboard
		}
	case "PrometheusRule":
		into = &r.prometheusRule
	case "Service":
		r.service = &corev1.Service{}
		into = r.service
	case "ServiceAccount":
		r.serviceAccount = &corev1.ServiceAccount{}
		into = r.serviceAccount
	case "ServiceMonitor":
		into = &r.serviceMonitor
	case "ClusterRole":
		role := &rbacv1.ClusterRole{}
		if strings.HasSuffix(name, "/events.yaml") {
			r.eventsRole = role
		} else {
			r.clusterRole = role
		}
		into = role
	case "ClusterRoleBinding":
		binding := &rbacv1.ClusterRoleBinding{}
		if strings.HasSuffix(name, "/events.yaml") {
			r.eventsRoleBinding = binding
		} else {
			r.clusterRoleBinding = binding
		}
		into = binding
	case "DeviceClass":
		r.deviceClass = &resourceapi.DeviceClass{}
		into = r.deviceClass
	case "MutatingAdmissionPolicy":
		r.required = &admissionv1.MutatingAdmissionPolicy{}
		into = r.required
	case "MutatingAdmissionPolicyBinding":
		r.requiredBinding = &admissionv1.MutatingAdmissionPolicyBinding{}
		into = r.requiredBinding
	default:
		t.Fatalf("%s: unexpected kind %q", name, head.Kind)
	}
	// Strict: a field the Kubernetes type does not have is an error.
	if err := yaml.UnmarshalStrict([]byte(text), into); err != nil {
		t.Fatalf("%s does not validate as a %s: %v\n%s", name, head.Kind, err, text)
	}
}

// tested returns the DaemonSet and ConfigMap the e2e suite runs.
func tested(t *testing.T) (appsv1.DaemonSet, corev1.ConfigMap) {
	t.Helper()
	data, err := os.ReadFile("../../../config/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	var cm corev1.ConfigMap
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "DaemonSet":
			err = yaml.UnmarshalStrict([]byte(doc), &ds)
		case "ConfigMap":
			err = yaml.UnmarshalStrict([]byte(doc), &cm)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return ds, cm
}

func parseConfig(t *testing.T, cm corev1.ConfigMap) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("the configuration does not pass nri-gpu's validation: %v\n%s", err, cm.Data["config.yaml"])
	}
	return cfg
}

func TestDefaultValuesMatchTheTestedDaemonSet(t *testing.T) {
	r := render(t, "")
	ds, cm := tested(t)
	if diff := cmp.Diff(parseConfig(t, cm), parseConfig(t, r.configMap)); diff != "" {
		t.Errorf("configuration (-tested +chart):\n%s", diff)
	}
	want, got := ds.Spec.Template.Spec, r.daemonSet.Spec.Template.Spec
	wc, gc := want.Containers[0], got.Containers[0]
	for _, c := range []struct {
		what       string
		want, have any
	}{
		{"args", wc.Args, gc.Args},
		{"volume mounts", wc.VolumeMounts, gc.VolumeMounts},
		{"securityContext", wc.SecurityContext, gc.SecurityContext},
		{"liveness probe", wc.LivenessProbe, gc.LivenessProbe},
		{"readiness probe", wc.ReadinessProbe, gc.ReadinessProbe},
		{"ports", wc.Ports, gc.Ports},
		{"termination message path", wc.TerminationMessagePath, gc.TerminationMessagePath},
		{"image", wc.Image, gc.Image},
		{"volumes", want.Volumes, got.Volumes},
		{"priority class", want.PriorityClassName, got.PriorityClassName},
		{"service account", want.ServiceAccountName, got.ServiceAccountName},
		{"service-account token", want.AutomountServiceAccountToken, got.AutomountServiceAccountToken},
		{"tolerations", want.Tolerations, got.Tolerations},
		{"update strategy", ds.Spec.UpdateStrategy, r.daemonSet.Spec.UpdateStrategy},
		{"nri-gpu's own toleration of a missing nri-gpu", ds.Spec.Template.Annotations["tolerate-missing-plugins.nri-gpu.io"],
			r.daemonSet.Spec.Template.Annotations["tolerate-missing-plugins.nri-gpu.io"]},
	} {
		if diff := cmp.Diff(c.want, c.have); diff != "" {
			t.Errorf("%s (-tested +chart):\n%s", c.what, diff)
		}
	}
	if r.service != nil || r.serviceMonitor != nil || r.prometheusRule != nil || r.dashboard != nil {
		t.Error("a metrics Service, ServiceMonitor, PrometheusRule or dashboard by default")
	}
}

func TestMultiTenantValues(t *testing.T) {
	r := render(t, "ci/multitenant-values.yaml")
	cfg := parseConfig(t, r.configMap)
	if !cfg.Policy.Exclusive || len(cfg.Start.DevicePlugin.Resources) != 1 || cfg.Start.DevicePlugin.KubeletDir != "/var/lib/kubelet/device-plugins" {
		t.Errorf("configuration %+v", cfg)
	}
	c := r.daemonSet.Spec.Template.Spec.Containers[0]
	mounted, podResources := false, false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.Name == "device-plugins" && m.MountPath == cfg.Start.DevicePlugin.KubeletDir && !m.ReadOnly)
		podResources = podResources || (m.MountPath == filepath.Dir(cfg.Start.DevicePlugin.PodResources) && m.ReadOnly)
	}
	if !mounted {
		t.Errorf("device-plugin mode without kubelet's device-plugin directory mounted read-write: %+v", c.VolumeMounts)
	}
	if !podResources {
		t.Errorf("device-plugin mode without kubelet's pod-resources directory mounted read-only where nri-gpu looks for it: %+v", c.VolumeMounts)
	}
	if r.service == nil || r.serviceMonitor == nil {
		t.Error("no metrics Service or ServiceMonitor though enabled")
	}
	if env := c.Env; len(env) < 2 || env[1].Value != "json" {
		t.Errorf("env %+v: want NRI_GPU_LOG_FORMAT=json", env)
	}
}

// TestSpecDirsMounted: each directory of config.cdiSpecDirs is mounted
// at its own path from the same host path, read-only, but for the last
// when nri-gpu generates specs into it: a directory set in the values is
// one nri-gpu can read.
func TestSpecDirsMounted(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		dirs         []string
		writable     string
	}{
		{"default", "", []string{"/etc/cdi", "/var/run/cdi"}, ""},
		{"one of the operator's", "ci/spec-dirs-values.yaml", []string{"/etc/cdi", "/opt/vendor/cdi"}, ""},
		{"generating into the last", "ci/generate-values.yaml", []string{"/etc/cdi", "/var/run/cdi"}, "/var/run/cdi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.values)
			if got := parseConfig(t, r.configMap).CDISpecDirs; !slices.Equal(got, tc.dirs) {
				t.Fatalf("cdiSpecDirs %v, want %v", got, tc.dirs)
			}
			spec := r.daemonSet.Spec.Template.Spec
			hostPath := map[string]string{}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					hostPath[v.Name] = v.HostPath.Path
				}
			}
			mounted := map[string]bool{}
			for _, m := range spec.Containers[0].VolumeMounts {
				if !slices.Contains(tc.dirs, m.MountPath) {
					continue
				}
				mounted[m.MountPath] = true
				if hostPath[m.Name] != m.MountPath {
					t.Errorf("%s is mounted from host path %q", m.MountPath, hostPath[m.Name])
				}
				if m.ReadOnly == (m.MountPath == tc.writable) {
					t.Errorf("%s mounted read-only: %v", m.MountPath, m.ReadOnly)
				}
			}
			for _, d := range tc.dirs {
				if !mounted[d] {
					t.Errorf("spec dir %s is not mounted", d)
				}
			}
		})
	}
}

// TestNoToken: with the events off (they are on by default) and no DRA
// driver, the chart's ServiceAccount, and its pod, mount no token, and
// the chart grants it no access (it makes no Role, ClusterRole or
// binding).
func TestNoToken(t *testing.T) {
	r := render(t, "ci/no-events-values.yaml")
	if parseConfig(t, r.configMap).Start.Events.Enabled {
		t.Error("events.enabled: false, and the configuration has them on")
	}
	if r.clusterRole != nil || r.clusterRoleBinding != nil || r.deviceClass != nil || r.eventsRole != nil || r.eventsRoleBinding != nil {
		t.Errorf("without DRA and events the chart makes %v, %v, %v, %v, %v", r.clusterRole, r.clusterRoleBinding, r.deviceClass, r.eventsRole, r.eventsRoleBinding)
	}
	if r.serviceAccount == nil || r.serviceAccount.AutomountServiceAccountToken == nil || *r.serviceAccount.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %+v: want one with automountServiceAccountToken false", r.serviceAccount)
	}
	spec := r.daemonSet.Spec.Template.Spec
	if spec.ServiceAccountName != r.serviceAccount.Name || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("pod service account %q (automount %v), want %q without a token", spec.ServiceAccountName, spec.AutomountServiceAccountToken, r.serviceAccount.Name)
	}
}

// TestDRAValues: with config.dra.enabled the chart gives the driver what
// it needs and no more: its token, NODE_NAME, kubelet's plugin directory
// of the driver and registration directory, a ClusterRole of exactly the
// driver's calls bound to the chart's account, and a DeviceClass
// selecting the driver's devices; the configuration passes nri-gpu's
// validation with the driver on.
func TestDRAValues(t *testing.T) {
	r := render(t, "ci/dra-values.yaml")
	cfg := parseConfig(t, r.configMap)
	if !cfg.Start.DRA.Enabled || cfg.Start.DRA.DriverName != "gpu.nri-gpu.io" {
		t.Errorf("dra config %+v", cfg.Start.DRA)
	}
	spec := r.daemonSet.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the pod mounts no token: the driver cannot reach the API server")
	}
	ctr := spec.Containers[0]
	if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("no NODE_NAME from spec.nodeName in %v", ctr.Env)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, dir := range []string{"/var/lib/kubelet/plugins/gpu.nri-gpu.io", "/var/lib/kubelet/plugins_registry"} {
		if name, ok := mounts[dir]; !ok || hostPaths[name] != dir {
			t.Errorf("%s: mounted as %q from %q", dir, name, hostPaths[name])
		}
	}
	if r.clusterRole == nil || r.clusterRoleBinding == nil || r.deviceClass == nil {
		t.Fatalf("ClusterRole %v, binding %v, DeviceClass %v", r.clusterRole, r.clusterRoleBinding, r.deviceClass)
	}
	var rules []string
	for _, rule := range r.clusterRole.Rules {
		rules = append(rules, strings.Join(rule.APIGroups, ",")+"/"+strings.Join(rule.Resources, ",")+": "+strings.Join(rule.Verbs, ","))
	}
	want := []string{
		"resource.k8s.io/resourceslices: get,list,watch,create,update,patch,delete",
		"resource.k8s.io/resourceclaims: get",
		"/pods: get,list,watch",
		"/nodes: get",
	}
	if diff := cmp.Diff(want, rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	b := r.clusterRoleBinding
	if b.RoleRef.Name != r.clusterRole.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != spec.ServiceAccountName || b.Subjects[0].Namespace != "nri-gpu" {
		t.Errorf("binding %+v does not bind the ClusterRole to the pod's account %q", b, spec.ServiceAccountName)
	}
	if sel := r.deviceClass.Spec.Selectors; r.deviceClass.Name != "gpu.nri-gpu.io" || len(sel) != 1 || sel[0].CEL.Expression != `device.driver == "gpu.nri-gpu.io"` {
		t.Errorf("DeviceClass %+v", r.deviceClass)
	}
	if e := r.deviceClass.Spec.ExtendedResourceName; e != nil {
		t.Errorf("DeviceClass serves extended resource %q unasked", *e)
	}
}

// TestDRAExtendedResourceValues: under NVIDIA's driver name the class is
// NVIDIA's (gpu.nvidia.com, which its published claims name) and, asked
// to, serves nvidia.com/gpu, with no device plugin registering it.
func TestDRAExtendedResourceValues(t *testing.T) {
	r := render(t, "ci/dra-extended-values.yaml")
	cfg := parseConfig(t, r.configMap)
	if cfg.Start.DRA.DriverName != "gpu.nvidia.com" || len(cfg.Start.DevicePlugin.Resources) > 0 {
		t.Errorf("dra %+v, device plugin resources %v", cfg.Start.DRA, cfg.Start.DevicePlugin.Resources)
	}
	c := r.deviceClass
	if c == nil || c.Name != "gpu.nvidia.com" || c.Spec.ExtendedResourceName == nil || *c.Spec.ExtendedResourceName != "nvidia.com/gpu" {
		t.Fatalf("DeviceClass %+v, want gpu.nvidia.com serving nvidia.com/gpu", c)
	}
	if sel := c.Spec.Selectors; len(sel) != 1 || sel[0].CEL.Expression != `device.driver == "gpu.nvidia.com"` {
		t.Errorf("selectors %+v", sel)
	}
}

// TestMPSValues: with a GPU shared with MPS the chart mounts the daemons'
// root at its host path (nri-gpu hands its directories to clients by
// that path) and, for daemons nri-gpu manages, adds CAP_SYS_ADMIN (each
// daemon's /dev/shm is mounted in a namespace of its own) and, with
// mps.hostRoot, CAP_SYS_CHROOT and the host's root read-only there with
// the daemons' root writable inside it; nothing else; without MPS,
// neither.
func TestMPSValues(t *testing.T) {
	for _, tc := range []struct {
		values, root string
		caps         []corev1.Capability
		mounts       map[string]string // mount path -> volume
	}{
		{"", "", []corev1.Capability{"KILL"}, nil},
		{"ci/multitenant-values.yaml", "", []corev1.Capability{"KILL"}, nil},
		{"ci/mps-values.yaml", "/run/nri-gpu-mps", []corev1.Capability{"KILL", "SYS_ADMIN", "SYS_CHROOT"},
			map[string]string{"/run/nri-gpu-mps": "mps", "/host": "host-root", "/host/run/nri-gpu-mps": "mps"}},
	} {
		r := render(t, tc.values)
		if cfg := parseConfig(t, r.configMap); len(cfg.Policy.Sharing) > 0 != (tc.root != "") {
			t.Fatalf("%s: sharing in the rendered config does not match the case", tc.values)
		}
		spec := r.daemonSet.Spec.Template.Spec
		hostPath := map[string]string{}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hostPath[v.Name] = v.HostPath.Path
			}
		}
		if hostPath["mps"] != tc.root || (tc.root != "" && hostPath["host-root"] != "/") {
			t.Errorf("%s: MPS root host path %q, host root %q; want %q and /", tc.values, hostPath["mps"], hostPath["host-root"], tc.root)
		}
		mounts := map[string]string{}
		for _, m := range spec.Containers[0].VolumeMounts {
			if m.Name == "mps" || m.Name == "host-root" {
				mounts[m.MountPath] = m.Name
				if m.ReadOnly != (m.Name == "host-root") {
					t.Errorf("%s: %s mounted read-only: %v", tc.values, m.MountPath, m.ReadOnly)
				}
			}
		}
		if len(tc.mounts) > 0 && !maps.Equal(mounts, tc.mounts) || len(tc.mounts) == 0 && len(mounts) > 0 {
			t.Errorf("%s: MPS mounts %v, want %v", tc.values, mounts, tc.mounts)
		}
		if !spec.HostPID {
			t.Errorf("%s: not in the host's PID namespace, where the containers nri-gpu stops run", tc.values)
		}
		caps := spec.Containers[0].SecurityContext.Capabilities
		if !slices.Equal(caps.Add, tc.caps) || !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities %+v, want %v added", tc.values, caps, tc.caps)
		}
	}
}

// TestV1Values: a configuration of version v1 (its start block) gets from
// the chart what the layout without version does: kubelet's device-plugin
// directory mounted and written into start.devicePlugin.kubeletDir, the
// DRA driver's token, RBAC and DeviceClass, the MPS root mounted, the
// last spec dir writable for generate.enabled; and nri-gpu reads it as v1.
func TestV1Values(t *testing.T) {
	r := render(t, "ci/v1-values.yaml")
	cfg := parseConfig(t, r.configMap)
	if cfg.Version != "v1" || !cfg.Generate.Enabled || !cfg.Start.DRA.Enabled || cfg.Start.MPS.Daemon != "managed" ||
		len(cfg.Start.DevicePlugin.Resources) != 1 || cfg.Start.DevicePlugin.KubeletDir != "/var/lib/kubelet/device-plugins" {
		t.Errorf("configuration %+v", cfg)
	}
	spec := r.daemonSet.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken || r.clusterRole == nil || r.deviceClass == nil {
		t.Error("DRA on in v1's start block, but no token, ClusterRole or DeviceClass")
	}
	mounts := map[string]bool{}
	for _, m := range spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = !m.ReadOnly
	}
	for path, writable := range map[string]bool{"/var/lib/kubelet/device-plugins": true, "/var/run/cdi": true, "/etc/cdi": false, "/run/nri-gpu/mps": true} {
		if w, ok := mounts[path]; !ok || w != writable {
			t.Errorf("%s mounted %v (writable %v), want writable %v", path, ok, w, writable)
		}
	}
}

// TestRequiredPlugin: where the cluster serves MutatingAdmissionPolicy,
// the chart annotates the pods that ask for devices through nri-gpu as
// requiring it: by its annotations, the configuration's device-plugin
// resources, and DRA claims where the driver is on; where the cluster
// does not, or requiredPlugin.enabled is false, nothing is rendered.
func TestRequiredPlugin(t *testing.T) {
	const api = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
	if r := render(t, ""); r.required != nil || r.requiredBinding != nil {
		t.Error("a policy rendered for a cluster that does not serve its API")
	}
	for _, tc := range []struct {
		values string
		want   []string
	}{
		{"", []string{`k.startsWith("gpus.nri-gpu.io")`, `k.startsWith("gpu-count.nri-gpu.io")`, `k.startsWith("cdi.k8s.io/")`, `r in []`}},
		{"ci/multitenant-values.yaml", []string{`r in ["nvidia.com/gpu"]`}},
		{"ci/dra-values.yaml", []string{"size(object.spec.resourceClaims) > 0"}},
	} {
		r := renderWith(t, tc.values, api)
		if r.required == nil || r.requiredBinding == nil || r.requiredBinding.Spec.PolicyName != r.required.Name {
			t.Fatalf("%s: policy %v, binding %v; want both, bound", tc.values, r.required, r.requiredBinding)
		}
		var conditions []string
		for _, c := range r.required.Spec.MatchConditions {
			conditions = append(conditions, c.Expression)
		}
		all := strings.Join(conditions, "\n")
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: the match conditions do not say %s:\n%s", tc.values, w, all)
			}
		}
		if m := r.required.Spec.Mutations; len(m) != 1 || !strings.Contains(m[0].ApplyConfiguration.Expression, `"required-plugins.noderesource.dev": "[\"nri-gpu\"]"`) {
			t.Errorf("%s: mutations %+v", tc.values, m)
		}
		if fp := r.required.Spec.FailurePolicy; fp == nil || *fp != admissionv1.Fail {
			t.Errorf("%s: failure policy %v, want Fail", tc.values, fp)
		}
	}
}

// TestEventsValues: with events on (the default, or config.events.enabled)
// the chart gives nri-gpu
// what posting its pod events needs and no more: its token, NODE_NAME,
// and a ClusterRole that creates events (nothing else) bound to the
// chart's account; no DRA role; the configuration passes nri-gpu's
// validation with the events on.
func TestEventsValues(t *testing.T) {
	for _, values := range []string{"", "ci/events-values.yaml"} {
		t.Run("values "+values, func(t *testing.T) { eventsValues(t, values) })
	}
}

// eventsValues checks what the chart renders from values (events on).
func eventsValues(t *testing.T, values string) {
	t.Helper()
	r := render(t, values)
	if cfg := parseConfig(t, r.configMap); !cfg.Start.Events.Enabled || cfg.Start.DRA.Enabled {
		t.Errorf("events %+v, DRA on %v", cfg.Start.Events, cfg.Start.DRA.Enabled)
	}
	spec := r.daemonSet.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the pod mounts no token: nri-gpu cannot post events")
	}
	if !slices.ContainsFunc(spec.Containers[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("no NODE_NAME from spec.nodeName in %v", spec.Containers[0].Env)
	}
	if r.clusterRole != nil || r.deviceClass != nil {
		t.Errorf("DRA's ClusterRole %v, DeviceClass %v without DRA", r.clusterRole, r.deviceClass)
	}
	if r.eventsRole == nil || r.eventsRoleBinding == nil {
		t.Fatalf("events ClusterRole %v, binding %v", r.eventsRole, r.eventsRoleBinding)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}}}
	if diff := cmp.Diff(want, r.eventsRole.Rules); diff != "" {
		t.Errorf("events rules (-want +chart):\n%s", diff)
	}
	b := r.eventsRoleBinding
	if b.RoleRef.Name != r.eventsRole.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != spec.ServiceAccountName || b.Subjects[0].Namespace != "nri-gpu" {
		t.Errorf("binding %+v: want role %s to the pod's account %s", b, r.eventsRole.Name, spec.ServiceAccountName)
	}
}

// TestGenerateValues: with generation on, an init container installs
// nri-gpu into hostPaths.hookDir on the host, and the generated specs'
// hooks name it there (--hook-path); a containerized driver's root is
// mounted read-only at its own path. Without generation and with driver
// root "/" there is none of it.
func TestGenerateValues(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		generate     bool
		driverRoot   string
	}{
		{name: "default", values: ""},
		{name: "generating from a containerized driver", values: "ci/generate-values.yaml", generate: true, driverRoot: "/run/nvidia/driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := render(t, tc.values).daemonSet.Spec.Template.Spec
			hostPath := map[string]string{}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					hostPath[v.Name] = v.HostPath.Path
				}
			}
			args := spec.Containers[0].Args
			hook := slices.Index(args, "--hook-path")
			if !tc.generate {
				if len(spec.InitContainers) != 0 || hook >= 0 || hostPath["hook-dir"] != "" || hostPath["driver-root"] != "" {
					t.Errorf("init containers %v, args %v, host paths %v: want none of the generator's", spec.InitContainers, args, hostPath)
				}
				return
			}
			if hook < 0 || hook+1 >= len(args) || args[hook+1] != "/opt/nri-gpu/bin/nri-gpu" {
				t.Errorf("args %v, want --hook-path /opt/nri-gpu/bin/nri-gpu", args)
			}
			if len(spec.InitContainers) != 1 {
				t.Fatalf("%d init containers, want the hook's installer", len(spec.InitContainers))
			}
			ic := spec.InitContainers[0]
			if !slices.Equal(ic.Args, []string{"install", "/opt/nri-gpu/bin"}) || ic.Image != spec.Containers[0].Image {
				t.Errorf("init container %s runs %s %v, want nri-gpu's image with install /opt/nri-gpu/bin", ic.Name, ic.Image, ic.Args)
			}
			if len(ic.VolumeMounts) != 1 || ic.VolumeMounts[0].MountPath != "/opt/nri-gpu/bin" || hostPath[ic.VolumeMounts[0].Name] != "/opt/nri-gpu/bin" {
				t.Errorf("init container mounts %v, want only the host's /opt/nri-gpu/bin at its path", ic.VolumeMounts)
			}
			if sc := ic.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 {
				t.Errorf("init container security context %+v, want unprivileged, no capability added", sc)
			}
			found := false
			for _, m := range spec.Containers[0].VolumeMounts {
				if m.MountPath == tc.driverRoot {
					found = true
					if !m.ReadOnly || hostPath[m.Name] != tc.driverRoot {
						t.Errorf("driver root mounted from %q, read-only %v; want the host's, read-only", hostPath[m.Name], m.ReadOnly)
					}
				}
			}
			if !found {
				t.Errorf("the driver root %s is not mounted", tc.driverRoot)
			}
		})
	}
}

// TestDRARollingUpdate: the DRA driver registers for kubelet's rolling
// update (the pod's UID, from the downward API, as POD_UID) where the API
// server is 1.36 or later, whose kubelets are 1.33 or later (the version
// skew policy), which have it; not on an older cluster, nor without DRA.
func TestDRARollingUpdate(t *testing.T) {
	for _, tc := range []struct {
		name, values, version string
		want                  bool
	}{
		{"DRA on 1.37", "ci/dra-values.yaml", "v1.37.2", true},
		{"DRA on 1.36", "ci/dra-values.yaml", "v1.36.0", true},
		{"DRA on 1.35", "ci/dra-values.yaml", "v1.35.4", false},
		{"no DRA on 1.37", "", "v1.37.2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := renderAt(t, tc.values, tc.version).daemonSet.Spec.Template.Spec.Containers[0].Env
			got := slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_UID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid"
			})
			if got != tc.want || slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == "POD_UID" }) != tc.want {
				t.Errorf("POD_UID from metadata.uid: %v, want %v (env %v)", got, tc.want, env)
			}
		})
	}
}

// TestHookFreeValues: the chart's hook-free node: hookFree on, and both
// doors handing the runtime's own CDI nothing (cdiDevices: nri-gpu), so
// that no hook reaches a GPU container whatever the runtime's CDI.
func TestHookFreeValues(t *testing.T) {
	cfg := parseConfig(t, render(t, "ci/hookfree-values.yaml").configMap)
	if !cfg.HookFree || cfg.Start.DevicePlugin.CDIDevices != config.CDINRIGPU || !cfg.Start.DRA.Enabled || cfg.Start.DRA.CDIDevices != config.CDINRIGPU {
		t.Errorf("hookFree %v, device plugin's cdiDevices %q, DRA on %v with cdiDevices %q; want hook-free, both nri-gpu",
			cfg.HookFree, cfg.Start.DevicePlugin.CDIDevices, cfg.Start.DRA.Enabled, cfg.Start.DRA.CDIDevices)
	}
}

// TestMonitoringValues: with ci/monitoring-values.yaml the chart serves
// the rules promtool tests (files/prometheus-rules.yaml, test/rules) as a
// PrometheusRule with the labels asked, the dashboard (its JSON whole,
// every panel's query as written) as a ConfigMap Grafana's sidecar loads,
// and a ServiceMonitor that labels nri-gpu's series job="nri-gpu" and
// with their node, as the rules and the dashboard read them.
func TestMonitoringValues(t *testing.T) {
	r := render(t, "ci/monitoring-values.yaml")
	if r.prometheusRule == nil || r.dashboard == nil || r.serviceMonitor == nil {
		t.Fatalf("PrometheusRule %v, dashboard %v, ServiceMonitor %v: want all three", r.prometheusRule != nil, r.dashboard != nil, r.serviceMonitor != nil)
	}
	raw, err := os.ReadFile(chartDir + "/files/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rules, r.prometheusRule["spec"]); diff != "" {
		t.Errorf("the PrometheusRule's spec is not the rule file (-file +chart):\n%s", diff)
	}
	labels, _ := r.prometheusRule["metadata"].(map[string]any)["labels"].(map[string]any)
	if labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v: want the ruleSelector's release: kube-prometheus-stack", labels)
	}
	dashboard, err := os.ReadFile(chartDir + "/files/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.dashboard.Data["nri-gpu.json"]; got != string(dashboard) {
		t.Errorf("the dashboard ConfigMap holds %d bytes, not the dashboard's %d", len(got), len(dashboard))
	}
	if r.dashboard.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v: want grafana_dashboard: \"1\"", r.dashboard.Labels)
	}
	relabel := []any{
		map[string]any{"targetLabel": "job", "replacement": "nri-gpu"},
		map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"},
	}
	var want []any
	for _, port := range []string{"metrics", "dra-metrics"} {
		want = append(want, map[string]any{"port": port, "interval": "30s", "relabelings": relabel})
	}
	if diff := cmp.Diff(want, r.serviceMonitor["spec"].(map[string]any)["endpoints"]); diff != "" {
		t.Errorf("ServiceMonitor endpoints (-want +chart):\n%s", diff)
	}
	// The DRA driver serves its metrics on metrics.draPort, a port of the
	// container and the Service.
	if got := parseConfig(t, r.configMap).Start.DRA.MetricsAddress; got != ":9465" {
		t.Errorf("dra.metricsAddress %q, want :9465", got)
	}
	var ports []string
	for _, p := range r.daemonSet.Spec.Template.Spec.Containers[0].Ports {
		ports = append(ports, fmt.Sprintf("%s:%d", p.Name, p.ContainerPort))
	}
	for _, p := range r.service.Spec.Ports {
		ports = append(ports, fmt.Sprintf("service %s:%d->%s", p.Name, p.Port, p.TargetPort.String()))
	}
	wantPorts := []string{"metrics:9464", "dra-metrics:9465", "service metrics:9464->metrics", "service dra-metrics:9465->dra-metrics"}
	if !slices.Equal(ports, wantPorts) {
		t.Errorf("ports %v, want %v", ports, wantPorts)
	}
}

// TestRelayValues: with the device plugin on, on a cluster of 1.36 or
// later, kubelet's endpoint is the relay container's: it runs nri-gpu
// relay with the configuration, mounts kubelet's device-plugin directory
// and the relay directory from the host (where the nri-gpu of either pod
// of a rolling update serves), with no capability; nri-gpu serves its
// device plugin there (start.devicePlugin.relay) and mounts kubelet's
// directory no more. On 1.35, with the relay off, or with no device
// plugin, there is no relay container and nri-gpu registers itself.
func TestRelayValues(t *testing.T) {
	for _, tc := range []struct {
		name, values, version string
		want                  bool
	}{
		{"device plugin on 1.37", "ci/multitenant-values.yaml", "v1.37.2", true},
		{"device plugin on 1.36", "ci/multitenant-values.yaml", "v1.36.0", true},
		{"device plugin on 1.35", "ci/multitenant-values.yaml", "v1.35.4", false},
		{"relay off", "ci/no-relay-values.yaml", "v1.37.2", false},
		{"no device plugin", "", "v1.37.2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := renderAt(t, tc.values, tc.version)
			spec := r.daemonSet.Spec.Template.Spec
			relayDir := parseConfig(t, r.configMap).Start.DevicePlugin.Relay
			mounts := func(c corev1.Container) map[string]string {
				out := map[string]string{}
				for _, m := range c.VolumeMounts {
					out[m.MountPath] = m.Name
				}
				return out
			}
			hostPath := map[string]string{}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					hostPath[v.Name] = v.HostPath.Path
				}
			}
			nriGPU := mounts(spec.Containers[0])
			_, registers := nriGPU["/var/lib/kubelet/device-plugins"]
			if !tc.want {
				if len(spec.Containers) != 1 || relayDir != "" || registers != (tc.values != "") {
					t.Errorf("%d containers, relay %q, nri-gpu mounts kubelet's directory %v: want nri-gpu alone, registering itself where the device plugin is on", len(spec.Containers), relayDir, registers)
				}
				return
			}
			if len(spec.Containers) != 2 || spec.Containers[1].Name != "relay" {
				t.Fatalf("containers %d: want nri-gpu and relay", len(spec.Containers))
			}
			if a := r.daemonSet.Spec.Template.Annotations["kubectl.kubernetes.io/default-container"]; a != "nri-gpu" {
				t.Errorf("default container %q, want nri-gpu", a)
			}
			relay := spec.Containers[1]
			if !slices.Equal(relay.Args, []string{"relay", "--config", "/etc/nri-gpu/config.yaml"}) || relay.Image != spec.Containers[0].Image {
				t.Errorf("relay runs %s %v", relay.Image, relay.Args)
			}
			if sc := relay.SecurityContext; sc == nil || len(sc.Capabilities.Add) != 0 || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || *sc.Privileged || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("relay's security context %+v", sc)
			}
			rm := mounts(relay)
			if relayDir != "/run/nri-gpu/device-plugin" || hostPath[rm[relayDir]] != relayDir || hostPath[rm["/var/lib/kubelet/device-plugins"]] != "/var/lib/kubelet/device-plugins" || rm["/etc/nri-gpu"] != "config" {
				t.Errorf("relay dir %q; relay mounts %v (host paths %v)", relayDir, rm, hostPath)
			}
			if registers {
				t.Error("nri-gpu mounts kubelet's device-plugin directory beside the relay")
			}
			if hostPath[nriGPU["/run/nri-gpu"]] != "/run/nri-gpu" {
				t.Errorf("nri-gpu does not see the relay directory: mounts %v", nriGPU)
			}
		})
	}
}
