"""No import runs back up a layer: protocol <- session <- proxy / observers / capture <- app <- cli, demo."""

from __future__ import annotations

import ast
import collections

from tests.support.paths import ROOT

# Each part of kinspect and the parts it may import (besides itself). `kinspect` is the
# package's own __init__ (its version).
ALLOWED = {
    "protocol": set(),
    "config": set(),
    "session": {"protocol"},
    "logs": {"session"},
    "proxy": {"protocol", "session", "config"},
    "upgrade": {"protocol", "session"},
    "observers": {"protocol", "session", "logs", "upgrade", "kinspect"},
    "capture": {"protocol", "session"},
    "offline_decode": {"protocol", "session"},
    "pcap": {"protocol", "session", "capture", "offline_decode", "config"},
    "analyze": {"capture", "protocol", "upgrade"},
    "app": {"protocol", "session", "proxy", "observers", "capture", "upgrade", "config", "logs"},
    "demo": {"app", "protocol", "session", "config", "logs"},
    "cli": {"protocol", "session", "proxy", "observers", "capture", "upgrade", "config", "logs", "app", "demo",
            "analyze", "pcap", "offline_decode", "kinspect"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kinspect"


def imports_between_parts() -> dict[str, set]:
    edges: dict[str, set] = collections.defaultdict(set)
    for path in (ROOT / "kinspect").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "kinspect" and _part(name) != _part(module):
                    edges[_part(module)].add((_part(name), str(path.relative_to(ROOT))))
    return edges


def test_no_import_runs_back_up_a_layer():
    edges = imports_between_parts()
    assert set(edges) <= set(ALLOWED), f"parts with no layer: {set(edges) - set(ALLOWED)}"
    wrong = sorted((where, target) for part, found in edges.items() for target, where in found
                   if target not in ALLOWED[part])
    assert not wrong, wrong


def test_the_sans_io_core_imports_no_io():
    """protocol/ and session/ import no asyncio, sockets, logging or metrics."""
    banned = {"asyncio", "socket", "logging", "structlog", "prometheus_client", "uvloop", "ssl", "selectors"}
    for part in ("protocol", "session"):
        for path in (ROOT / "kinspect" / part).rglob("*.py"):
            tree = ast.parse(path.read_text("utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    assert not {n.split(".")[0] for n in names} & banned, (path, names)
