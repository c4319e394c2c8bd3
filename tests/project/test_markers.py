"""`make test-fast` runs the unit tests only: what starts a broker, Prometheus, Spark or a subprocess is `integration`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

# What a test does when it starts something outside the interpreter (the broker, Prometheus and
# Spark are all subprocesses, started through these).
_STARTS = re.compile(r"\b(TansuBroker\(|ProxyRig\(|subprocess\.(run|Popen|check_output|check_call)\(|Popen\(|"
                     r"spark_session\(|SparkSession|PrometheusServer\(|promtool)")


def test_make_test_fast_is_the_unit_selection():
    makefile = (ROOT / "Makefile").read_text("utf-8")
    rule = makefile.split("\ntest-fast:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not integration"' in rule and "no tests ran" in rule
    assert "-p tests.support.sample_cases" in rule and "-n auto" in rule
    assert re.search(r'^    "integration: ', (ROOT / "pyproject.toml").read_text("utf-8"), re.M)


def test_modules_that_start_processes_mark_them():
    """A test module that starts a broker, Spark, Prometheus or a subprocess marks those tests integration."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text("utf-8")
        if _STARTS.search(text) and "integration" not in text:
            unmarked.append(str(path.relative_to(ROOT)))
    assert unmarked == []


@pytest.mark.integration
@pytest.mark.timeout(600)  # two collections, on shared cores
def test_make_test_fast_leaves_out_integration_tests():
    """The selection `make test-fast` runs (and the documented one-folder run) collects no integration test."""
    collect = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
    # One collection: what -m "not integration" keeps, and (named by a plugin) what it leaves out.
    fast = subprocess.run([*collect, "-m", "not integration", "-p", "tests.support.report_deselected"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    assert fast.returncode == 0, fast.stdout[-3000:]
    lines = fast.stdout.splitlines()
    slow_ids = {line.removeprefix("deselected: ") for line in lines if line.startswith("deselected: ")}
    fast_ids = {line for line in lines if "::" in line and not line.startswith("deselected: ")}
    assert len(fast_ids) > 1000 and len(slow_ids) > 50
    assert not fast_ids & slow_ids
    # Whole modules that only run real components are all on the integration side.
    for module in ("tests/proxy/test_proxy_integration.py", "tests/project/test_install.py",
                   "tests/demo/test_make_run.py::test_make_run_from_a_clean_clone"):
        assert not any(i.startswith(module) for i in fast_ids), module
        assert any(i.startswith(module) for i in slow_ids), module
    # docs/testing.md's one-folder run.
    folder = subprocess.run([*collect, "tests/protocol"], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert folder.returncode == 0 and re.search(r"^\d+ tests collected", folder.stdout, re.M), folder.stdout[-2000:]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_passing_run_leaves_nothing_in_the_temp_folder(tmp_path):
    """pyproject.toml's retention policy: a passing test's tmp_path is removed, a failing one's kept."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_sample.py").write_text(
        "def test_passes(tmp_path):\n    (tmp_path / 'big').write_bytes(b'x' * 100_000)\n\n"
        "def test_fails(tmp_path):\n    (tmp_path / 'evidence').write_text('kept')\n    assert False\n")
    base = tmp_path / "base"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                             str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), f"--basetemp={base}",
                             str(tests)], capture_output=True, text=True, timeout=100)
    assert "1 failed, 1 passed" in result.stdout, result.stdout[-2000:]
    left = sorted(p.name for p in base.rglob("*") if p.is_file())
    assert left == ["evidence"], left


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_test_fast_samples_only_exhaustive_parametrisations(tmp_path):
    """sample_cases keeps one case in 8 of a function with more than 40, and every case of the others."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', range(100))\ndef test_exhaustive(n):\n    pass\n\n"
        "@pytest.mark.parametrize('n', range(40))\ndef test_small(n):\n    pass\n\n"
        "def test_plain():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                             "tests.support.sample_cases", "--rootdir", str(tmp_path), str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=100)
    # 13 of the 100 (cases 0, 8, ..., 96), all 40 of the small one, the plain test.
    assert "54 passed, 87 deselected" in result.stdout, result.stdout[-2000:]
    assert "87 cases of exhaustive parametrisations left out" in result.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tests_sharing_an_expensive_fixture_run_on_one_worker(tmp_path):
    """make test's `-n N --dist loadgroup`: tests/conftest.py groups the tests of a session fixture on one
    worker (a second SparkSession per worker cost minutes). Fails if an upgrade of pytest or xdist
    stops the grouping silently, as pytest 9.2 did with xdist 3.8 (pytest-xdist issue 1386)."""
    rule = (ROOT / "Makefile").read_text("utf-8").split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "-n $(TEST_WORKERS) --dist loadgroup" in rule
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef expensive():\n    return object()\n")
    (tmp_path / "test_grouping.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', range(6))\ndef test_shared(expensive, n):\n    pass\n\n"
        "@pytest.mark.parametrize('n', range(6))\ndef test_alone(n):\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "-n", "3", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert "12 passed" in result.stdout, result.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED .*::(test_\w+)\[", result.stdout, re.M)
    shared = {worker for worker, test in ran if test == "test_shared"}
    assert len([1 for _, test in ran if test == "test_shared"]) == 6 and len(shared) == 1, result.stdout[-3000:]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_parametrized_hypothesis_cases_do_not_stack_their_settings(tmp_path):
    """tests/conftest.py puts a Hypothesis test's own settings back after each parametrized case:
    Hypothesis's pytest plugin layers each case's settings on the ones the case before left, and
    with the suite's database=None every lookup walked the chain (quadratic in the cases)."""
    (tmp_path / "test_chain.py").write_text(
        "import pytest\nfrom hypothesis import given, settings, strategies as st\n\nDEPTHS = []\n\n"
        "@pytest.mark.parametrize('n', range(30))\n@settings(max_examples=1)\n@given(x=st.integers())\n"
        "def test_case(n, x):\n"
        "    layer, depth = test_case._hypothesis_internal_use_settings, 0\n"
        "    while layer is not None:\n        depth, layer = depth + 1, layer._fallback\n"
        "    DEPTHS.append(depth)\n\n"
        "def test_depths():\n    print('DEPTHS', sorted(set(DEPTHS)))\n    assert len(DEPTHS) >= 30\n"
        "    assert max(DEPTHS) - min(DEPTHS) <= 1, DEPTHS\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "-p", "no:xdist", "--rootdir", str(tmp_path), str(tmp_path / "test_chain.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert "31 passed" in result.stdout, result.stdout[-3000:]
