# Deterministic simulation (sim/): the whole pipeline under AWS's weak semantics, seed by seed,
# every guarantee checked. `make sim` runs a fixed set of seeds (part of `make test`, about a
# minute); `make sim SEEDS=0-9999 HOURS=1` runs a long campaign. Writes results/sim.json; a
# failing seed prints the command that reproduces it.
.PHONY: sim
SEEDS ?= 0-15
HOURS ?=
SIM_WORKERS ?= 2

sim: $(STAMP) ## deterministic simulation: SEEDS (default 0-15), HOURS per seed -> results/sim.json
	PYTHONPATH=. $(PY) -m sim --seeds $(SEEDS) $(if $(HOURS),--hours $(HOURS)) --workers $(SIM_WORKERS) --quiet --out results/sim.json

TEST_CHECKS += sim
