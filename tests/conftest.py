"""Shared fixtures (one codec for the whole run), Hypothesis's settings for the suite, and how the run is spread over pytest-xdist workers."""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

import hypothesis.core
import pytest
from hypothesis import settings

from kinspect.protocol.codec import Codec
from tests.support.spark import spark  # noqa: F401  (the session-wide SparkSession fixture)


# The installs the tests run (pip, pipx, `make run` from a clean clone) skip byte-compiling what they
# install: nothing they check depends on it, and it was 40% of their CPU (`pip install .[pipeline]`
# into a fresh venv: 37 s of user time with it, 22 without). pip reads a false PIP_COMPILE as
# --no-compile; a container image build does not inherit it and compiles as a user's does.
os.environ.setdefault("PIP_COMPILE", "0")

# No example database: `make test` runs on a clean checkout with pytest's cache off, so no saved
# example is ever replayed, while saving and looking them up cost every test. A failure prints
# its example and a @reproduce_failure line to replay it.
settings.register_profile("kinspect", database=None)
settings.load_profile("kinspect")
# Hypothesis hashes a test's source (tokenize, ast.parse) on every run of it, for the database
# key: once per parametrized case, thousands of times in the codec's exhaustive tests. The hash
# depends on the function alone, so it is remembered per function.
if hasattr(hypothesis.core, "function_digest"):
    hypothesis.core.function_digest = functools.lru_cache(maxsize=None)(hypothesis.core.function_digest)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # around Hypothesis's own pytest_runtest_call
def pytest_runtest_call(item: pytest.Item):
    """Each parametrized case of a Hypothesis test starts from the test's own settings.

    Hypothesis's pytest plugin (6.170.17) gives each case new settings whose parent is the settings
    the case before left on the function, so the chain grows by one a case. `settings.database`
    caches its value per layer, except None (our profile's), which every lookup then fetches
    through the whole chain, quadratic in the cases: 11% of py-spy's samples of
    `test_codec_roundtrip.py` (722 cases), 0.1% with the chain reset. CPU time of the module
    alone, 3 runs each interleaved: 39.1-44.4 s -> 34.6-38.3 s; `test_crosscheck_kio.py`, 2 each:
    81.4-86.7 s -> 72.9-82.3 s.
    """
    obj = getattr(item, "obj", None)
    function = getattr(obj, "__func__", obj)  # a method's function: where the plugin sets them
    own = getattr(function, "_hypothesis_internal_use_settings", None)
    yield
    if own is not None:
        function._hypothesis_internal_use_settings = own


@pytest.fixture(scope="session")
def codec() -> Codec:
    return Codec()


@functools.lru_cache(maxsize=None)  # per fixture function: asked once per test, 6,000 times per collection
def _is_own(func, root: Path) -> bool:
    """A fixture the project defines (pytest's and plugins' fixtures are cheap to build per worker)."""
    try:
        path = Path(inspect.getfile(func)).resolve()
    except (TypeError, OSError):
        return False
    return path.is_relative_to(root) and "site-packages" not in path.parts


def _shared_by(item: pytest.Item, root: Path) -> set[str]:
    """What expensive fixtures broader than one test this test uses: the project's session fixtures
    (by name), and the module fixtures of an integration test (by module; a unit test's module
    fixture is cheap to build again)."""
    info = getattr(item, "_fixtureinfo", None)
    shared: set[str] = set()
    if info is None:
        return shared
    for name in item.fixturenames:
        fixturedefs = info.name2fixturedefs.get(name)
        if not fixturedefs or name == "codec" or not _is_own(fixturedefs[-1].func, root):
            continue
        scope = fixturedefs[-1].scope
        if scope == "session":
            shared.add(name)
        elif scope in ("package", "module", "class") and item.get_closest_marker("integration"):
            shared.add(item.nodeid.split("::", 1)[0])
    return shared


def _groups(items: list[pytest.Item], root: Path) -> dict[pytest.Item, str]:
    """The xdist group of each test that shares an expensive fixture: tests sharing one run on one
    worker, so it is built once (a SparkSession, a recording, a built wheel or image); fixtures
    that some test uses together join one group (a recording analysed in Spark)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    uses = {item: _shared_by(item, root) for item in items}
    for shared in uses.values():
        names = sorted(shared)
        for other in names:
            parent[find(other)] = find(names[0])
    members: dict[str, set[str]] = {}
    for name in parent:
        members.setdefault(find(name), set()).add(name)
    return {item: "+".join(sorted(members[find(min(shared))])) for item, shared in uses.items() if shared}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("xdist"):  # the marks matter to --dist loadgroup only
        for item, group in _groups(items, config.rootpath.resolve()).items():
            item.add_marker(pytest.mark.xdist_group(group))
    # Tests that start real components first: the long ones begin at once on every worker, and the
    # thousands of quick unit tests fill the gaps at the end (stable sort: order within each kind kept).
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)
