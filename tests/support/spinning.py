"""Processes that keep one core busy: for tests of what a thread that waits for its core does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def spinning_on(cpu: int, count: int) -> Iterator[list[subprocess.Popen]]:
    """count Python processes spinning on CPU cpu (and only there) while inside; killed on the way out."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
