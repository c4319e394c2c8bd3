# kinspect's commands: `make test` (what CI runs), `make bench`, `make specs`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench specs clean

$(STAMP): pyproject.toml $(wildcard setup.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,proxy]'
	touch $(STAMP)

# Installs what the tests need, then runs them all. pytest's "no tests ran" (exit 5) fails.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

# Every benchmark, printing ratios against the peers measured in the same run.
bench: $(STAMP)
	$(PY) benchmarks/bench_codec.py

# Rebuild specs/ from the Apache Kafka message definitions beside the checkout.
specs: $(STAMP)
	$(VENV)/bin/kinspect specs import ../shared/kafka-specs/3.9.2 ../shared/kafka-specs/4.3.1 --out specs

clean:
	rm -rf $(VENV) build *.egg-info kinspect/protocol/*.so
