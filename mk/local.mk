# The local runner (local/delayq_local): its strict type check joins `make test`; its integration
# tests (also part of `make test`) and the stack itself can be run on their own.
.PHONY: integration typecheck-local local

TEST_CHECKS += typecheck-local

typecheck-local: $(STAMP) ## mypy (strict) on the local runner and its integration tests
	$(PY) -m mypy local/delayq_local tests/integration

integration: $(STAMP) ## the integration tests: embedded stack, moto server, mock Kafka cluster
	$(PY) -m pytest -n $(SLOW_WORKERS) tests/integration; $(PYTEST_HONEST)

local: $(LOCAL_STAMP) ## the embedded stack in the foreground (delayq local; Ctrl-C stops it)
	$(VENV)/bin/delayq local
