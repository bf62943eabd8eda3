# FedFaaS front door. `make demo` and `make test` do their own set-up (scripts/setup.sh).
SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
export PATH := $(VENV)/bin:$(HOME)/.cache/fedfaas/bin:$(PATH)
STATE ?= $(CURDIR)/.state
PYTEST_ARGS ?=
BENCHES := dataplane ebpf control flstore

.PHONY: setup test test-all demo bench lint up down status $(addprefix bench-,$(BENCHES))

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/fedfaas demo --state-dir $(STATE)

bench: setup
	@for b in $(BENCHES); do [ -f bench/$$b.py ] && $(PY) -m bench.$$b || true; done

bench-%: setup
	$(PY) -m bench.$*

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy fedfaas

up: setup
	$(VENV)/bin/fedfaas up --state-dir $(STATE)

down:
	$(VENV)/bin/fedfaas down --state-dir $(STATE)

status:
	$(VENV)/bin/fedfaas status --state-dir $(STATE)
