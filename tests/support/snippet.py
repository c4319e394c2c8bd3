"""Running a snippet of Python in a fresh interpreter of this Python, from the checkout (what a test may not do in its
own process: leave the idle class, patch os for good)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def run_snippet(code: str, timeout: float = 60) -> str:
    """`code`'s standard output; fails the test, with its standard error, if it exits other than 0."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout
