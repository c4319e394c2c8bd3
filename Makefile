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

# Debian's prometheus package gives the tests promtool and a real Prometheus, chromium opens the
# analyze report (both installed when root).
SYSDEPS := $(VENV)/.sysdeps
$(SYSDEPS):
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
	  else echo "promtool is missing: install Debian's prometheus package (as root: apt-get install prometheus)" >&2; exit 1; fi; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install Debian's chromium package (as root: apt-get install chromium)" >&2; exit 1; fi; \
	fi
	mkdir -p $(VENV) && touch $(SYSDEPS)

# Installs what the tests need, then runs them all. pytest's "no tests ran" (exit 5) fails.
test: $(STAMP) $(SYSDEPS)
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
