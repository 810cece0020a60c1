# Spark reports (spark_glue/): the zip the Glue jobs import, the benchmark, a strict type check
# (joins `make test`). The Spark tests themselves run in `make test` with the rest of tests/.
.PHONY: glue-zip bench-spark spark-test typecheck-spark bench

GLUE_ZIP := build/glue/delayq_reports.zip
BENCH_ROWS ?= 1

TEST_CHECKS += typecheck-spark

$(GLUE_ZIP): spark_glue/glue_zip.py $(wildcard spark_glue/delayq_reports/*.py)
	$(PY) spark_glue/glue_zip.py $@

glue-zip: $(STAMP) $(GLUE_ZIP) ## build build/glue/delayq_reports.zip (the Glue jobs' --extra-py-files)

bench-spark: $(STAMP) ## both report jobs on BENCH_ROWS million synthetic export rows (default 1): rows/s
	$(PY) -m delayq_reports.bench --rows $(BENCH_ROWS)

# `make bench` runs every benchmark that a fragment hangs on it.
bench: bench-spark

spark-test: $(STAMP) ## the Spark tier only (tests/spark, one local SparkSession)
	$(PY) -m pytest tests/spark

typecheck-spark: $(STAMP) ## mypy (strict) on spark_glue (package, Glue entry points, zip builder) and tests/spark
	$(PY) -m mypy spark_glue tests/spark
