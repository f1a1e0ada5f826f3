# Runwatch developer commands. Needs only python3.11 on PATH; everything else goes into .venv.
#   make demo       dashboard on http://127.0.0.1:8000 with a 2-rank training job streaming to it
#   make test       the whole suite against real PostgreSQL, Redis and Chromium, but the long fault tests
#   make test-faults  faults during a real training run and 200-rank load (~10 min, private servers)
#   make test-fast  the same without the browser and end-to-end tests
#   make lint       ruff

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# nvml: the GPU sampler's tests run against the real NVML bindings (no driver needed).
EXTRAS := server,broker,nvml,dev
# The stamp is keyed on pyproject.toml's content and the extras, so a changed dependency list
# reinstalls and an unchanged one (a fresh checkout with new mtimes included) does not.
STAMP := $(VENV)/.installed-$(shell { cat pyproject.toml; echo $(EXTRAS); } | sha256sum | cut -c1-16)

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/runwatch
TEST_BROKER_URL ?= redis://127.0.0.1:6379/14
PYTEST_ARGS ?=
TEST_ENV := DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL)

.PHONY: venv demo test test-fast test-faults lint clean

venv: $(STAMP)

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is not on PATH: install Python 3.11, or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'torch==2.13.0'
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: venv
	@$(BIN)/python scripts/demo.py

test: venv
	scripts/ensure_services.sh
	$(TEST_ENV) $(BIN)/python -m pytest -m "not faults" $(PYTEST_ARGS)

# Redis, PostgreSQL, workers and the ingest API stopped or killed under a real torchrun job, and
# 200 ranks of load; each test starts its own servers (needs redis-server, initdb, pg_ctl) and
# writes its row of docs/reliability.md. Two 60 s outages and a 2 min load: about 10 minutes.
test-faults: venv
	scripts/ensure_services.sh --no-browser
	$(TEST_ENV) $(BIN)/python -m pytest -m faults $(PYTEST_ARGS)

test-fast: venv
	scripts/ensure_services.sh --no-browser
	$(TEST_ENV) $(BIN)/python -m pytest -m "not browser and not e2e" $(PYTEST_ARGS)

# ruff check only: the code base wraps lines by hand, so `ruff format` is not enforced.
lint: venv
	$(BIN)/ruff check .

# Keeps var/ (the embedded mode's database and spool): that is data, not build output.
clean:
	rm -rf $(VENV) $(BENCH_VENV) staticfiles .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +

# Per-step cost of Runwatch against wandb (offline), MLflow (file store) and TensorBoard; see
# bench/README.md. The peers live in their own venv so the product's dependencies stay lean, and
# torch is installed first and pinned so no peer can make pip pull another build.
#   make bench-plugin BENCH_ARGS="--rounds 3 --json bench.json"
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-$(shell cat pyproject.toml bench/requirements-peers.txt | sha256sum | cut -c1-16)
BENCH_ARGS ?=

.PHONY: bench-plugin

$(BENCH_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is not on PATH: install Python 3.11, or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet 'torch==2.13.0'
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.'
	$(BENCH_VENV)/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	rm -f $(BENCH_VENV)/.installed-*
	touch $@

bench-plugin: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/plugin_overhead.py $(BENCH_ARGS)

# End to end: plugin batches → Redis → Celery workers → PostgreSQL, beside raw psycopg COPY and an
# MLflow tracking server (from .venv-bench) in the same run; see bench/README.md. Needs the
# PostgreSQL at BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432) and redis-server on PATH.
# About 8 minutes; BENCH_ARGS="--quick" takes under 2.
#   make bench-ingest BENCH_ARGS="--json /tmp/ingest.json"
.PHONY: bench-ingest
bench-ingest: venv $(BENCH_STAMP)
	scripts/ensure_services.sh --no-browser
	$(BIN)/python bench/ingest_e2e.py $(BENCH_ARGS)

# Every dashboard page and JSON chart endpoint of a run with 20M GPU samples and 1M step rows:
# p50/p95 and points per trace, exit 1 over 500 ms or 5,000 points (bench/dashboard_load.py).
# Loads its own database (runwatch_bench_dash) once, ~10 min; later runs reuse it when its shape
# matches. A fresh load: make bench-dashboard BENCH_DASH_ARGS=; development: BENCH_DASH_ARGS=--quick
BENCH_DASH_ARGS ?= --reuse
.PHONY: bench-dashboard
bench-dashboard: venv
	scripts/ensure_services.sh --no-browser
	$(BIN)/python bench/dashboard_load.py $(BENCH_DASH_ARGS)
