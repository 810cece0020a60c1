# Deterministic simulation (sim/): the whole pipeline under AWS's weak semantics, seed by seed,
# every guarantee checked. `make sim` runs a fixed set of seeds twice: as they are, and with
# tenant limits (release caps, ingest quotas, priorities: `--limits`); part of `make test`, a
# few minutes. `make sim SEEDS=0-9999 HOURS=1` runs a long campaign. Writes results/sim.json
# and results/sim-limits.json; a failing seed prints the command that reproduces it.
.PHONY: sim
SEEDS ?= 0-15
LIMITED_SEEDS ?= $(SEEDS)
HOURS ?=
SIM_WORKERS ?= 2
SIM_RUN = PYTHONPATH=. $(PY) -m sim $(if $(HOURS),--hours $(HOURS)) --workers $(SIM_WORKERS) --quiet

sim: $(STAMP) ## deterministic simulation: SEEDS (default 0-15) without and LIMITED_SEEDS with tenant limits, HOURS per seed -> results/sim*.json
	$(SIM_RUN) --seeds $(SEEDS) --out results/sim.json
	$(SIM_RUN) --seeds $(LIMITED_SEEDS) --limits --out results/sim-limits.json

TEST_CHECKS += sim
