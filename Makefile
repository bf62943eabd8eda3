# FedFaaS front door. `make demo` and `make test` do their own set-up (scripts/setup.sh).
#   make setup            apt packages, .venv, MinIO and helm (idempotent, seconds when done)
#   make test             the default tier: pytest without the slow tests (under 10 minutes)
#   make test-all         the full run, as CI runs it (.ci/run): test, test-slow,
#                         test-containers and test-k8s, each whatever the others did
#   make test-slow        the slow tier outside the container and Kubernetes tiers
#   make test-containers  the images, then tests/containers (podman, faasd; root)
#   make test-k8s         the Kubernetes binaries and node images, then tests/k8s (the chart on
#                         an API server; a real node: kubelet, containerd, kube-proxy)
#   make test-faults      the fault campaign on the one-machine platform (bench/faults.py)
#   make soak             10 minutes of load on the one-machine platform, a fault halfway
#                         (bench/soak.py, loadtests/platform.py; SOAK_ARGS)
#   make demo             the demo on a fresh platform in $(STATE)
#   make up|status|down   the one-machine platform in $(STATE) (down leaves only logs/);
#                         `make up WITH=all` adds the gateway, cache engine, tracker, control plane
#   make chart            helm lint + helm template of charts/fedfaas
#   make images           the services and function images with docker, podman or buildah
#                         (scripts/images.sh; ENGINE=, REGISTRY=ghcr.io/fedfaas, TAG=appVersion,
#                         IMAGES="fedfaas echo ..." a subset, CA_BUNDLE= the CA bundle pip trusts,
#                         NO_CACHE=1 every step built again)
#   make base-images      the upstream base images, pulled or made here without a registry
#                         (scripts/base-images.sh; `make images` runs it with podman or buildah)
#   make bench | bench-X  benchmarks (bench/results/); bench-state: do they name one clean commit
#   make lint             ruff, ruff format --check, mypy
SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/fedfaas
export PATH := $(VENV)/bin:$(CACHE)/bin:$(PATH)
STATE ?= $(CURDIR)/.state
WITH ?=
PYTEST_ARGS ?=
FAULTS_ARGS ?=
BENCHES := dataplane ebpf control flstore scale fedbuff robust flower_baseline tls_ingest secagg
# images: empty means scripts/images.sh's defaults (the first engine found, the chart's tag,
# every image); CA_BUNDLE defaults to the system bundle (empty: none)
ENGINE ?=
REGISTRY ?= ghcr.io/fedfaas
TAG ?=
IMAGES ?=
NO_CACHE ?=
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
HELM := $(shell command -v helm 2>/dev/null || echo $(CACHE)/bin/helm)

.PHONY: setup browser test test-all test-slow test-k8s test-faults soak demo bench lint up down status helm chart images \
	k8s-binaries $(addprefix bench-,$(BENCHES))

setup:
	@bash scripts/setup.sh

# setup, and Debian's Chromium with its chromedriver for the console's browser tests
browser:
	@FEDFAAS_BROWSER=1 bash scripts/setup.sh

# TEST_WORKERS pytest-xdist workers (one per core here); a module runs whole on one worker
# (--dist loadfile); each worker's servers take ports from a range of their own
# (tests/conftest.py); modules on fixed ports take a lock (tests/openfaas/conftest.py).
# --durations: the slowest tests, so that a tier that grows past its time says where
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

# every tier, each run even when one before it failed (scripts/test-all.sh; TIERS= a subset)
test-all:
	bash scripts/test-all.sh

test-slow: setup browser
	$(PY) -m pytest -m slow --ignore=tests/containers --ignore=tests/k8s --durations=25 $(PYTEST_ARGS)

test-k8s: setup k8s-binaries k8s-images
	$(PY) -m pytest tests/k8s $(PYTEST_ARGS)

# the fault campaign (issue 13): faults injected into `fedfaas up --with all`, results in
# bench/results/faults.{json,md}; exits 1 while a fault is not survived
test-faults: setup
	$(PY) -m bench.faults $(FAULTS_ARGS)

soak: setup
	$(PY) -m bench.soak $(SOAK_ARGS)

demo: setup
	$(VENV)/bin/fedfaas demo --state-dir $(STATE)

# every result under bench/results/ in one command: the benchmarks, the soak, then the fault
# campaign (last: it exits 1 while a fault is not survived)
bench: setup
	@set -e; for b in $(BENCHES); do echo "== bench-$$b"; $(PY) -m bench.$$b; done
	$(PY) -m bench.soak $(SOAK_ARGS)
	$(PY) -m bench.faults $(FAULTS_ARGS)
	$(PY) -m bench.results_state

# bench-scale in two runs on one commit: the clients axis, then the size axis merged into it
.PHONY: bench-scale-clients bench-scale-sizes bench-state
bench-scale-clients: setup
	$(PY) -m bench.scale --sizes-mb ''
bench-scale-sizes: setup
	$(PY) -m bench.scale --clients '' --merge

# exits 1 unless every file under bench/results/ names one landed commit from a clean tree
bench-state: setup
	$(PY) -m bench.results_state

# A static pattern rule, not a plain `bench-%:`: make never searches implicit (pattern) rules
# for a .PHONY target, so `make bench-dataplane` would do nothing and exit 0.
$(addprefix bench-,$(BENCHES)): bench-%: setup
	$(PY) -m bench.$*

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy core flstore_workloads runtime fedfaas console
	$(VENV)/bin/lint-imports

up: setup
	$(VENV)/bin/fedfaas up --state-dir $(STATE) $(if $(WITH),--with $(WITH))

down:
	$(VENV)/bin/fedfaas down --state-dir $(STATE)

status:
	$(VENV)/bin/fedfaas status --state-dir $(STATE)

# helm from the Go module proxy (about 3 minutes on 2 cores); setup does it too unless
# FEDFAAS_SKIP_HELM=1.
helm:
	@command -v helm >/dev/null || [ -x $(CACHE)/bin/helm ] || \
	  GOBIN=$(CACHE)/bin GOFLAGS=-mod=mod go install helm.sh/helm/v3/cmd/helm@latest
	@$(HELM) version --short

chart: helm
	$(HELM) lint --strict charts/fedfaas
	$(HELM) lint --strict charts/fedfaas --set nodeGateway.ebpf.enabled=true
	$(HELM) template fedfaas charts/fedfaas --namespace openfaas >/dev/null
	@echo "charts/fedfaas: lint and template ok"

# Builds images only; pushing them (or `kind load docker-image`) is up to you.
images:
	ENGINE="$(ENGINE)" REGISTRY="$(REGISTRY)" TAG="$(TAG)" IMAGES="$(IMAGES)" \
	  NO_CACHE="$(NO_CACHE)" CA_BUNDLE="$(CA_BUNDLE)" FEDFAAS_CACHE="$(CACHE)" \
	  bash scripts/images.sh

.PHONY: base-images
base-images:
	FEDFAAS_CACHE="$(CACHE)" bash scripts/base-images.sh

# Kubernetes server binaries built from the Go module proxy into $(CACHE)/k8s/<version>/
# (about 5 minutes each on 2 cores, skipped once cached) and Debian's etcd, for tests/k8s; then
# cert-manager's CRDs and its controller loops (about 2 minutes), from the same proxy, checked
# against sum.golang.org, into $(CACHE)/cert-manager/<version>/.
K8S_BINARIES ?= etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy \
	coredns
k8s-binaries:
	FEDFAAS_CACHE="$(CACHE)" bash scripts/k8s-binaries.sh $(K8S_BINARIES)
	FEDFAAS_CACHE="$(CACHE)" bash scripts/cert-manager-crds.sh >/dev/null
	FEDFAAS_CACHE="$(CACHE)" bash scripts/cert-manager-controller.sh >/dev/null

# The images tests/k8s runs on its node: the chart's and the echo function's, MinIO and Redis as
# deploy/faasd builds them, the pod sandbox (pause) image built from Kubernetes' source and
# CoreDNS's (scripts/k8s-images.sh; each kept once built)
.PHONY: k8s-images
k8s-images: IMAGES = fedfaas aggregator echo flstore digits-evaluator
k8s-images: k8s-binaries images
	FEDFAAS_CACHE="$(CACHE)" bash deploy/faasd/images.sh
	FEDFAAS_CACHE="$(CACHE)" bash scripts/k8s-images.sh

# The container tier (issue 34): the images (`make images`, then deploy/faasd/images.sh: MinIO,
# Redis, NATS Streaming, the queue worker), then tests/containers: the images run under podman,
# and the FL platform in containers under faasd 0.19.0, in a namespace of its own (root; slow)
.PHONY: test-containers
test-containers: setup images
	FEDFAAS_CACHE="$(CACHE)" bash deploy/faasd/images.sh
	$(PY) -m pytest tests/containers $(PYTEST_ARGS)

# The client SDK's API reference from its docstrings (Sphinx autodoc, docs/api) in
# build/docs-api; any warning fails the build (Sphinx: the dev extra, which setup installs).
.PHONY: docs-api
docs-api: setup
	$(PY) -m sphinx -W --keep-going -q -b html docs/api $(CURDIR)/build/docs-api

# The architecture picture of the README (docs/architecture.svg), drawn from its source
# (scripts/architecture_diagram.py; tests/docs/test_architecture_diagram.py holds the two equal).
.PHONY: docs-diagram
docs-diagram: setup
	$(PY) scripts/architecture_diagram.py docs/architecture.svg

# The console's screenshots (docs/console/*.png), taken by its browser tests in headless Chromium
# while a job runs on a platform of their own (tests/console/test_console_browser.py).
.PHONY: docs-console
docs-console: setup browser
	FEDFAAS_CONSOLE_SHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q tests/console/test_console_browser.py
