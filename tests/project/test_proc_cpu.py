"""The benchmarks' /proc CPU reading splits a process's own time from its descendants'."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from proc_cpu import CpuMeter, tree_cpu_seconds  # noqa: E402

pytestmark = pytest.mark.integration  # starts Python processes

# Spins until it has used this much CPU itself, says so, and waits to be told to go.
BURN = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()\n"


def test_a_live_child_counts_in_the_tree_not_in_the_own_share():
    own, total = tree_cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"
        own_after, total_after = tree_cpu_seconds(os.getpid())
    finally:
        child.communicate("")
    # The child's 0.3 s is in the tree's share; this process only waited on a pipe meanwhile.
    assert (total_after - total) - (own_after - own) >= 0.25
    assert own <= total and own_after <= total_after


def test_a_gone_process_reads_as_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert tree_cpu_seconds(child.pid) is None
    assert tree_cpu_seconds(None) is None


def test_the_machine_s_busy_time_counts_every_process():
    """CpuMeter's machine share is every process's: a child's 0.3 s of CPU shows in it, measured without a pid."""
    meter = CpuMeter(None).start()
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"
    finally:
        child.communicate("")
    used = meter.stop()
    busy, idle, stolen = used["machine_s"]
    assert busy >= 0.25, used
    assert idle >= 0 and stolen >= 0, used
    assert used["cpu_s"] is None  # no process of its own to read
