# kinspect's commands: `make test` (what CI runs), `make bench`, `make specs`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench specs clean run

$(STAMP): pyproject.toml $(wildcard setup.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,proxy,pipeline]'
	touch $(STAMP)

# Debian packages the tests run (installed when root), as command:package: prometheus gives
# promtool and a real Prometheus; podman, runc and debootstrap build and run the container image.
SYSDEPS := $(VENV)/.sysdeps
SYSDEP_COMMANDS := promtool:prometheus podman:podman runc:runc debootstrap:debootstrap
$(SYSDEPS): Makefile
	@missing=""; for pair in $(SYSDEP_COMMANDS); do cmd=$${pair%%:*}; \
	  command -v $$cmd >/dev/null 2>&1 || test -x /usr/sbin/$$cmd || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (as root: apt-get install$$missing)" >&2; exit 1; fi; \
	fi
	mkdir -p $(VENV) && touch $(SYSDEPS)

# aiokafka 0.12.0 beside the venv's current aiokafka: the last release whose api_version setting
# still forces old protocol versions (tests/upgrade runs it in a subprocess).
OLD_AIOKAFKA := $(VENV)/aiokafka-0.12.0
$(OLD_AIOKAFKA)/aiokafka: $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(OLD_AIOKAFKA) aiokafka==0.12.0

# Installs what the tests need, then runs them all. pytest's "no tests ran" (exit 5) fails.
test: $(STAMP) $(SYSDEPS) $(OLD_AIOKAFKA)/aiokafka
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

# Every benchmark, printing ratios against the peers measured in the same run.
# bench_proxy.py measures haproxy beside kinspect: Debian's haproxy package (installed when root).
bench: $(STAMP)
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; \
	  else echo "haproxy is missing: install Debian's haproxy package (as root: apt-get install haproxy)" >&2; exit 1; fi; }
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Rebuild specs/ from the Apache Kafka message definitions beside the checkout.
specs: $(STAMP)
	$(VENV)/bin/kinspect specs import ../shared/kafka-specs/3.9.2 ../shared/kafka-specs/4.3.1 --out specs
	$(PY) -m kinspect.protocol.api_key_table > kinspect/protocol/api_keys.py

# The one-command demo: Tansu with kinspect in front of it (rewrite mode), a sample workload
# and its summary, then serving until Ctrl-C. Only what the demo needs is installed.
# Flags of `kinspect demo` go in DEMO_ARGS: make run DEMO_ARGS="--port-base 19092".
RUN_STAMP := $(VENV)/.installed-run
$(RUN_STAMP): pyproject.toml $(wildcard setup.py)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make run: installing kinspect and the demo's packages into $(VENV) (quietly)"
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[proxy,demo]'
	@touch $(RUN_STAMP)

run: $(RUN_STAMP)
	@exec $(VENV)/bin/kinspect demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info kinspect/protocol/*.so
