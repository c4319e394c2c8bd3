"""What the tests of the C extensions share: importing one (a test module skipped only when the Python is forced), and a leak check."""

from __future__ import annotations

import gc
import importlib
import os
import tracemalloc
from types import ModuleType
from typing import Callable

import pytest

from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV


def native_module(name: str) -> tuple[ModuleType | None, str]:
    """The C extension `name` and "", or None and why it is missing: the tests using it then fail,
    never skip (CI installs with a compiler). The calling test module is skipped while it is being
    imported when KINSPECT_PURE_PYTHON=1 forces the pure-Python paths."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        pytest.skip(f"{PURE_PYTHON_ENV}=1 forces the pure-Python paths", allow_module_level=True)
    try:
        return importlib.import_module(name), ""
    except ImportError as exc:
        return None, f"{name} is not built ({exc}); reinstall with a C compiler or set {PURE_PYTHON_ENV}=1"


def bytes_grown(rounds: Callable[[], None], times: int = 3) -> int:
    """The memory still allocated after `times` more calls of `rounds` than after a first one (a leak grows it)."""
    rounds()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(times):
            rounds()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
