# Deterministic simulation (sim/): the whole pipeline under AWS's weak semantics, seed by seed,
# every guarantee checked. `make sim` runs a fixed set of seeds twice: as they are, and with
# tenant limits (release caps, ingest quotas, priorities: `--limits`); part of `make test`, a
# few minutes. `make sim SEEDS=0-9999 HOURS=1` runs a long campaign. Writes results/sim.json
# and results/sim-limits.json; a failing seed prints the command that reproduces it.
#
# A campaign too long for one session runs in chunks: `make sim-chunk SEEDS=12600-13599`
# writes results/sim-campaign/seeds-12600-13599.json (a shard), and `make sim-merge` adds the
# shards up, exactly, into results/sim-campaign.json (refused if their shapes or knobs differ
# or their seeds overlap). MESSAGES sets each seed's requests (the campaigns use 1000), LIMITS=1
# runs them with tenant limits. `make sim-digest DIGEST=name` writes the campaign's digest to
# results/digests/name.json (per shard: seeds, commit, figures and a checksum a re-run of its
# seeds on its commit reproduces; the merged figures): the digests are committed, not the
# shards.
.PHONY: sim sim-chunk sim-merge sim-digest mutants
SEEDS ?= 0-15
LIMITED_SEEDS ?= $(SEEDS)
HOURS ?=
MESSAGES ?=
SIM_WORKERS ?= 2
SIM_CAMPAIGN ?= results/sim-campaign
# LIMITED_CORNERS=--no-corners runs the limited seeds without the contract's corners (the
# workload of the earlier campaigns).
LIMITED_CORNERS ?=

SIM_RUN = PYTHONPATH=. $(PY) -m sim $(if $(HOURS),--hours $(HOURS)) $(if $(MESSAGES),--messages $(MESSAGES)) --workers $(SIM_WORKERS) --quiet

sim: $(STAMP) ## deterministic simulation: SEEDS (default 0-15) without and LIMITED_SEEDS with tenant limits, HOURS per seed -> results/sim*.json
	$(SIM_RUN) --seeds $(SEEDS) --out results/sim.json
	$(SIM_RUN) --seeds $(LIMITED_SEEDS) --limits $(LIMITED_CORNERS) --out results/sim-limits.json

sim-chunk: $(STAMP) ## one chunk of a long campaign: SEEDS=12600-13599 (MESSAGES, HOURS, LIMITS=1) -> results/sim-campaign/
	$(SIM_RUN) --seeds $(SEEDS) $(if $(LIMITS),--limits) --out $(SIM_CAMPAIGN)/seeds-$(SEEDS).json

sim-merge: $(STAMP) ## merge the chunks in results/sim-campaign/ -> results/sim-campaign.json
	PYTHONPATH=. $(PY) -m sim merge $(SIM_CAMPAIGN)/*.json --out $(SIM_CAMPAIGN).json

sim-digest: $(STAMP) ## the digest of the chunks in results/sim-campaign/ -> results/digests/$(DIGEST).json
	PYTHONPATH=. $(PY) -m sim digest $(SIM_CAMPAIGN)/*.json --out results/digests/$(DIGEST).json

mutants: $(STAMP) ## mutation check: each fixed defect re-planted, seeds until one catches it -> results/mutants.json
	PYTHONPATH=. $(PY) -m sim mutants --seeds $(SEEDS) --jobs $(SIM_WORKERS) --out results/mutants.json

TEST_CHECKS += sim
