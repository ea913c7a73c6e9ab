# The two quickstart commands: `make run` (main job on the embedded default) and `make test` (whole test suite).
# Each creates .venv if missing and installs the project (torch pinned and installed first).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test setup bench clean
setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

run: setup
	$(VENV)/bin/shopsim bench --quick --out runs/quick

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf runs .pytest_cache
