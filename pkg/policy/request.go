package policy

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	nriplugin "github.com/containerd/nri/pkg/plugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

const (
	// AnnotationKey is the pod annotation that requests devices, in its
	// plain form; /pod and /container.<name> scope it.
	AnnotationKey = config.KeyNRIGPU
	// CountAnnotationKey is the pod annotation that asks for a number of
	// devices of the default kind, chosen by nri-gpu among the free ones.
	CountAnnotationKey = "gpu-count.nri-gpu.io"
	// NVIDIAAnnotationKey is the pod annotation of NVIDIA's NRI plugin (in
	// the NVIDIA Container Toolkit): qualified CDI names only, in its
	// plain, /pod and /container.<name> forms. nri-gpu reads it when the
	// configuration's annotationKeys lists it.
	NVIDIAAnnotationKey = config.KeyNVIDIA
	// maxCount bounds a count request.
	maxCount = 1024
	// AllDevice is the device name that stands for all devices of a kind.
	AllDevice = "all"
	// maxItemLen bounds one request item, so that errors stay readable.
	maxItemLen = 256
	// maxItems bounds the devices one annotation may name, and the
	// devices a container may ask for through all its annotations and
	// its CRI request together.
	maxItems = 256
	// DevicePluginName names nri-gpu's device plugin in the cdi.k8s.io
	// container annotations it has kubelet write for the devices kubelet
	// allocated a container: cdi.k8s.io/nri-gpu_<resource>.
	DevicePluginName = "nri-gpu"
)

// kubeletAnnotationPrefix starts the keys of DevicePluginName's
// annotations.
const kubeletAnnotationPrefix = "cdi.k8s.io/" + DevicePluginName + "_"

// DevicePluginAnnotationPrefix starts the key of the container annotation
// nri-gpu's device plugin has kubelet write with cdiDevices: nri-gpu
// (devices.nri-gpu.io/nvidia.com_gpu: nvidia.com/gpu=0): the devices
// kubelet allocated, as a cdi.k8s.io annotation lists them, but under a
// key no runtime's own CDI reads, so that nri-gpu alone injects them.
// It is read whatever honorCDIAnnotations says, as cdi.k8s.io/nri-gpu_*
// is.
const DevicePluginAnnotationPrefix = "devices.nri-gpu.io/"

// DevicePluginAnnotation returns the key of that annotation for an
// extended resource ("nvidia.com/gpu": devices.nri-gpu.io/nvidia.com_gpu).
func DevicePluginAnnotation(resource string) string {
	return DevicePluginAnnotationPrefix + strings.ReplaceAll(resource, "/", "_")
}

// ErrInvalidRequest is wrapped by every error about a malformed request.
var ErrInvalidRequest = errors.New("invalid device request")

// Origin tells where a request came from.
type Origin int

const (
	// OriginPod is a gpus.nri-gpu.io pod annotation.
	OriginPod Origin = iota
	// OriginCDI is a cdi.k8s.io/* container annotation.
	OriginCDI
	// OriginRuntime is a CDI device the runtime reports it injects itself
	// (the CDI devices of the CRI request, which kubelet fills from
	// device plugins and DRA drivers). It is held like any other, and
	// injected by the runtime, not by nri-gpu.
	OriginRuntime
)

// Request is one device that a container asks for.
type Request struct {
	// Device is the qualified CDI name (vendor/class=name).
	Device string
	// Item is the request as written in the annotation.
	Item string
	// Key is the annotation key the request came from.
	Key string
	// Origin tells whether Key is a pod or a container annotation, or
	// the runtime's own CDI devices.
	Origin Origin
}

// FromKubelet reports whether kubelet allocated the device: it came
// through the CRI request's CDI devices, or through the annotation of
// nri-gpu's device plugin (on Kubernetes only kubelet writes a
// container's annotations).
func (r Request) FromKubelet() bool {
	return r.Origin == OriginRuntime || (r.Origin == OriginCDI && devicePluginKey(r.Key))
}

// devicePluginKey reports whether a container annotation key is one of
// nri-gpu's device plugin: cdi.k8s.io/nri-gpu_* or devices.nri-gpu.io/*.
func devicePluginKey(key string) bool {
	return strings.HasPrefix(key, kubeletAnnotationPrefix) || strings.HasPrefix(key, DevicePluginAnnotationPrefix)
}

// String describes the request for error messages.
func (r Request) String() string {
	if r.Origin == OriginRuntime {
		return fmt.Sprintf("CDI device %q of the container's CRI request", r.Device)
	}
	kind := "pod annotation"
	if r.Origin == OriginCDI {
		kind = "container annotation"
	}
	if r.Item == r.Device {
		return fmt.Sprintf("%s %q request %q", kind, r.Key, r.Item)
	}
	return fmt.Sprintf("%s %q request %q (%s)", kind, r.Key, r.Item, r.Device)
}

// Container is what the policy needs to know of a container being created.
type Container struct {
	// Namespace and Pod name the pod (sandbox) of the container.
	Namespace, Pod string
	// Name is the container's name within its pod.
	Name string
	// PodAnnotations are the pod's annotations.
	PodAnnotations map[string]string
	// Annotations are the container's own annotations.
	Annotations map[string]string
	// CDIDevices are the CDI devices the runtime reports it injects itself
	// (NRI's Container.CDIDevices, on containerd 2.x).
	CDIDevices []string
}

// Ask is everything a container asks for.
type Ask struct {
	// Requests are the named devices, each once.
	Requests []Request
	// Count is the number of devices of the default kind asked for with
	// gpu-count.nri-gpu.io; 0 when not asked.
	Count int
}

// Empty reports whether nothing is asked for.
func (a Ask) Empty() bool { return len(a.Requests) == 0 && a.Count == 0 }

// Parser turns annotations into requests.
type Parser struct {
	vendor, class string
	honorCDI      bool
	// keys are the pod annotation keys read (AnnotationKey,
	// NVIDIAAnnotationKey), in their plain, /pod and /container.<name>
	// forms.
	keys []string
}

// NewParser returns a parser that resolves short names against kind
// (vendor/class), reads the pod annotation keys given (of a validated
// configuration's annotationKeys; none: AnnotationKey) and, when honorCDI
// is true, cdi.k8s.io/* container annotations too.
func NewParser(kind string, honorCDI bool, keys ...string) (*Parser, error) {
	vendor, class, err := config.ParseKind(kind)
	if err != nil {
		return nil, fmt.Errorf("default %w", err)
	}
	if len(keys) == 0 {
		keys = []string{AnnotationKey}
	}
	return &Parser{vendor: vendor, class: class, honorCDI: honorCDI, keys: slices.Clone(keys)}, nil
}

// Parse returns what a container asks for, named requests merged so that
// each device appears once, in the order first asked. A container that
// asks for nothing gets an empty Ask and no error.
func (p *Parser) Parse(c Container) (Ask, error) {
	var ask Ask
	if value, ok := c.PodAnnotations[CountAnnotationKey]; ok {
		n, err := parseCount(value)
		if err != nil {
			return Ask{}, fmt.Errorf("pod annotation %q: %w: %w", CountAnnotationKey, ErrInvalidRequest, err)
		}
		if k := namedKey(c.PodAnnotations, p.keys); k != "" {
			return Ask{}, fmt.Errorf("pod annotations %q and %q: %w: ask for a count or for named devices, not both",
				CountAnnotationKey, k, ErrInvalidRequest)
		}
		ask.Count = n
	}
	reqs, err := p.parseNamed(c)
	if err != nil {
		return Ask{}, err
	}
	ask.Requests = reqs
	return ask, nil
}

// parseCount reads a count: a whole number from 1 to maxCount.
func parseCount(value string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(value))
	if err != nil || n < 1 || n > maxCount {
		return 0, fmt.Errorf("%q is not a whole number from 1 to %d", truncate(value), maxCount)
	}
	return n, nil
}

// namedKey returns a pod annotation key (of those read) that names
// devices, if any.
func namedKey(annotations map[string]string, read []string) string {
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		for _, r := range read {
			if k == r || strings.HasPrefix(k, r+"/") {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

func (p *Parser) parseNamed(c Container) ([]Request, error) {
	if k := scopedKey(c.PodAnnotations, p.keys); c.Name == "" && k != "" {
		return nil, fmt.Errorf("pod annotation %q asks per container, and the runtime named this container none (CRI-O names a container to NRI by kubelet's io.kubernetes.container.name label): %w: whether it is the container asked for cannot be told", k, ErrInvalidRequest)
	}
	var reqs []Request
	pod := &api.PodSandbox{Annotations: c.PodAnnotations}
	for _, k := range p.keys {
		value, ok := nriplugin.GetEffectiveAnnotation(pod, k, c.Name)
		if !ok {
			continue
		}
		r, err := p.parsePodValue(k, effectiveKey(c.PodAnnotations, k, c.Name, value), value)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r...)
	}
	r, err := parseContainerAnnotations(c.Annotations, p.honorCDI)
	if err != nil {
		return nil, err
	}
	reqs = append(reqs, r...)
	if len(c.CDIDevices) > maxItems {
		return nil, fmt.Errorf("CDI devices of the container's CRI request: %w: %d, more than %d", ErrInvalidRequest, len(c.CDIDevices), maxItems)
	}
	if n := len(reqs) + len(c.CDIDevices); n > maxItems {
		return nil, fmt.Errorf("the container's annotations and CRI request: %w: %d devices asked for, more than %d", ErrInvalidRequest, n, maxItems)
	}
	for _, d := range c.CDIDevices {
		if _, _, _, err := parser.ParseQualifiedName(d); err != nil {
			return nil, fmt.Errorf("CDI device %q of the container's CRI request: %w: %w", truncate(d), ErrInvalidRequest, err)
		}
		reqs = append(reqs, Request{Device: d, Item: d, Origin: OriginRuntime})
	}
	return dedup(reqs), nil
}

// scopedKey returns a pod annotation key (of those read) scoped to a
// container ("<key>/container.<name>"), if any.
func scopedKey(annotations map[string]string, read []string) string {
	var keys []string
	for k := range annotations {
		for _, r := range read {
			if strings.HasPrefix(k, r+"/container.") {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// effectiveKey names the annotation key whose value GetEffectiveAnnotation
// returned, for error messages; the precedence itself is NRI's.
func effectiveKey(annotations map[string]string, base, container, value string) string {
	for _, k := range []string{
		base + "/container." + container,
		base + "/pod",
	} {
		if v, ok := annotations[k]; ok && v == value {
			return k
		}
	}
	return base
}

// parsePodValue reads the value of a pod annotation of base (AnnotationKey
// or NVIDIAAnnotationKey), found under key. NVIDIA's takes qualified
// names only, as NVIDIA's NRI plugin does.
func (p *Parser) parsePodValue(base, key, value string) ([]Request, error) {
	if n := strings.Count(value, ",") + 1; n > maxItems {
		return nil, fmt.Errorf("pod annotation %q: %w: %d items, more than %d", key, ErrInvalidRequest, n, maxItems)
	}
	var reqs []Request
	for i, raw := range strings.Split(value, ",") {
		item := strings.TrimSpace(raw)
		device, err := p.qualify(item)
		if err == nil && base == NVIDIAAnnotationKey && device != item {
			err = fmt.Errorf("%s takes qualified CDI names (vendor/class=name) only, as NVIDIA's NRI plugin does", NVIDIAAnnotationKey)
		}
		if err != nil {
			return nil, fmt.Errorf("pod annotation %q, item %d %q: %w: %w",
				key, i+1, truncate(item), ErrInvalidRequest, err)
		}
		reqs = append(reqs, Request{Device: device, Item: item, Key: key, Origin: OriginPod})
	}
	return reqs, nil
}

// qualify turns one request item into a qualified CDI name.
func (p *Parser) qualify(item string) (string, error) {
	switch {
	case item == "":
		return "", errors.New("empty device name")
	case len(item) > maxItemLen:
		return "", fmt.Errorf("device name is %d bytes long, more than %d", len(item), maxItemLen)
	}
	if vendor, _, _ := parser.ParseDevice(item); vendor != "" || strings.ContainsAny(item, "/=") {
		if _, _, _, err := parser.ParseQualifiedName(item); err != nil {
			return "", err
		}
		return item, nil
	}
	if err := parser.ValidateDeviceName(item); err != nil {
		return "", err
	}
	return parser.QualifiedName(p.vendor, p.class, item), nil
}

// parseContainerAnnotations reads the container annotations that name
// devices: those of nri-gpu's device plugin (devices.nri-gpu.io/* and
// cdi.k8s.io/nri-gpu_*, kubelet's allocation, whatever honorCDI says)
// and, when honorCDI, every other cdi.k8s.io/*, with CDI's own parser
// (devices.nri-gpu.io/* as if under cdi.k8s.io/), one key at a time (in
// sorted order) so that errors name the key.
func parseContainerAnnotations(annotations map[string]string, honorCDI bool) ([]Request, error) {
	var keys []string
	for k := range annotations {
		if devicePluginKey(k) || (honorCDI && strings.HasPrefix(k, cdi.AnnotationPrefix)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var reqs []Request
	for _, k := range keys {
		if n := strings.Count(annotations[k], ",") + 1; n > maxItems-len(reqs) {
			if len(reqs) == 0 {
				return nil, fmt.Errorf("container annotation %q: %w: %d items, more than %d", k, ErrInvalidRequest, n, maxItems)
			}
			return nil, fmt.Errorf("container annotations %s* and %s*: %w: more than %d items together",
				cdi.AnnotationPrefix, DevicePluginAnnotationPrefix, ErrInvalidRequest, maxItems)
		}
		cdiKey := k
		if name, ok := strings.CutPrefix(k, DevicePluginAnnotationPrefix); ok {
			cdiKey = cdi.AnnotationPrefix + name
		}
		_, devices, err := cdi.ParseAnnotations(map[string]string{cdiKey: annotations[k]})
		if err != nil {
			return nil, fmt.Errorf("container annotation %q: %w: %w", k, ErrInvalidRequest, err)
		}
		for _, d := range devices {
			reqs = append(reqs, Request{Device: d, Item: d, Key: k, Origin: OriginCDI})
		}
	}
	return reqs, nil
}

// dedup keeps the first request for each device.
func dedup(reqs []Request) []Request {
	seen := map[string]bool{}
	var out []Request
	for _, r := range reqs {
		if !seen[r.Device] {
			seen[r.Device] = true
			out = append(out, r)
		}
	}
	return out
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
