# hookviz — `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
ARCH   := $(shell uname -m)
# Pinned for reproducible installs (pyproject only asks for ranges).
ifeq ($(ARCH),aarch64)
TORCH_PIN := torch==2.9.1 torchvision==0.24.1
else
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
endif
# OpenCV pinned for reproducible pictures; the golden runs compare captions by their text and hold on 5.0 and 5.1.
CV_PIN := opencv-python-headless==5.0.0.93 opencv-python==5.0.0.93
DEMO_OUT ?= out/demo
# make test-newest: a second venv with the newest releases pyproject's ranges allow (no pins).
NEWEST ?= .venv-newest

.PHONY: help install browser demo docs docs-release dist test test-fast test-newest test-cuda check lint bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv and install hookviz with its test tools

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN) $(CV_PIN)
	$(PY) -m pip install -q -e '.[dev,demo,docs]'
	# lucent, the feature-visualisation reference (tests and bench only): its pins would downgrade torch
	$(PY) -m pip install -q --no-deps torch-lucent==0.1.8 kornia==0.4.1
	$(PY) -m pip install -q decorator ipython
	touch $(STAMP)

browser:  ## headless Chromium + chromedriver for the report tests (Debian packages; needs root)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "make browser: could not install chromium (not root?); the browser tests will be skipped" >&2

demo: $(STAMP)  ## render feature maps and Grad-CAM overlays for sample_images/, and a report to browse them
	@bash scripts/demo.sh $(VENV)/bin/hookviz $(DEMO_OUT)

test: $(STAMP) browser  ## run the test suite (slow tests included; two workers, one core each)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15

test-fast: $(STAMP) browser  ## the inner loop: every test but the slow model sweeps
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" --durations=10

test-newest: browser  ## the suite on the newest releases pyproject's ranges allow (unpinned, in .venv-newest)
	test -x $(NEWEST)/bin/python || $(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --upgrade pip
	$(NEWEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev,demo,docs]' decorator ipython
	$(NEWEST)/bin/python -m pip install -q --no-deps torch-lucent==0.1.8 kornia==0.4.1
	$(NEWEST)/bin/python -m pip freeze > $(NEWEST)/freeze.txt
	$(NEWEST)/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15

test-cuda: $(STAMP)  ## every command and front door on --device cuda, against the CPU (needs a GPU; skipped without)
	$(PY) -m pytest -q -m cuda -rs tests/test_cuda.py

lint: $(STAMP)  ## ruff + mypy
	$(VENV)/bin/ruff check hookviz tests bench examples scripts
	$(VENV)/bin/ruff format --check hookviz tests bench examples scripts
	$(VENV)/bin/mypy hookviz

check: lint test  ## lint, types and tests

bench: $(STAMP)  ## speed and memory benchmarks (see bench/RESULTS.md)
	$(PY) -m pip install -q -e ".[dev,bench]"
	$(PY) bench/bench.py
	$(PY) bench/methods_bench.py
	$(PY) bench/metrics_bench.py
	$(PY) bench/memory_bench.py
	$(PY) bench/serve_bench.py
	$(PY) bench/explore_bench.py
	$(PY) bench/vlm_bench.py
	$(PY) bench/deployed_bench.py
	$(PY) bench/data_bench.py
	$(PY) bench/monitor_bench.py
	$(PY) bench/channels_bench.py
	$(PY) bench/visualize_bench.py

docs-release: $(STAMP)  ## publish this version's site to the gh-pages branch with mike (a version picker: latest and each release)
	$(PY) scripts/cli_docs.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH NO_MKDOCS_2_WARNING=1 mike deploy --update-aliases $$($(PY) -c 'import hookviz; print(hookviz.__version__)') latest
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH mike set-default latest

dist: $(STAMP)  ## build the sdist and the wheel into dist/ (python -m build) and check them with twine
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

clean:  ## remove outputs (keeps .venv)
	rm -rf out dist build .pytest_cache .mypy_cache .ruff_cache

docs: $(STAMP)  ## build the documentation site into site/ (offline; open site/index.html)
	$(PY) scripts/cli_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
