# Spark reports (spark_glue/): the zip the Glue jobs import, the benchmark, a strict type check
# (joins `make test`). The Spark tests themselves run in `make test` with the rest of tests/.
# They load the report pages in headless Chromium: `make test` installs Debian's chromium
# package when it is missing (as root), else stops and says what to install.
.PHONY: glue-zip bench-spark spark-test typecheck-spark bench chromium

GLUE_ZIP := build/glue/delayq_reports.zip
BENCH_ROWS ?= 1

CHROMIUM ?= /usr/bin/chromium
# The page tests (tests/spark/pages.py) use the same binary.
export DELAYQ_CHROMIUM := $(CHROMIUM)

TEST_CHECKS += typecheck-spark chromium

$(GLUE_ZIP): spark_glue/glue_zip.py $(wildcard spark_glue/delayq_reports/*.py)
	$(PY) spark_glue/glue_zip.py $@

glue-zip: $(STAMP) $(GLUE_ZIP) ## build build/glue/delayq_reports.zip (the Glue jobs' --extra-py-files)

bench-spark: $(STAMP) ## both report jobs on BENCH_ROWS million synthetic export rows (default 1): rows/s
	$(PY) -m delayq_reports.bench --rows $(BENCH_ROWS)

# `make bench` runs every benchmark that a fragment hangs on it.
bench: bench-spark

chromium: $(CHROMIUM) ## headless Chromium for the report page tests (apt-get install as root)

# The binary is the stamp: installed once, never again while it exists.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium (Debian package) for the report page tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium; \
	else \
	  echo "the report page tests need headless Chromium at $@: as root, run" \
	    "'apt-get install -y --no-install-recommends chromium' (Debian), or pass" \
	    "CHROMIUM=/path/to/chromium" >&2; \
	  exit 1; \
	fi
	@test -x $@ || { echo "apt-get installed chromium but $@ is still missing" >&2; exit 1; }

spark-test: $(STAMP) $(CHROMIUM) ## the Spark tier only (tests/spark, one local SparkSession)
	$(PY) -m pytest tests/spark

typecheck-spark: $(STAMP) ## mypy (strict) on spark_glue (package, Glue entry points, zip builder) and tests/spark
	$(PY) -m mypy spark_glue tests/spark
