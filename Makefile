# kubeloop: `make demo` runs the loop on this machine, `make test` runs the tests.
# Both set up what they need first (idempotently): see `make setup`.

SHELL := /bin/bash
.DEFAULT_GOAL := help

include tools/versions.env

PYTHON ?= python3
VENV := .venv
SERVING_VENV := .venv-serving
PY := $(VENV)/bin/python
TEST_WORKERS ?= $(shell nproc)
# The e2e tests: each worker starts a platform of its own and runs a module
# at a time (the real node's on one of them).
E2E_WORKERS ?= 2
export KUBELOOP_CACHE ?= $(HOME)/.cache/kubeloop
UV_HOME := $(KUBELOOP_CACHE)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
# uv's wheel cache beside kubeloop's others; it uses this machine's Python,
# never one it would download.
export UV_CACHE_DIR ?= $(KUBELOOP_CACHE)/uv-cache
export UV_PYTHON_DOWNLOADS := never
# Every Python process the tests and the loop start (pipeline steps, monitoring
# jobs, the operator, the front) imports kubeloop's own modules; where the
# machine sets PYTHONDONTWRITEBYTECODE each of them compiles those from source
# again, about a second of CPU per process.
unexport PYTHONDONTWRITEBYTECODE
BIN_STAMPS := $(KUBELOOP_CACHE)/bin/kubernetes-$(KUBERNETES_VERSION)/.complete \
              $(KUBELOOP_CACHE)/bin/node-$(KUBERNETES_VERSION)/.complete \
              $(KUBELOOP_CACHE)/bin/kwok-$(KWOK_VERSION)/.complete \
              $(KUBELOOP_CACHE)/bin/helm-$(HELM_VERSION)/.complete
DEBS := prometheus prometheus-alertmanager redis-server
# The real node (kubeloop dev up --nodes real, and its tests): containerd, runc,
# CNI plugins, kube-proxy's iptables and conntrack, and the image tools.
# KUBELOOP_REAL_NODE=0 leaves them out (and the real node's tests skip).
NODE_DEBS := containerd runc containernetworking-plugins iptables conntrack mmdebstrap umoci
ifneq ($(KUBELOOP_REAL_NODE),0)
DEBS += $(NODE_DEBS)
NODE_IMAGES := node-images
# What the real node's tests need built: CoreDNS, KServe's manager,
# prometheus-adapter, Trainer's and JobSet's managers and kubeloop's images.
# They build beside the unit tests (at low priority), and the e2e tests start
# once they are done. From an empty cache, built beside the e2e tests, the
# last image was done 43 minutes into the run (the real node's tests waited
# for it, the others shared the cores with it); alone the same builds take
# about 19. With the cache kept only kubeloop's own layers build, in about
# a minute. Outside tests `kubeloop dev up --nodes real` builds CoreDNS when
# missing, and `kubeloop dev metrics-adapter` the adapter.
PREBUILD := tools/build-binaries.sh coredns kserve prometheus-adapter trainer; \
  $(VENV)/bin/kubeloop dev images operator runtime triton training
endif
PREBUILD_LOG := $(KUBELOOP_CACHE)/images/prebuild.log

.PHONY: help setup python serving-env binaries debs images node-images test test-unit test-e2e lint bench demo demo-cluster demo-outcomes crds pipelines lock clean

help:
	@echo "make demo   - bring the platform up on this machine and run the loop"
	@echo "make demo-cluster - the same loop on the cluster path (real node, KServe, front, drift Jobs)"
	@echo "make demo-outcomes - the loop judged by outcomes: late labels, concept drift, rollouts"
	@echo "make test   - run the test suite (unit, architecture, end-to-end)"
	@echo "make bench  - run the benchmarks and print their tables (BENCH=repeatability for one suite)"
	@echo "make setup  - install everything the above need (done by them when needed)"
	@echo "make images - build the real node's images without Docker (cached by their inputs)"
	@echo "make crds   - regenerate the chart's CRDs and RBAC rules from the code"
	@echo "make pipelines - recompile the pipelines' IR under pipelines/compiled"
	@echo "make lock   - re-pin requirements/constraints.txt from the current venv"

setup: python serving-env binaries debs $(NODE_IMAGES)

python: $(VENV)/.installed

# uv, in a venv of its own in the cache, one per version.
$(UV):
	rm -rf $(UV_HOME) && $(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install -q uv==$(UV_VERSION)

# --seed: pip too, which builds the real node's Python images.
$(VENV)/.installed: pyproject.toml requirements/constraints.txt | $(UV)
	@test -x $(PY) || $(UV) venv -q --seed -p $(PYTHON) $(VENV)
	$(UV) pip install -q -p $(PY) -c requirements/constraints.txt -e '.[dev]'
	touch $@

serving-env: $(SERVING_VENV)/.installed

# The local Triton runtime's environment (see requirements/serving.txt).
$(SERVING_VENV)/.installed: requirements/serving.txt | $(UV)
	@test -x $(SERVING_VENV)/bin/python || $(UV) venv -q --seed -p $(PYTHON) $(SERVING_VENV)
	$(UV) pip install -q -p $(SERVING_VENV)/bin/python -r requirements/serving.txt
	touch $@

binaries: $(BIN_STAMPS)

$(BIN_STAMPS) &: tools/versions.env
	tools/build-binaries.sh

# One install at a time: two make runs at once (a test and a demo) would race
# for apt's lock, and the loser would fail. The missing list is taken under the lock.
debs:
	@flock /tmp/kubeloop-debs.lock sh -c 'missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing Debian packages:$$missing"; \
	  $$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi'

# kubeloop's images for the real node, built without Docker and cached by
# their inputs (see images/). Setup builds the two that do not change with the
# code (the sandbox and the Debian base); tests build the others when needed.
images: python binaries debs
	$(VENV)/bin/kubeloop dev images

node-images: python debs
	$(VENV)/bin/kubeloop dev images pause base

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@# Every test module imports (a helper moved between test files once broke CI's collection).
	$(PY) -m pytest --collect-only -q -p no:cacheprovider tests > /dev/null

# Unit and component tests (no platform) run on every core; the e2e tests
# then on E2E_WORKERS, each with a platform for its session, a module whole
# on one worker. Both run whatever the first's result, and each prints its
# ten slowest tests.
test: setup lint
	@mkdir -p $(dir $(PREBUILD_LOG)); prebuild=""; \
	if [ -n '$(PREBUILD)' ]; then nice -n 10 sh -c '$(PREBUILD)' > $(PREBUILD_LOG) 2>&1 & prebuild=$$!; fi; \
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=10 tests/unit tests/components; fast=$$?; \
	if [ -n "$$prebuild" ]; then waited=$$SECONDS; echo "waiting for the real node's builds (log: $(PREBUILD_LOG))"; \
	  wait $$prebuild || echo "the real node's builds failed (see that log); its tests build what they need"; \
	  echo "the real node's builds done, $$((SECONDS - waited)) s after the unit and component tests"; fi; \
	$(PY) -m pytest -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 --tb=short tests/e2e; e2e=$$?; \
	[ $$fast = 0 ] && [ $$e2e = 0 ]

test-unit: python binaries
	$(PY) -m pytest tests/unit

test-e2e: setup
	$(PY) -m pytest tests/e2e

bench: setup
	$(PY) -m tests.bench $(BENCH)

demo: setup
	$(VENV)/bin/kubeloop demo

# The same story on the cluster path: a real node, KServe, the front and drift Jobs in Pods.
demo-cluster: setup
	$(VENV)/bin/kubeloop demo --cluster

# Late labels, concept drift that the inputs do not show, rollouts judged on live metrics.
demo-outcomes: setup
	$(VENV)/bin/kubeloop demo --story outcomes

crds: python
	$(VENV)/bin/kubeloop crds --output charts/kubeloop/crds
	$(VENV)/bin/kubeloop rbac --output charts/kubeloop/files/operator-rules.yaml
	cp monitoring/rules/kubeloop.rules.yaml charts/kubeloop/files/kubeloop.rules.yaml

pipelines: python
	$(VENV)/bin/kubeloop pipelines compile

lock: python
	{ echo "# Pinned versions of every Python package in .venv; regenerate with 'make lock'."; \
	  $(PY) -m pip freeze --exclude-editable; } > requirements/constraints.txt

clean:
	rm -rf $(VENV) $(SERVING_VENV) build *.egg-info
