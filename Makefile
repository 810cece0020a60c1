# Every target sets up what it needs: a .venv with the pinned dependencies.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CODE := layers/delayq/delayq functions local/delayq_local spark_glue tests bench

.DEFAULT_GOAL := help
# Checks that other parts add to `make test` (template scans, Spark, ...), from mk/*.mk.
TEST_CHECKS :=
include $(wildcard mk/*.mk)
.PHONY: help venv test lint format unit functional demo clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): requirements/dev.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/dev.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP) ## create .venv with the pinned dependencies

lint: $(STAMP) ## ruff (lint + format check) and mypy
	$(PY) -m ruff check $(CODE)
	$(PY) -m ruff format --check $(CODE)
	$(PY) -m mypy layers/delayq/delayq functions bench

format: $(STAMP) ## apply ruff format and safe fixes
	$(PY) -m ruff format $(CODE)
	$(PY) -m ruff check --fix $(CODE)

unit: $(STAMP) ## unit and functional tests with layer branch coverage (fails under 90%)
	$(PY) -m pytest tests/unit tests/functional --cov --cov-branch --cov-fail-under=90

test: lint unit $(TEST_CHECKS) ## the full suite: lint, unit, functional, integration, spark, template checks
	$(PY) -m pytest tests --ignore=tests/unit --ignore=tests/functional; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests collected: failing"; exit 1; fi; exit $$rc

demo: $(STAMP) ## the whole pipeline on the embedded local stack, with a result summary
	$(VENV)/bin/delayq demo

clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage results
