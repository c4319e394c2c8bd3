"""pytest plugin: print the node id of every test a selection (-m, -k) leaves out, one per line."""

from __future__ import annotations


def pytest_deselected(items):
    for item in items:
        print(f"deselected: {item.nodeid}")
