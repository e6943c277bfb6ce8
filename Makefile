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

.PHONY: help venv tools cluster-up cluster-down lint unit e2e test demo demo-down bench crds dashboards clean

help:
	@echo "make demo        the whole story on a local cluster (operator, router, autoscaler, dashboards)"
	@echo "make test        lint, unit and e2e tests (brings the local cluster up)"
	@echo "make cluster-up  start the local cluster; make cluster-down stops it"
	@echo "make bench       run the benchmarks under bench/ (see bench/README.md)"

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

tools:
	bash cluster/build-tools.sh

cluster-up: venv tools
	@$(XPYD) cluster up

cluster-down: venv
	@$(XPYD) cluster down

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: venv tools
	$(VENV)/bin/pytest tests $(PYTEST_ARGS)

e2e: venv
	@if [ -n "$(E2E_KUBECONFIG)" ]; then \
	  KUBECONFIG="$(E2E_KUBECONFIG)" $(VENV)/bin/pytest e2e -m e2e $(PYTEST_ARGS); \
	else \
	  $(MAKE) --no-print-directory cluster-up && \
	  KUBECONFIG="$(LOCAL_KUBECONFIG)" PATH="$(XPYD_CACHE)/bin:$$PATH" $(VENV)/bin/pytest e2e -m e2e $(PYTEST_ARGS); \
	fi

test: lint unit e2e

demo: venv tools
	@bash demo/run.sh

demo-down: venv
	@bash demo/down.sh

bench: venv
	@bash bench/run-all.sh

clean: cluster-down
	rm -rf $(VENV) build *.egg-info
