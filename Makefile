# Two entry points (see README): `make demo` and `make test`. Everything installs into .venv and
# a per-machine cache outside the repo (~/.cache/qwen-hicache: the local API server, kubectl, helm).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME_TEST_REQS := $(wildcard runtime_patches/requirements-test.txt)

.PHONY: setup cluster prometheus images images-ci demo test check lint bench crds clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(RUNTIME_TEST_REQS)
	@echo "==> creating $(VENV) and installing the operator with its test dependencies"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m harness.runtime_env
	touch $@

cluster: setup
	@echo "==> building the Kubernetes control plane, etcd and the LeaderWorkerSet controller, fetching kubectl/helm (first time: about 10 minutes)"
	$(PY) -m harness.devcluster build

prometheus: setup
	@echo "==> building Prometheus and promtool from harness/prometheus/go.mod (first time: several minutes)"
	$(PY) -m harness.prometheus.build

# Images (harness/images): buildah, mmdebstrap and runc from Debian's packages (apt-get, once per machine), a local
# Debian bookworm base, then the committed Dockerfiles; cached in ~/.cache/qwen-hicache/containers per input.
images: setup
	@echo "==> building all three images in full (the runtime's CUDA dependency set is several GB)"
	$(PY) -m harness.images build --full

images-ci: setup
	@echo "==> building the operator and router images, the runtime's patched-tree target and its test layer"
	$(PY) -m harness.images build

demo: cluster images-ci
	$(PY) -m harness.demo

lint: setup
	$(VENV)/bin/ruff check operator harness tests bench runtime_patches

test: cluster prometheus images-ci lint
	$(PY) -m pytest -q -ra

# The fast tier: lint plus the unit and fake-client tests (no cluster, no runtime tree, no binaries), < 2 min.
# They mirror modules in tests/test_*.py (tests/conftest.py gives every test its tier; subdirectories hold the
# other tiers), so only those files are collected.
check: lint
	$(PY) -m pytest -q -m "unit or fake" -p no:cacheprovider $(wildcard tests/test_*.py)

bench: cluster images-ci
	$(PY) bench/reconcile.py --compare 20
	$(PY) bench/file_tier.py
	$(PY) bench/routing.py
	$(PY) bench/rollouts.py

crds: setup
	$(VENV)/bin/qwen-hicache crd > crds/qwenhicacheservers.qwenhicache.io.yaml
	PYTHONPATH=. $(PY) tests/chart/chartlib.py  # the kubectl bundle embeds the CRD

clean:
	rm -rf $(VENV)
