"""Shared fixtures (one codec for the whole run) and how the run is spread over pytest-xdist workers."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from tests.support.spark import spark  # noqa: F401  (the session-wide SparkSession fixture)


@pytest.fixture(scope="session")
def codec() -> Codec:
    return Codec()


def _is_own(fixturedef, root: Path) -> bool:
    """A fixture the project defines (pytest's and plugins' fixtures are cheap to build per worker)."""
    try:
        path = Path(inspect.getfile(fixturedef.func)).resolve()
    except (TypeError, OSError):
        return False
    return path.is_relative_to(root) and "site-packages" not in path.parts


def _group_of(item: pytest.Item, root: Path) -> str | None:
    """The xdist group of a test: tests sharing an expensive fixture broader than one test run on one
    worker, so that it is built once (a SparkSession, a recording, a container image, a built wheel).
    Grouped: the project's session fixtures, and the module fixtures of integration tests (a unit
    test's module fixture is cheap to build again)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module_group = None
    for name in sorted(item.fixturenames):
        fixturedefs = info.name2fixturedefs.get(name)
        if not fixturedefs or name == "codec" or not _is_own(fixturedefs[-1], root):
            continue
        scope = fixturedefs[-1].scope
        if scope == "session":
            return name  # one session fixture, one worker, wherever its tests live
        if scope in ("package", "module", "class") and item.get_closest_marker("integration"):
            module_group = item.nodeid.split("::", 1)[0]
    return module_group


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("xdist"):  # the marks matter to --dist loadgroup only
        root = config.rootpath.resolve()
        for item in items:
            group = _group_of(item, root)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    # Tests that start real components first: the long ones begin at once on every worker, and the
    # thousands of quick unit tests fill the gaps at the end (stable sort: order within each kind kept).
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)
