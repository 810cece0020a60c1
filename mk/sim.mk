# Deterministic simulation (sim/): the whole pipeline under AWS's weak semantics, seed by seed,
# every guarantee checked. `make sim` runs a fixed set of seeds (part of `make test`, about a
# minute); `make sim SEEDS=0-9999 HOURS=1` runs a long campaign. Writes results/sim.json; a
# failing seed prints the command that reproduces it.
#
# A campaign too long for one session runs in chunks: `make sim-chunk SEEDS=12600-13599`
# writes results/sim-campaign/seeds-12600-13599.json (a shard), and `make sim-merge` adds the
# shards up, exactly, into results/sim-campaign.json (refused if their shapes or knobs differ
# or their seeds overlap). MESSAGES sets each seed's requests (the campaigns use 1000).
.PHONY: sim sim-chunk sim-merge
SEEDS ?= 0-15
HOURS ?=
MESSAGES ?=
SIM_WORKERS ?= 2
SIM_CAMPAIGN ?= results/sim-campaign

SIM_SHAPE = $(if $(HOURS),--hours $(HOURS)) $(if $(MESSAGES),--messages $(MESSAGES))

sim: $(STAMP) ## deterministic simulation: SEEDS (default 0-15), HOURS per seed -> results/sim.json
	PYTHONPATH=. $(PY) -m sim --seeds $(SEEDS) $(SIM_SHAPE) --workers $(SIM_WORKERS) --quiet --out results/sim.json

sim-chunk: $(STAMP) ## one chunk of a long campaign: SEEDS=12600-13599 (MESSAGES, HOURS) -> results/sim-campaign/
	PYTHONPATH=. $(PY) -m sim --seeds $(SEEDS) $(SIM_SHAPE) --workers $(SIM_WORKERS) --quiet --out $(SIM_CAMPAIGN)/seeds-$(SEEDS).json

sim-merge: $(STAMP) ## merge the chunks in results/sim-campaign/ -> results/sim-campaign.json
	PYTHONPATH=. $(PY) -m sim merge $(SIM_CAMPAIGN)/*.json --out $(SIM_CAMPAIGN).json

TEST_CHECKS += sim
