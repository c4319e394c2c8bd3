"""pytest plugin for `make test-fast`: run one case in SAMPLE of each exhaustive parametrisation.

The codec's tests run once per api, version and direction (hundreds of cases per test
function); `make test` runs every case. `make test-fast` loads this plugin
(`-p tests.support.sample_cases`) so that a test function with more than THRESHOLD cases keeps
every SAMPLE-th of them, in collection order (which spreads them over the apis and versions),
and says how many it left out. Which cases run is fixed, never random.
"""

from __future__ import annotations

from collections import defaultdict

THRESHOLD = 40  # a test function with more cases than this is exhaustive
SAMPLE = 8  # ... and keeps one case in SAMPLE


def pytest_collection_modifyitems(config, items):
    cases = defaultdict(list)
    for item in items:
        if hasattr(item, "callspec"):
            cases[(item.path, item.originalname)].append(item)
    dropped = set()
    for group in cases.values():
        if len(group) > THRESHOLD:
            dropped.update(id(item) for i, item in enumerate(group) if i % SAMPLE)
    if not dropped:
        return
    config.hook.pytest_deselected(items=[item for item in items if id(item) in dropped])
    items[:] = [item for item in items if id(item) not in dropped]
    config._sampled_cases = len(dropped)


def pytest_report_header(config):
    return f"sample_cases: test functions with more than {THRESHOLD} cases run one case in {SAMPLE} (make test runs all)"


def pytest_terminal_summary(terminalreporter, config):
    dropped = getattr(config, "_sampled_cases", 0)
    if dropped:
        terminalreporter.write_line(f"sample_cases: {dropped} cases of exhaustive parametrisations left out "
                                    f"(one in {SAMPLE} run); make test runs them all")
