# nri-gpu: `make demo` shows it work, `make test` runs every test.

GO        ?= go
OUT       := $(CURDIR)/_output
BIN       := $(OUT)/bin
CRICTL_VERSION := v1.34.0
CONTAINERD17   := $(CURDIR)/test/tools/containerd17

export NRI_GPU_TOOLS := $(BIN)

.PHONY: all build test unit fuzz lint demo e2e-tools deps clean

all: build

build: $(BIN)/nri-gpu

$(BIN)/nri-gpu: FORCE
	$(GO) build -o $@ ./cmd/nri-gpu

# containerd v1.7, ctr and the runc shim, built from containerd's Go module
# in a module of their own, so that nri-gpu does not depend on containerd.
$(BIN)/containerd: $(CONTAINERD17)/go.mod $(CONTAINERD17)/go.sum $(wildcard $(CONTAINERD17)/*/main.go)
	cd $(CONTAINERD17) && $(GO) build -o $(BIN)/ ./...
	touch $@

$(BIN)/crictl:
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION)

deps:
	./hack/install-deps.sh

e2e-tools: deps build $(BIN)/containerd $(BIN)/crictl

lint:
	@out=$$(gofmt -l cmd pkg test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd $(CONTAINERD17) && $(GO) vet ./...

# Every test: unit, protocol (NRI's runtime side) and end-to-end (a real
# containerd 1.7). The end-to-end tests need root; here they must run.
test: lint e2e-tools
	NRI_GPU_E2E_REQUIRED=1 $(GO) test -race -count=1 ./...
	$(MAKE) fuzz

# The fuzz targets, briefly (FUZZTIME=5m for a longer run).
FUZZTIME ?= 15s
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseAndCheck -fuzztime=$(FUZZTIME) ./pkg/policy

# Unit and protocol tests only: no root, no tools.
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/)

demo: e2e-tools
	$(GO) run ./test/demo

clean:
	rm -rf $(OUT)

FORCE:
