# nri-gpu: `make demo` shows it work, `make test` runs every test.

GO        ?= go
OUT       := $(CURDIR)/_output
BIN       := $(OUT)/bin
CRICTL_VERSION := v1.34.0
CONTAINERD17   := $(CURDIR)/test/tools/containerd17
CONTAINERD17_OLD := 1.7.25
CONTAINERD17OLD  := $(OUT)/containerd-$(CONTAINERD17_OLD)
CONTAINERD2_VERSION := v2.3.7
CONTAINERD2    := $(OUT)/containerd-$(CONTAINERD2_VERSION:v%=%)
CRIO_VERSION   := v1.34.0
CRIO           := $(OUT)/crio-$(CRIO_VERSION:v%=%)

# One Kubernetes release for every component the tests run.
KUBERNETES_VERSION := v1.37.2
KUBERNETES_MOD := $(CURDIR)/test/tools/kubernetes
KUBERNETES     := $(OUT)/kubernetes-$(KUBERNETES_VERSION:v%=%)
KUBELET        := $(KUBERNETES)/kubelet
# The oldest release where DRA is GA, for the version-skew test: its
# control plane and kubelet, from the same sources with its own go.mod
# (go.1.34.mod); etcd is the one above.
KUBERNETES_SKEW_VERSION := v1.34.4
KUBERNETES_SKEW_MODFILE := go.1.34.mod
KUBERNETES_SKEW     := $(OUT)/kubernetes-$(KUBERNETES_SKEW_VERSION:v%=%)
CNI_PLUGINS_VERSION := v1.9.1
CNI            := $(OUT)/cni-$(CNI_PLUGINS_VERSION:v%=%)
# The cgroup v2 test node's root, kernel and initramfs (hack/vm-root.sh,
# from Debian's packages; kept between runs).
VM             := $(OUT)/vm

export NRI_GPU_TOOLS := $(BIN)
# The real kubelet the Kubernetes tests run (standalone, static pods).
export NRI_GPU_KUBELET := $(KUBELET)
# The Kubernetes components (etcd, API server, scheduler, controller
# manager, kubelet), Helm and the CNI plugins of the cluster tests.
export NRI_GPU_KUBERNETES := $(KUBERNETES)
export NRI_GPU_HELM := $(BIN)/helm
export NRI_GPU_CNI := $(CNI)
# The containerd whose own CDI injection the corpus is compared with.
export NRI_GPU_REFERENCE_CONTAINERD := $(CONTAINERD2)
export NRI_GPU_VM := $(VM)
# go-nvml's cgo bindings declare functions the NVML headers deprecate.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: rules cluster crio vm skew mutation unit-long-tmpdir all build image test unit fuzz fuzz-one bench lint demo e2e-tools deps clean

all: build

build: $(BIN)/nri-gpu $(BIN)/nri-gpu-dra

# What `nri-gpu version` says: the tag (or commit) and the commit.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

$(BIN)/nri-gpu: FORCE
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/nri-gpu

# The DRA driver, a program of its own that nri-gpu starts (from beside
# itself) when DRA is on: only it links Kubernetes' client.
$(BIN)/nri-gpu-dra: FORCE
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/nri-gpu-dra

# nri-gpu's OCI image, as a tar `ctr images import` reads: the binaries and
# the C runtime they link, built by hack/image with go-containerregistry
# (no Docker, no registry). The shipped manifests run $(IMAGE).
IMAGE     ?= nri-gpu:latest
IMAGE_TAR := $(OUT)/nri-gpu-image.tar
# The image's source label: the repository's address, for whoever
# publishes the image (empty: no label).
SOURCE    ?=
export NRI_GPU_IMAGE := $(IMAGE_TAR)

image: build
	cd hack/image && $(GO) run . -binary $(BIN)/nri-gpu -dra-binary $(BIN)/nri-gpu-dra -out $(IMAGE_TAR) -name $(IMAGE) \
		-version $(VERSION) -revision $(COMMIT) -source '$(SOURCE)'

# containerd v1.7, ctr and the runc shim, built from containerd's Go module
# in a module of their own, so that nri-gpu does not depend on containerd.
$(BIN)/containerd: $(CONTAINERD17)/go.mod $(CONTAINERD17)/go.sum $(wildcard $(CONTAINERD17)/*/main.go)
	cd $(CONTAINERD17) && $(GO) build -o $(BIN)/ ./...
	touch $@

# An older containerd 1.7 (NRI v0.6.1), from the same sources with its own
# go.mod (go.$(CONTAINERD17_OLD).mod).
$(CONTAINERD17OLD)/containerd: $(CONTAINERD17)/go.$(CONTAINERD17_OLD).mod $(CONTAINERD17)/go.$(CONTAINERD17_OLD).sum
	cd $(CONTAINERD17) && $(GO) build -modfile=go.$(CONTAINERD17_OLD).mod -o $(CONTAINERD17OLD)/ ./...
	touch $@

# containerd 2.x needs no module of its own: it installs from its module.
$(CONTAINERD2)/containerd:
	GOBIN=$(CONTAINERD2) $(GO) install \
		github.com/containerd/containerd/v2/cmd/containerd@$(CONTAINERD2_VERSION) \
		github.com/containerd/containerd/v2/cmd/ctr@$(CONTAINERD2_VERSION) \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$(CONTAINERD2_VERSION)

# The runc each containerd release is tested with (the version its module
# names in script/setup/runc-version), built from runc's module beside
# that containerd's binaries, where the tests take it from.
CONTAINERD17_MODULE = github.com/containerd/containerd@$(shell cd $(CONTAINERD17) && $(GO) list -m -f '{{.Version}}' github.com/containerd/containerd)
$(BIN)/runc: $(CONTAINERD17)/go.mod hack/runc.sh
	GO=$(GO) hack/runc.sh $(CONTAINERD17_MODULE) $(BIN)
$(CONTAINERD17OLD)/runc: hack/runc.sh
	GO=$(GO) hack/runc.sh github.com/containerd/containerd@v$(CONTAINERD17_OLD) $(CONTAINERD17OLD)
$(CONTAINERD2)/runc: hack/runc.sh
	GO=$(GO) hack/runc.sh github.com/containerd/containerd/v2@$(CONTAINERD2_VERSION) $(CONTAINERD2)

# etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
# kubelet, built from k8s.io/kubernetes (and etcd's server module) in a
# module of their own (test/tools/kubernetes), as a release names its
# version.
# $(call k8s_ldflags,VERSION): the version the components report.
k8s_ldflags = -X k8s.io/component-base/version.gitVersion=$(1) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(1)))
$(KUBELET): $(KUBERNETES_MOD)/go.mod $(KUBERNETES_MOD)/go.sum $(wildcard $(KUBERNETES_MOD)/*/main.go)
	cd $(KUBERNETES_MOD) && $(GO) build -o $(KUBERNETES)/ -ldflags "$(call k8s_ldflags,$(KUBERNETES_VERSION))" ./...
	touch $@

$(KUBERNETES_SKEW)/kubelet: $(KUBERNETES_MOD)/go.1.34.mod $(KUBERNETES_MOD)/go.1.34.sum $(wildcard $(KUBERNETES_MOD)/*/main.go) $(KUBELET)
	cd $(KUBERNETES_MOD) && $(GO) build -modfile=$(KUBERNETES_SKEW_MODFILE) -o $(KUBERNETES_SKEW)/ -ldflags "$(call k8s_ldflags,$(KUBERNETES_SKEW_VERSION))" \
		./kube-apiserver ./kube-controller-manager ./kube-scheduler ./kubelet
	ln -sf $(KUBERNETES)/etcd $(KUBERNETES_SKEW)/etcd
	touch $@

# Helm's own CLI, from the Helm module the chart test uses.
$(BIN)/helm: $(CURDIR)/test/tools/helm/go.mod $(CURDIR)/test/tools/helm/go.sum
	cd test/tools/helm && $(GO) build -o $@ helm.sh/helm/v3/cmd/helm

# A glibc loader whose system directories are RHEL's (/lib64, /usr/lib64),
# for the hook-free e2e test's RHEL-like image.
$(BIN)/glibc-lib64/ld.so: hack/glibc-lib64.sh hack/deb.sh
	hack/glibc-lib64.sh $(BIN)/glibc-lib64

# Debian's Prometheus (prometheus and promtool, from its package, run
# from here: no service installed), for the chart's rules and the
# cluster's metrics tests.
$(BIN)/prometheus/promtool: hack/deb.sh
	rm -rf $(OUT)/prometheus-deb
	hack/deb.sh prometheus $$(dpkg --print-architecture) $(OUT)/prometheus-deb
	install -D -m 0755 $(OUT)/prometheus-deb/usr/bin/prometheus $(BIN)/prometheus/prometheus
	cp $(OUT)/prometheus-deb/SOURCE $(BIN)/prometheus/SOURCE
	install -D -m 0755 $(OUT)/prometheus-deb/usr/bin/promtool $@
	rm -rf $(OUT)/prometheus-deb

# gVisor's runsc and containerd shim, for the GPU pods in gVisor of the
# end-to-end tests (hack/gvisor.sh says the one change it makes).
$(BIN)/gvisor/containerd-shim-runsc-v1: $(CURDIR)/test/tools/gvisor/go.mod $(CURDIR)/test/tools/gvisor/go.sum hack/gvisor.sh
	GO=$(GO) hack/gvisor.sh $(BIN)/gvisor

# The CNI plugins of the cluster's pod network.
$(CNI)/bridge:
	GOBIN=$(CNI) $(GO) install \
		github.com/containernetworking/plugins/plugins/main/bridge@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/main/loopback@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/ipam/host-local@$(CNI_PLUGINS_VERSION)

# NVIDIA's own NRI plugin (the NVIDIA Container Toolkit's), for the test
# of nri-gpu beside it.
$(BIN)/nvidia-nri-plugin: FORCE
	$(GO) build -o $@ ./test/tools/nvidia-nri

# A stand-in for nvidia-cuda-mps-control (static: it runs in nri-gpu's
# image on the cluster too).
$(BIN)/mps-control: FORCE
	CGO_ENABLED=0 $(GO) build -o $@ ./test/tools/mps-control

$(BIN)/crictl:
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION)

# The cgroup v2 node (test/vm): a Debian root with systemd, made by
# debootstrap; rebuilt when the script changes.
$(VM)/root.img: hack/vm-root.sh
	hack/vm-root.sh $(VM)

# CRI-O, from its module (test/crio); kept between runs.
$(CRIO)/crio: hack/crio.sh
	GO=$(GO) hack/crio.sh $(CRIO_VERSION) $(CRIO)

deps:
	./hack/install-deps.sh

e2e-tools: deps build image $(BIN)/nvidia-nri-plugin $(BIN)/mps-control $(BIN)/containerd $(BIN)/crictl $(CONTAINERD2)/containerd $(CONTAINERD17OLD)/containerd \
	$(BIN)/runc $(CONTAINERD2)/runc $(CONTAINERD17OLD)/runc $(KUBELET) $(BIN)/helm $(CNI)/bridge $(BIN)/glibc-lib64/ld.so \
	$(BIN)/gvisor/containerd-shim-runsc-v1 $(BIN)/prometheus/promtool $(CRIO)/crio $(VM)/root.img

lint:
	@out=$$(gofmt -l cmd pkg test internal hack); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags vmguest ./test/vm/
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	cd $(CONTAINERD17) && $(GO) vet ./...
	cd $(CONTAINERD17) && $(GO) vet -modfile=go.$(CONTAINERD17_OLD).mod ./...
	cd hack/image && $(GO) vet ./... && $(GO) mod tidy -diff
	cd test/tools/helm && $(GO) vet ./... && $(GO) mod tidy -diff
	cd test/tools/gvisor && $(GO) mod tidy -diff
	cd $(KUBERNETES_MOD) && $(GO) mod tidy -diff && $(GO) mod tidy -modfile=$(KUBERNETES_SKEW_MODFILE) -diff

# Every test: unit, protocol (NRI's runtime side) and end-to-end, on
# containerd 1.7.35, then again on 2.x and on an older 1.7. The end-to-end
# tests need root; here they must run. The fuzz targets' seed corpora run
# with the unit tests; fuzzing itself is `make fuzz` (its instrumented
# build of pkg/plugin alone takes minutes, which CI's limit cannot spare).
test: lint e2e-tools
	NRI_GPU_E2E_REQUIRED=1 $(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v -e /test/cluster -e /test/skew -e /test/crio -e /test/vm)
	$(MAKE) cluster
	$(MAKE) crio
	$(MAKE) vm
	$(MAKE) skew
	cd hack/image && $(GO) test -count=1 ./...
	cd test/tools/helm && $(GO) test -count=1 ./...
	$(MAKE) rules
	NRI_GPU_E2E_REQUIRED=1 NRI_GPU_CONTAINERD=$(CONTAINERD2) $(GO) test -race -count=1 -timeout 30m ./test/e2e/
	NRI_GPU_E2E_REQUIRED=1 NRI_GPU_CONTAINERD=$(CONTAINERD17OLD) $(GO) test -race -count=1 -timeout 30m ./test/e2e/
	$(GO) test -run '^$$' -bench . -benchtime=1x ./pkg/...
	$(MAKE) unit-long-tmpdir

# The chart's Prometheus rules, checked and unit-tested with Debian's
# promtool (test/rules).
rules: $(BIN)/prometheus/promtool
	$(BIN)/prometheus/promtool check rules deploy/helm/nri-gpu/files/prometheus-rules.yaml
	$(BIN)/prometheus/promtool test rules test/rules/rules_test.yaml

# The cluster tests: a control plane, two GPU nodes, nri-gpu installed
# by its chart (test/cluster; started once for all its tests).
# CLUSTER_RUN=TestName runs one of them.
CLUSTER_RUN ?= .
cluster: e2e-tools
	NRI_GPU_E2E_REQUIRED=1 $(GO) test -race -count=1 -timeout 30m -run '$(CLUSTER_RUN)' ./test/cluster/

# nri-gpu on CRI-O $(CRIO_VERSION) (test/crio), with the runc of
# containerd $(CONTAINERD2_VERSION).
crio: e2e-tools
	NRI_GPU_E2E_REQUIRED=1 NRI_GPU_CRIO=$(CRIO) NRI_GPU_CONTAINERD=$(CONTAINERD2) $(GO) test -race -count=1 -timeout 15m ./test/crio/

# The cgroup v2 node with systemd and runc's systemd cgroup driver
# (test/vm): a VM under qemu's software emulation running containerd
# $(CONTAINERD2_VERSION), nri-gpu and the tests inside it, then the cluster
# tests again with CRI-O $(CRIO_VERSION) as the node's runtime.
vm: e2e-tools
	NRI_GPU_E2E_REQUIRED=1 NRI_GPU_CONTAINERD=$(CONTAINERD2) NRI_GPU_CRIO=$(CRIO) $(GO) test -count=1 -timeout 60m ./test/vm/

# Version skew: nri-gpu's DRA driver with the control plane and kubelet of
# Kubernetes $(KUBERNETES_SKEW_VERSION), the oldest release where DRA is GA.
skew: e2e-tools $(KUBERNETES_SKEW)/kubelet
	NRI_GPU_E2E_REQUIRED=1 NRI_GPU_KUBERNETES_SKEW=$(KUBERNETES_SKEW) $(GO) test -race -count=1 -timeout 15m ./test/skew/

# Unit and protocol tests under a TMPDIR longer than a unix socket path
# may be: tests put their sockets in short directories of their own.
LONG_TMPDIR := /tmp/nri-gpu-long-tmpdir-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
unit-long-tmpdir:
	rm -rf $(LONG_TMPDIR) && mkdir -p $(LONG_TMPDIR)
	TMPDIR=$(LONG_TMPDIR) $(GO) test -count=1 $$($(GO) list ./... | grep -v /test/); rc=$$?; rm -rf $(LONG_TMPDIR); exit $$rc

# The fuzz targets, briefly (FUZZTIME=5m for a longer run).
FUZZTIME ?= 15s
# A finding (an input written under testdata/fuzz) fails at once; a fuzzer
# that stops without one (a worker lost on a loaded machine) is shown and
# run once more.
fuzz:
	@$(MAKE) --no-print-directory fuzz-one TARGET=FuzzParseAndCheck PKG=pkg/policy
	@$(MAKE) --no-print-directory fuzz-one TARGET=FuzzRestoreAndErrors PKG=pkg/plugin

fuzz-one:
	@mkdir -p $(OUT); for try in 1 2; do \
		if $(GO) test -run='^$$' -fuzz='^$(TARGET)$$' -fuzztime=$(FUZZTIME) ./$(PKG) > $(OUT)/fuzz-$(TARGET).log 2>&1; then \
			echo "$(TARGET):"; tail -n 3 $(OUT)/fuzz-$(TARGET).log; exit 0; \
		fi; \
		grep -v '^fuzz: elapsed' $(OUT)/fuzz-$(TARGET).log; \
		if [ -n "$$(ls $(PKG)/testdata/fuzz/$(TARGET) 2>/dev/null)" ]; then exit 1; fi; \
		echo "fuzz: the fuzzer stopped without a finding (try $$try)"; \
	done; exit 1

# Unit and protocol tests only: no root, no tools.
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/)

# Benchmarks: writes BENCHMARKS.md (needs root for the end-to-end part).
bench: e2e-tools
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./pkg/plugin ./pkg/specs > $(OUT)/bench-go.txt
	$(GO) run ./test/bench -go-bench $(OUT)/bench-go.txt -out BENCHMARKS.md

# Mutation testing (long: about 15 minutes on 2 cores; not part of test):
# gremlins over each package, the report in docs/mutation.md, failing
# when a package scores below 85%. MUTATION_ONLY=pkg/x,pkg/y runs those
# again and reuses the others' last results.
GREMLINS_VERSION := v0.6.0
MUTATION_PKGS := pkg/adjust pkg/config pkg/metrics pkg/deviceplugin pkg/doctor pkg/dra pkg/dra/link pkg/inventory pkg/memlimit pkg/mps pkg/policy pkg/record pkg/recovery pkg/specs pkg/specs/nvidia pkg/plugin
$(BIN)/gremlins:
	GOBIN=$(abspath $(BIN)) $(GO) install github.com/go-gremlins/gremlins/cmd/gremlins@$(GREMLINS_VERSION)

mutation: deps $(BIN)/gremlins
	$(GO) run ./test/mutation -gremlins $(BIN)/gremlins -only "$(MUTATION_ONLY)" $(MUTATION_PKGS)

# The demo builds only what it runs: one containerd (1.7.35) and crictl.
demo: deps build $(BIN)/containerd $(BIN)/crictl
	$(GO) run ./test/demo

clean:
	rm -rf $(OUT)

FORCE:
