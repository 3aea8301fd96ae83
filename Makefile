# One entry point per job. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test venv check unit e2e chaos chaos-real badinput demo bench bench-upstream control-plane images clean flake-check flake

## test: set up the venv, lint, type-check, check import layers, run unit and e2e tests
test: venv
	hack/test.sh

venv:
	hack/venv.sh

## check: ruff, mypy --strict, import layers, generated-code freshness (no tests)
check: venv
	hack/check.sh

unit: venv
	$(PY) -m pytest test/unit test/hack -q

e2e: venv control-plane
	$(PY) -m pytest test/e2e -q

control-plane:
	hack/build-control-plane.sh

## images: the Dockerfile's three images for linux/amd64 and linux/arm64, one OCI index each
## (buildah, podman or docker buildx; PLATFORMS, REGISTRY, TAG, PUSH=1: see hack/build-images.sh)
images: venv
	hack/build-images.sh $(if $(PUSH),--push,)

## chaos: soak of CHAOS_LIFECYCLES (default 200) ComputeDomain lifecycles with random SIGKILLs
## (controller, plugin, daemon, nvidia-imex, apiserver); figures -> docs/reliability.md.
## CHAOS_SEED=<n> replays a run. `make test` runs 8 of them (test/e2e/test_chaos.py).
CHAOS_LIFECYCLES ?= 200
chaos: venv control-plane
	CHAOS_LIFECYCLES=$(CHAOS_LIFECYCLES) CHAOS_REPORT=docs/reliability.md \
	  $(PY) -m pytest test/e2e/test_chaos.py -q -s -p no:cacheprovider

## chaos-real: soak of CHAOS_REAL_LIFECYCLES (default 50) lifecycles on real kubelets + containerd
## with one fault each (containerd, kubelet, plugin, daemon, nvidia-imex SIGKILLs; node reboot;
## network partition; plugin/controller rolling update); figures -> docs/reliability.md.
## CHAOS_REAL_SEED=<n> replays a run. `make test` runs 3 (test/e2e_nodes/test_real_chaos.py).
CHAOS_REAL_LIFECYCLES ?= 50
chaos-real: venv control-plane
	hack/node-deps.sh
	CHAOS_REAL_LIFECYCLES=$(CHAOS_REAL_LIFECYCLES) CHAOS_REAL_REPORT=docs/reliability.md \
	  $(PY) -m pytest test/e2e_nodes/test_real_chaos.py -q -s -p no:cacheprovider

## flake-check: the unit suite UNIT_RUNS (10) times and the simulated lane E2E_RUNS (3) times
## beside LOAD (2) busy loops; a test that fails here depends on how busy the machine is.
## Results -> docs/reliability.md "Flake check".
flake-check: venv control-plane
	hack/flake-check.sh

## flake: one test (pytest node id) N (20) times beside LOAD (2) busy loops, e.g.
## make flake TEST=test/unit/daemon/test_loop.py::test_x N=50; every failing run's log is kept.
flake: venv
	@test -n "$(TEST)" || { echo "usage: make flake TEST=<pytest node id> [N=20] [LOAD=2]"; exit 2; }
	TEST="$(TEST)" N=$(or $(N),20) LOAD=$(or $(LOAD),2) hack/flake-check.sh

## badinput: the bad-input suites (opaque configs, claims, checkpoint files, gRPC requests,
## ComputeDomain specs on the real apiserver) with BADINPUT_SCALE (default 5) times their
## examples; outcome counts -> docs/reliability.md "Bad input". `make test` runs them at scale 1.
BADINPUT_SCALE ?= 5
BADINPUT_COUNTS ?= /tmp/compute-domain-badinput.json
badinput: venv control-plane
	rm -f $(BADINPUT_COUNTS)
	BADINPUT_SCALE=$(BADINPUT_SCALE) BADINPUT_COUNTS=$(BADINPUT_COUNTS) \
	  $(PY) -m pytest test/unit/kubeletplugin/test_bad_input.py -q -p no:cacheprovider
	BADINPUT_SCALE=$(BADINPUT_SCALE) BADINPUT_COUNTS=$(BADINPUT_COUNTS) \
	  $(PY) -m pytest test/e2e/test_bad_compute_domains.py -q -p no:cacheprovider
	$(PY) hack/badinput.py $(BADINPUT_COUNTS) docs/reliability.md

## demo: local control plane + 2 real nodes (or 4 simulated ones), a 2-pod ComputeDomain Job, teardown
demo: venv control-plane
	hack/node-deps.sh || echo "demo: node packages missing; real nodes unavailable"
	$(PY) hack/demo.py

## bench: every benchmark script; figures are recorded in docs/benchmarks.md
bench: venv control-plane
	$(PY) hack/bench/informer_ingest.py
	$(PY) hack/bench/workqueue_throughput.py
	$(PY) hack/bench/prepare_latency.py --claims 500
	$(PY) hack/bench/time_to_ready.py
	$(PY) hack/bench/import_time.py

# Side by side with NVIDIA's Go controller (docs/benchmarks.md): needs a checkout of upstream's
# driver, which CI cannot fetch: make bench-upstream UPSTREAM=/path/to/dra-driver-nvidia-gpu
bench-upstream: venv control-plane
	@test -n "$(UPSTREAM)" || { echo "usage: make bench-upstream UPSTREAM=<upstream checkout>"; exit 2; }
	$(PY) hack/bench/controller_vs_upstream.py $(UPSTREAM) --nodes 1000 --cds 200 --namespaces 10 \
	  --runs 1 --qps 100:200,default --idle 60

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
