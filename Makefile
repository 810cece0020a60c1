# Every target sets up what it needs: a .venv with the pinned dependencies. `make demo` and
# `make local` install only the local stack's (requirements/local.lock); everything else
# installs the full set (requirements/dev.lock, a superset) into the same .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local
# Byte-code is compiled on first import instead of for every installed file (most are never
# imported by a run).
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
# Test workers: pytest-xdist processes (the integration tests give each its own moto server,
# mock Kafka cluster, stack names and results folder).
WORKERS ?= auto
# The integration and Spark tiers mostly wait (messages due seconds ahead, event sources polling,
# a JVM): two workers per core finish them in about three quarters of the time one per core takes.
SLOW_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))
CODE := layers/delayq/delayq functions local/delayq_local spark_glue tests bench testkit sim

.DEFAULT_GOAL := help
# Checks that other parts add to `make test` (template scans, Spark, ...), from mk/*.mk.
TEST_CHECKS :=
include $(wildcard mk/*.mk)
.PHONY: help venv test test-steps lint format unit functional demo clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)

$(LOCAL_STAMP): requirements/local.lock pyproject.toml | $(PY)
	$(PIP_INSTALL) -r requirements/local.lock
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	touch $@

$(STAMP): requirements/dev.lock requirements/local.lock pyproject.toml | $(PY)
	$(PIP_INSTALL) -r requirements/dev.lock
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	touch $(LOCAL_STAMP) $@

venv: $(STAMP) ## create .venv with every pinned dependency (tests, lint, Spark)

lint: $(STAMP) ## ruff (lint + format check) and mypy
	$(PY) -m ruff check $(CODE)
	$(PY) -m ruff format --check $(CODE)
	$(PY) -m mypy layers/delayq/delayq functions bench testkit sim tests/unit tests/functional tests/template tests/conftest.py tests/factories.py

format: $(STAMP) ## apply ruff format and safe fixes
	$(PY) -m ruff format $(CODE)
	$(PY) -m ruff check --fix $(CODE)

# pytest exits 5 when it collected no test: that is a failure too.
PYTEST_HONEST = rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected: failing"; exit 1; fi; exit $$rc

unit: $(STAMP) ## unit, functional and bench tests with layer branch coverage (fails under 90%)
	$(PY) -m pytest -n $(WORKERS) tests/unit tests/functional bench/tests --cov --cov-branch --cov-fail-under=90; $(PYTEST_HONEST)

# The rest of tests/ after lint, unit and the other checks; the wall time of all of it.
test: ## the full suite: lint, unit, functional, integration, spark, template checks (prints its time)
	@start=$$(date +%s); $(MAKE) --no-print-directory test-steps; rc=$$?; \
	  echo "make test: $$(( $$(date +%s) - start )) s wall, exit $$rc"; exit $$rc

test-steps: lint unit $(TEST_CHECKS)
	$(PY) -m pytest -n $(SLOW_WORKERS) --dist loadgroup tests --ignore=tests/unit --ignore=tests/functional; $(PYTEST_HONEST)

demo: $(LOCAL_STAMP) ## the whole pipeline on the embedded local stack, with a result summary
	$(VENV)/bin/delayq demo

clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage results
