# Benchmarks (bench/, docs/benchmarks.md): figures with their method, inputs and machine; they
# never fail on speed. `make bench` runs everything (about 27 minutes: the local stack part runs a
# burst and a steady workload on moto + the mock Kafka cluster) and writes results/bench.json
# and results/bench.md (the README's performance table).
.PHONY: bench bench-quick

bench: $(STAMP) ## benchmarks: CPU, AWS requests, cost model, burst, lateness -> results/bench.*
	$(PY) -m bench --out results

bench-quick: $(STAMP) ## the benchmarks with tiny inputs and no local stack (seconds)
	$(PY) -m bench --quick --out results/quick
