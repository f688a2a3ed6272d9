package dra_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

const (
	driver = "gpu.nri-gpu.io"
	node   = "node-1"
)

// claim is a claim of ns allocated devices of driver in pool, reserved
// for the pods with the given UIDs.
func claim(name, uid, drv, pool string, reservedFor ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpus", Driver: drv, Pool: pool, Device: "gpu-0"}},
	}}
	for _, u := range reservedFor {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: types.UID(u)})
	}
	return c
}

// pod is pod ns/p (UID pod-uid) whose containers use claims: container
// name -> its resources.claims.
func pod(claims []corev1.PodResourceClaim, statuses []corev1.PodResourceClaimStatus, containers map[string][]corev1.ResourceClaim, init map[string][]corev1.ResourceClaim) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "pod-uid"}, Spec: corev1.PodSpec{NodeName: node, ResourceClaims: claims}}
	p.Status.ResourceClaimStatuses = statuses
	for name, cs := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Claims: cs}})
	}
	for name, cs := range init {
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Claims: cs}})
	}
	return p
}

func ptr(s string) *string { return &s }

func TestUses(t *testing.T) {
	byName := []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("mine")}}
	fromTemplate := []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr("one-gpu")}}
	uses := map[string][]corev1.ResourceClaim{"gpu": {{Name: "gpu"}}, "plain": nil}
	mine := claim("mine", "uid-1", driver, node, "pod-uid")
	tests := []struct {
		name      string
		objects   []runtime.Object
		ref       link.PodRef
		container string
		want      []link.ClaimUse
		wantErr   error
		errSays   string
	}{{
		name:      "a container using a claim by name",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), mine},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-1", Namespace: "ns", Name: "mine"}},
	}, {
		name:      "a container of the pod that uses no claim",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), mine},
		container: "plain",
	}, {
		name:      "a container the pod does not have",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), mine},
		container: "other",
	}, {
		name: "a claim made from a template, named in the pod's status",
		objects: []runtime.Object{
			pod(fromTemplate, []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr("p-gpu-x")}}, uses, nil),
			withOwner(claim("p-gpu-x", "uid-2", driver, node, "pod-uid"), "pod-uid"),
		},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-2", Namespace: "ns", Name: "p-gpu-x"}},
	}, {
		name: "a claim made from a template for another pod",
		objects: []runtime.Object{
			pod(fromTemplate, []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr("p-gpu-x")}}, uses, nil),
			withOwner(claim("p-gpu-x", "uid-2", driver, node, "pod-uid"), "other-uid"),
		},
		container: "gpu",
		errSays:   "was not created for Pod ns/p",
	}, {
		name:      "a template claim the pod does not need (no name in its status)",
		objects:   []runtime.Object{pod(fromTemplate, []corev1.PodResourceClaimStatus{{Name: "gpu"}}, uses, nil)},
		container: "gpu",
	}, {
		name: "a container of several claims: one not needed, one of another driver, one ours",
		objects: []runtime.Object{
			pod([]corev1.PodResourceClaim{{Name: "spare", ResourceClaimTemplateName: ptr("t")}, {Name: "nic", ResourceClaimName: ptr("nic")}, {Name: "gpu", ResourceClaimName: ptr("mine")}},
				[]corev1.PodResourceClaimStatus{{Name: "spare"}}, map[string][]corev1.ResourceClaim{"gpu": {{Name: "spare"}, {Name: "nic"}, {Name: "gpu"}}}, nil),
			claim("nic", "uid-nic", "nic.example.com", node, "pod-uid"), mine,
		},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-1", Namespace: "ns", Name: "mine"}},
	}, {
		name:      "one request of the claim",
		objects:   []runtime.Object{pod(byName, nil, map[string][]corev1.ResourceClaim{"gpu": {{Name: "gpu", Request: "big"}}}, nil), mine},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-1", Namespace: "ns", Name: "mine", Requests: []string{"big"}}},
	}, {
		name:      "an init container",
		objects:   []runtime.Object{pod(byName, nil, nil, uses), mine},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-1", Namespace: "ns", Name: "mine"}},
	}, {
		name:      "a claim of another driver",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), claim("mine", "uid-1", "gpu.nvidia.com", node, "pod-uid")},
		container: "gpu",
	}, {
		name:      "a claim allocated on another node",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), claim("mine", "uid-1", driver, "node-2", "pod-uid")},
		container: "gpu",
	}, {
		name:      "a claim not allocated",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns"}}},
		container: "gpu",
	}, {
		name:      "a claim not reserved for the pod",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), claim("mine", "uid-1", driver, node, "someone-else")},
		container: "gpu",
		wantErr:   link.ErrNotReserved,
		errSays:   "claim ns/mine: not reserved for the pod ns/p",
	}, {
		// Claims of a PodGroup (DRAWorkloadResourceClaims, alpha) are
		// not taken: only a claim made for the pod and reserved for it.
		name: "a claim made for the pod's PodGroup, not the pod",
		objects: []runtime.Object{
			inGroup(pod(fromTemplate, []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr("g-gpu-x")}}, uses, nil)),
			groupOwned(claim("g-gpu-x", "uid-3", driver, node, "pod-uid")),
		},
		container: "gpu",
		errSays:   "was not created for Pod ns/p",
	}, {
		name:      "a claim reserved for the pod's PodGroup, not the pod",
		objects:   []runtime.Object{inGroup(pod(byName, nil, uses, nil)), groupReserved(claim("mine", "uid-1", driver, node))},
		container: "gpu",
		wantErr:   link.ErrNotReserved,
	}, {
		// limits: nvidia.com/gpu: 1 where a DeviceClass maps it to DRA:
		// the claim kube-scheduler made the pod, and which of its
		// requests serve which container, are in the pod's status.
		name: "extended resources: the container's requests of the pod's claim",
		objects: []runtime.Object{
			extended(pod(nil, nil, map[string][]corev1.ResourceClaim{"gpu": nil, "plain": nil}, nil), "gpu", "container-0-request-0", "other", "container-1-request-0"),
			withOwner(claim("p-extended-resources-x", "uid-4", driver, node, "pod-uid"), "pod-uid"),
		},
		container: "gpu",
		want:      []link.ClaimUse{{UID: "uid-4", Namespace: "ns", Name: "p-extended-resources-x", Requests: []string{"container-0-request-0"}}},
	}, {
		name: "extended resources of another container",
		objects: []runtime.Object{
			extended(pod(nil, nil, map[string][]corev1.ResourceClaim{"gpu": nil, "plain": nil}, nil), "gpu", "container-0-request-0"),
			withOwner(claim("p-extended-resources-x", "uid-4", driver, node, "pod-uid"), "pod-uid"),
		},
		container: "plain",
	}, {
		name: "extended resources: a claim the status names that was made for another pod",
		objects: []runtime.Object{
			extended(pod(nil, nil, map[string][]corev1.ResourceClaim{"gpu": nil}, nil), "gpu", "container-0-request-0"),
			withOwner(claim("p-extended-resources-x", "uid-4", driver, node, "pod-uid"), "other-uid"),
		},
		container: "gpu",
		errSays:   "was not created for Pod ns/p",
	}, {
		name: "extended resources: a claim not reserved for the pod",
		objects: []runtime.Object{
			extended(pod(nil, nil, map[string][]corev1.ResourceClaim{"gpu": nil}, nil), "gpu", "container-0-request-0"),
			withOwner(claim("p-extended-resources-x", "uid-4", driver, node), "pod-uid"),
		},
		container: "gpu",
		wantErr:   link.ErrNotReserved,
	}, {
		name:      "a claim that is gone",
		objects:   []runtime.Object{pod(byName, nil, uses, nil)},
		container: "gpu",
		errSays:   `pod ns/p claim "gpu"`,
	}, {
		name:      "a pod the API server does not have",
		container: "gpu",
		errSays:   "pod ns/p",
	}, {
		name:      "a pod of the name, but not the runtime's (another UID)",
		objects:   []runtime.Object{pod(byName, nil, uses, nil), mine},
		ref:       link.PodRef{Namespace: "ns", Name: "p", UID: "old-uid"},
		container: "gpu",
		errSays:   "the API server has UID pod-uid, the runtime's sandbox old-uid",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := dra.NewFinder(ctx, fake.NewClientset(tc.objects...), driver, node)
			ref := tc.ref
			if ref.Name == "" {
				ref = link.PodRef{Namespace: "ns", Name: "p", UID: "pod-uid"}
			}
			got, err := f.Uses(ctx, ref, tc.container)
			if tc.errSays != "" || tc.wantErr != nil {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errSays) {
					t.Fatalf("error %v, want one saying %q (%v)", err, tc.errSays, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("uses (-want +got):\n%s", diff)
			}
		})
	}
}

// extended gives p the claim kube-scheduler makes for its extended
// resources, p-extended-resources-x, mapping containers to requests
// (container, request, ...).
func extended(p *corev1.Pod, mappings ...string) *corev1.Pod {
	st := &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "p-extended-resources-x"}
	for i := 0; i+1 < len(mappings); i += 2 {
		st.RequestMappings = append(st.RequestMappings, corev1.ContainerExtendedResourceRequest{ContainerName: mappings[i], ResourceName: "nvidia.com/gpu", RequestName: mappings[i+1]})
	}
	p.Status.ExtendedResourceClaimStatus = st
	return p
}

func withOwner(c *resourceapi.ResourceClaim, podUID string) *resourceapi.ResourceClaim {
	yes := true
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: types.UID(podUID), Controller: &yes}}
	return c
}

// inGroup puts pod in PodGroup "group".
func inGroup(p *corev1.Pod) *corev1.Pod {
	p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr("group")}
	return p
}

// groupOwned has PodGroup "group" control c, as for a claim made from
// the group's template.
func groupOwned(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	yes := true
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "scheduling.k8s.io/v1beta1", Kind: "PodGroup", Name: "group", UID: "group-uid", Controller: &yes}}
	return c
}

// groupReserved reserves c for PodGroup "group".
func groupReserved(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "group", UID: "group-uid"})
	return c
}

// TestUsesFromTheWatch: the finder reads the node's pods from its watch,
// asking the API server only for a pod the watch does not have as the
// runtime's (another UID): creating containers costs the API server no
// pod reads.
func TestUsesFromTheWatch(t *testing.T) {
	p := pod([]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("mine")}}, nil, map[string][]corev1.ResourceClaim{"gpu": {{Name: "gpu"}}}, nil)
	client := fake.NewClientset(p, claim("mine", "uid-1", driver, node, "pod-uid"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := dra.NewFinder(ctx, client, driver, node)
	podGets := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
				n++
			}
		}
		return n
	}
	ref := link.PodRef{Namespace: "ns", Name: "p", UID: "pod-uid"}
	// Until the watch has the pod, the finder asks the API server.
	for deadline := time.Now().Add(10 * time.Second); ; {
		before := podGets()
		if _, err := f.Uses(ctx, ref, "gpu"); err != nil {
			t.Fatal(err)
		}
		if podGets() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("every lookup reads the pod from the API server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range []link.PodRef{ref, {Namespace: "ns", Name: "p"}} {
		before := podGets()
		if uses, err := f.Uses(ctx, r, "gpu"); err != nil || len(uses) != 1 {
			t.Fatalf("%+v: %v, %v", r, uses, err)
		}
		if podGets() != before {
			t.Errorf("%+v: the pod the watch has was read from the API server", r)
		}
	}
	before := podGets()
	if _, err := f.Uses(ctx, link.PodRef{Namespace: "ns", Name: "p", UID: "new-uid"}, "gpu"); err == nil {
		t.Error("a pod of another UID than the runtime's was taken")
	}
	if podGets() != before+1 {
		t.Error("a pod whose UID differs from the runtime's was not read again from the API server")
	}
}
