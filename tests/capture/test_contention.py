"""The writer's thread's waiting for a core (capture.contention), and pacing only while it waits (capture.pacing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kinspect.capture.contention import WaitShare, thread_times
from kinspect.capture.pacing import PacedWhenContended, Pacer
from tests.capture.test_pacing import busy_cpu, busy_python
from tests.support.native import native_module
from tests.support.spinning import spinning_on


class Schedstat:
    """A schedstat file whose times the test sets."""

    def __init__(self, path) -> None:
        self.path = path
        self.set(0, 0)

    def set(self, ran_ns: int, waited_ns: int) -> None:
        self.path.write_text(f"{ran_ns} {waited_ns} 7\n")


def test_the_thread_s_times_grow_with_its_work():
    before = thread_times()
    assert before is not None  # Linux with schedstat: this machine and CI
    busy_cpu(0.05)
    after = thread_times()
    assert after[0] - before[0] >= 40_000_000 and after[1] >= before[1]


def test_times_are_unknown_where_linux_does_not_give_them(tmp_path):
    assert thread_times(str(tmp_path / "missing")) is None
    (tmp_path / "odd").write_text("not numbers\n")
    assert thread_times(str(tmp_path / "odd")) is None


def test_the_share_is_judged_once_a_window(tmp_path):
    stat = Schedstat(tmp_path / "schedstat")
    share = WaitShare(0.5, 10_000, path=str(stat.path))
    share.start()
    stat.set(3_000, 4_000)  # 7 us: not a window yet
    share.stop()
    assert share.share is None and not share.contended
    share.start()
    stat.set(4_000, 6_000)  # 10 us in all, 6 of them waiting
    share.stop()
    assert share.share == 0.6 and share.contended
    stat.set(50_000, 50_000)  # between stretches (the thread waiting for input): not counted
    share.start()
    stat.set(60_000, 52_000)
    share.stop()
    assert share.share == pytest.approx(2 / 12) and not share.contended


def test_unknown_times_make_it_contended(tmp_path):
    share = WaitShare(0.5, 1, path=str(tmp_path / "missing"))
    assert not share.contended
    for _ in range(3):
        share.start()
        busy_python(0.001)
        share.stop()
    assert share.contended and share.share is None


@pytest.mark.integration  # processes of its own, on one core
def test_a_thread_sharing_its_core_with_busy_processes_waits_for_it():
    code = ("import os, time\n"
            "from kinspect.capture.contention import WaitShare\n"
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "share = WaitShare(0.5, 1)\n"
            "share.start()\n"
            "end = time.thread_time() + 0.1\n"
            "while time.thread_time() < end: sum(range(200))\n"
            "share.stop()\n"
            "print(share.share)\n")
    with spinning_on(min(os.sched_getaffinity(0)), 2):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # three runnable processes on one core: each waits about two thirds of its time
    assert float(result.stdout) > 0.4, result.stdout


def test_paced_only_while_contended(tmp_path):
    module, missing = native_module("kinspect.capture._pace")
    assert module is not None, missing
    stat = Schedstat(tmp_path / "schedstat")
    share = WaitShare(0.5, 1_000, path=str(stat.path))
    gate = PacedWhenContended(Pacer(0.0005, 0.0001), wait_share=share)
    with gate:
        busy_python(0.02)
        stat.set(1_000, 0)  # ran all the time
    assert gate.pacer.naps == 0 and not share.contended
    with gate:
        busy_python(0.02)
        stat.set(2_000, 3_000)  # waited most of the time: the next stretch is paced
    assert gate.pacer.naps == 0 and share.contended
    with gate:
        busy_python(0.02)
    assert gate.pacer.naps > 0
