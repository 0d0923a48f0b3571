# The README's two commands: `make run` (the default experiment, offline, CPU) and `make test`; `make lint` is
# what CI runs before the tests.
# Both set up .venv from scratch: torch==2.13.0 first (a CPU wheel here; an unpinned torch would pull CUDA),
# then kdpipe with its pinned dependencies.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
CORES   ?= 2
STAMP   := $(VENV)/.installed
# test files run side by side in this many processes (pytest-xdist), a whole file per process, the longest files
# first (tests/conftest.py; --no-loadscope-reorder keeps that order)
TEST_WORKERS ?= 2
# profiles/workstation on a machine with an NVIDIA GPU, profiles/cpu otherwise
PROFILE ?= $(if $(shell command -v nvidia-smi 2>/dev/null),profiles/workstation,profiles/cpu)

.PHONY: run test lint setup report clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --profile $(PROFILE) --cores $(CORES)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --profile $(PROFILE) --cores $(CORES) --report results/report/report.html

test: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# ruff (lint and format), snakefmt and Snakemake's own linter; each fails on any finding
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile workflow
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --lint

clean:
	rm -rf results .snakemake
