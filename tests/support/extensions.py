"""The C extensions setup.py builds, read from its EXTENSIONS table (importing setup.py would run setup())."""

from __future__ import annotations

import ast

from tests.support.paths import ROOT


def c_extensions() -> tuple[str, ...]:
    """Every C extension's module name, in setup.py's order."""
    tree = ast.parse((ROOT / "setup.py").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTENSIONS" for t in node.targets):
            return tuple(module for module, _ in ast.literal_eval(node.value))
    raise AssertionError("setup.py has no EXTENSIONS table")
