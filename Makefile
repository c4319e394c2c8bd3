# kinspect's commands: `make run` (the demo), `make analyze` (its captures, with Spark),
# `make test` (what CI runs), `make test-fast` (unit tests only), `make bench`, `make specs`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The C extensions (the codec's, the session's, the metrics', the capture's): an edit of these rebuilds them (pip's editable install builds in place).
CSOURCES := $(wildcard kinspect/*.h kinspect/protocol/codec/*.c kinspect/protocol/codec/*.h kinspect/session/*.c kinspect/observers/*.c kinspect/proxy/*.c kinspect/capture/*.c kinspect/analyze/*.c)
# setuptools' "Editable installation" notice is information only: a quiet install stays quiet.
QUIET_BUILD := PYTHONWARNINGS="ignore:Editable installation:UserWarning"

.PHONY: test test-fast bench specs clean run analyze

$(STAMP): pyproject.toml $(wildcard setup.py) $(CSOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=77'
	$(QUIET_BUILD) $(PY) -m pip install --quiet -e '.[test,proxy,pipeline]'
	touch $(STAMP)

# Debian packages the tests use, as command:package: promtool and a real Prometheus; Java 17 for
# Spark (the analyze tests, `make analyze`); socat (docs/commands.md records a conversation with it);
# podman, runc and mmdebstrap build and run the container image; tcpdump and tshark (with
# editcap) record and check the captures of tests/pcap; chromium opens the analyze report.
# Installed when root; otherwise one line says what to install.
SYSTEM_TOOLS := promtool:prometheus java:openjdk-17-jre-headless socat:socat podman:podman runc:runc mmdebstrap:mmdebstrap \
	tcpdump:tcpdump tshark:tshark editcap:tshark chromium:chromium valgrind:valgrind
SYSDEPS := $(VENV)/.sysdeps
$(SYSDEPS): Makefile
	@missing=""; for pair in $(SYSTEM_TOOLS); do cmd=$${pair%%:*}; \
	  command -v $$cmd >/dev/null 2>&1 || test -x /usr/sbin/$$cmd || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing Debian packages the tests need:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (as root: apt-get install$$missing)" >&2; exit 1; fi; \
	fi
	mkdir -p $(VENV) && touch $(SYSDEPS)

# aiokafka 0.12.0 beside the venv's current aiokafka: the last release whose api_version setting
# still forces old protocol versions (tests/upgrade runs it in a subprocess).
OLD_AIOKAFKA := $(VENV)/aiokafka-0.12.0
$(OLD_AIOKAFKA)/aiokafka: $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(OLD_AIOKAFKA) aiokafka==0.12.0

# Spark needs Java 17 or 21 (`make analyze`): Debian's headless JRE, installed when root.
.PHONY: java
java:
	@if ! command -v java >/dev/null 2>&1 && [ -z "$$JAVA_HOME" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing Java 17 for Spark (Debian's openjdk-17-jre-headless)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else echo "java is missing: Spark needs Java 17 or 21 (as root: apt-get install openjdk-17-jre-headless)" >&2; exit 1; fi; \
	fi

# Installs what the tests need, then runs them all. pytest's "no tests ran" (exit 5) fails.
# On TEST_WORKERS pytest-xdist workers: most integration tests wait on brokers and subprocesses,
# so more workers than cores pays; tests sharing an expensive fixture (the SparkSession, a
# recording, a built image) stay on one worker (tests/conftest.py groups them).
# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE=1): every
# worker and every kinspect subprocess the tests start would compile the same modules again.
TEST_WORKERS ?= 4
test: $(STAMP) $(SYSDEPS) $(OLD_AIOKAFKA)/aiokafka
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

# The unit tests only: no broker, Prometheus, Spark or subprocess (those are marked integration),
# on every core (pytest-xdist), one case in 8 of the exhaustive per-api/version parametrisations
# (tests/support/sample_cases.py; make test runs every case).
test-fast: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -m "not integration" -p tests.support.sample_cases -n auto; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

# Every benchmark, printing ratios against the peers measured in the same run.
# bench_proxy.py measures haproxy beside kinspect: Debian's haproxy package (installed when root).
bench: $(STAMP) $(SYSDEPS)
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; \
	  else echo "haproxy is missing: install Debian's haproxy package (as root: apt-get install haproxy)" >&2; exit 1; fi; }
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Rebuild specs/ from Apache Kafka's message definitions: the *.json files of Kafka's source tree,
# clients/src/main/resources/common/message, at the tags 3.9.2 and 4.3.1, with Kafka's LICENSE and
# NOTICE beside them (docs/specs.md). KAFKA_SPECS says where they are.
KAFKA_SPECS ?= ../shared/kafka-specs
specs: $(STAMP)
	@test -d $(KAFKA_SPECS) || { echo "make specs: $(KAFKA_SPECS) does not exist: it holds Kafka's message definitions per release (see docs/specs.md); set KAFKA_SPECS=DIR" >&2; exit 2; }
	$(VENV)/bin/kinspect specs import $(KAFKA_SPECS)/3.9.2 $(KAFKA_SPECS)/4.3.1 --out specs
	$(PY) -m kinspect.protocol.specs.api_key_table > kinspect/protocol/specs/api_keys.py

# The one-command demo: Tansu with kinspect in front of it (rewrite mode), a sample workload
# and its summary, then serving until Ctrl-C. Only what the demo needs is installed.
# Flags of `kinspect demo` go in DEMO_ARGS: make run DEMO_ARGS="--port-base 19092".
RUN_STAMP := $(VENV)/.installed-run
$(RUN_STAMP): pyproject.toml $(wildcard setup.py) $(CSOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make run: installing kinspect and the demo's packages into $(VENV) (quietly)"
	@$(PY) -m pip install --quiet --upgrade pip 'setuptools>=77'
	@$(QUIET_BUILD) $(PY) -m pip install --quiet -e '.[proxy,demo]'
	@touch $(RUN_STAMP)

run: $(RUN_STAMP)
	@exec $(VENV)/bin/kinspect demo $(DEMO_ARGS)

# The demo's next step: the PySpark report on the captures `make run` wrote (ANALYZE_ARGS for more flags).
# Installs the pipeline extra (pyspark) into .venv, and Java as root when it is missing.
DEMO_WORKDIR ?= .kinspect-demo
PIPELINE_STAMP := $(VENV)/.installed-pipeline
$(PIPELINE_STAMP): $(RUN_STAMP)
	@echo "make analyze: installing the pipeline extra (pyspark) into $(VENV) (quietly)"
	@$(QUIET_BUILD) $(PY) -m pip install --quiet -e '.[proxy,demo,pipeline]'
	@touch $(PIPELINE_STAMP)

analyze: $(PIPELINE_STAMP) java
	@exec $(VENV)/bin/kinspect analyze $(DEMO_WORKDIR)/captures --out $(DEMO_WORKDIR)/report $(ANALYZE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info kinspect/protocol/codec/*.so kinspect/capture/*.so
