"""The writer process's pacer (capture.pacing): naps between slices of work, inside C calls too (the C `_pace`), and
between Python bytecodes (its fallback); nothing it interrupts loses data, and it naps only while armed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

from kinspect.capture.pacing import Pacer
from tests.support.native import native_module
from tests.support.snippet import run_snippet


@pytest.fixture
def pace():
    """The C pacer (a test using it is skipped where KINSPECT_PURE_PYTHON=1; the fallback's tests still run)."""
    module, missing = native_module("kinspect.capture._pace")
    assert module is not None, missing
    return module


def busy_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def busy_cpu(seconds: float) -> None:
    """Python work until this thread has run `seconds` of CPU (naps do not count)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(200))


def thread_cpu_and_wall(work) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    work()
    return time.thread_time() - cpu, time.perf_counter() - wall


def test_naps_inside_one_c_call(pace):
    # One zlib call of about 0.1-0.3 s: Python gets no bytecode in between, the C pacer naps anyway.
    data = os.urandom(1 << 16) * 96
    pacer, out = Pacer(0.001, 0.0005), []
    with pacer:
        cpu, wall = thread_cpu_and_wall(lambda: out.append(zlib.compress(data, 9)))
    assert zlib.decompress(out[0]) == data
    slices = wall / (0.001 + 0.0005)
    assert pacer.naps >= max(3, slices / 4), (pacer.naps, wall)
    # it slept: the thread's CPU time falls short of the call's wall time by the naps' part at least
    assert wall - cpu >= 0.5 * pacer.naps * 0.0005, (wall, cpu, pacer.naps)


def test_no_naps_once_out(pace):
    pacer = Pacer(0.0005, 0.0001)
    with pacer:
        busy_python(0.02)
    taken = pacer.naps
    assert taken > 0
    before = pace.naps()
    busy_python(0.05)
    assert pace.naps() - before <= 1  # at most a signal sent as it was disarmed
    assert pacer.naps == taken


def test_data_crosses_pipes_and_files_unharmed(pace, tmp_path):
    # Reads that wait and writes of many pages, interrupted every 0.2 ms: SA_RESTART and Python's retries
    # (PEP 475) keep every byte.
    payload = os.urandom(1 << 22)
    r, w = os.pipe()
    got = bytearray()

    def writer():
        time.sleep(0.02)  # the reader waits in read() meanwhile, its timer firing
        view = memoryview(payload)
        while view:
            view = view[os.write(w, view[:65536]):]
        os.close(w)

    feeder = threading.Thread(target=writer)
    pacer = Pacer(0.0002, 0.00005)
    with pacer:
        feeder.start()
        while chunk := os.read(r, 1 << 16):
            got += chunk
        target = tmp_path / "big"
        target.write_bytes(payload * 4)
    feeder.join()
    os.close(r)
    assert bytes(got) == payload
    assert target.read_bytes() == payload * 4
    assert pacer.naps > 0


def test_pacing_moves_to_the_thread_that_arms(pace):
    main_pacer, other_pacer = Pacer(0.0005, 0.0001), Pacer(0.0005, 0.0001)
    other_naps = []

    def other():
        with other_pacer:
            busy_python(0.03)
        other_naps.append(other_pacer.naps)

    with main_pacer:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert other_naps[0] > 0


def test_bad_settings_are_refused(pace):
    with pytest.raises(ValueError, match="capture pacing"):
        Pacer(0.0, 0.0001)
    with pytest.raises(ValueError, match="capture pacing"):
        Pacer(0.001, 2.0)
    with pytest.raises(ValueError, match="capture pacing"):
        pace.arm(0, 1000)


@pytest.mark.integration  # a process of its own
def test_a_signal_in_use_is_not_taken(pace):
    # In a process of its own: once armed, a process keeps its handler, whichever test ran first.
    code = ("import signal, zlib, os\n"
            "signal.signal(signal.SIGRTMIN + 4, lambda *a: print('handler of its own'))\n"
            "from kinspect.capture.pacing import Pacer\n"
            "data = os.urandom(1 << 20)\n"
            "with Pacer() as pacer:\n"
            "    assert zlib.decompress(zlib.compress(data)) == data\n"
            "print(pacer.naps, pacer.off)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0 capture pacing: its signal (SIGRTMIN+4) is already in use\n"
    assert "working unpaced (capture pacing: its signal (SIGRTMIN+4) is already in use)" in result.stderr


def test_python_fallback_naps_between_bytecodes():
    previous = signal.getsignal(signal.SIGALRM)
    pacer = Pacer(0.0005, 0.0002, native=False)
    assert not pacer.native
    with pacer:
        cpu, wall = thread_cpu_and_wall(lambda: busy_python(0.05))
    assert pacer.naps >= 10, pacer.naps
    assert wall - cpu >= 0.5 * pacer.naps * 0.0002
    assert signal.getsignal(signal.SIGALRM) is previous
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_python_fallback_leaves_a_sigalrm_in_use_alone():
    def mine(signum, frame):
        raise AssertionError("not expected to fire")

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        pacer = Pacer(0.0005, 0.0002, native=False)
        with pacer:
            busy_python(0.01)
        assert pacer.naps == 0 and pacer.off == "SIGALRM is in use"
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_python_fallback_off_the_main_thread_does_not_pace():
    naps, errors = [], []

    def run():
        try:
            pacer = Pacer(0.0005, 0.0002, native=False)
            with pacer:
                busy_python(0.02)
            naps.append(pacer.naps)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == [] and naps == [0]


def test_a_nap_longer_than_the_slice_still_lets_the_work_on(pace):
    # The next slice counts from the end of each nap: a timer firing every slice regardless would find
    # the next nap due at the end of each one, and the thread would never work again.
    data = os.urandom(1 << 16) * 16
    done = []

    def work():
        with Pacer(0.0001, 0.0002) as pacer:
            cpu, wall = thread_cpu_and_wall(lambda: zlib.compress(data, 9))
        done.append((cpu, wall, pacer.naps))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)
    assert done, "the paced thread made no progress in 60 s"
    cpu, wall, naps = done[0]
    assert naps > 0
    assert wall < 10 * cpu + 0.5, (cpu, wall, naps)  # at most a nap (with its timer slack) a slice


@pytest.mark.timeout(60, method="thread")  # not SIGALRM: the fallback uses it
def test_python_fallback_with_a_nap_longer_than_the_slice():
    pacer = Pacer(0.0001, 0.0002, native=False)
    with pacer:
        cpu, wall = thread_cpu_and_wall(lambda: busy_cpu(0.02))
    assert pacer.naps > 0
    assert wall < 10 * cpu + 0.5, (cpu, wall, pacer.naps)


@pytest.mark.parametrize("native", [True, False])
def test_no_nap_after_a_slice_spent_waiting(native):
    # A thread that waits out its slices (here blocked; in the idle class on busy cores, behind other tasks)
    # does not nap at their ends: a wait longer than a slice before each run would otherwise make it nap
    # each time it ran, and never work.
    if native:
        module, missing = native_module("kinspect.capture._pace")
        assert module is not None, missing
    pacer = Pacer(0.0005, 0.0002, native=native)
    with pacer:
        time.sleep(0.05)  # a hundred slices, ended without a nap (Python resumes the sleep after each)
    # about 70 napping at the end of every slice; a few may hold half a slice of CPU on busy cores (arming, the
    # wake-ups' handlers: 4 once in CI)
    assert pacer.naps <= 10
    with pacer:
        busy_cpu(0.02)
    assert pacer.naps > 0


@pytest.mark.integration  # a process of its own
@pytest.mark.parametrize("native", [True, False])
def test_idle_only_naps_only_in_the_idle_class(native):
    """A writer lifted out of the idle class (capture.writer_priority) must catch up: with idle_only the pacer naps
    only while its thread is in the idle class. In a process of its own, the normal class first, then the idle
    class, which it needs no right to enter (nor to stay in)."""
    if native:
        module, missing = native_module("kinspect.capture._pace")
        assert module is not None, missing
    code = ("import os\n"
            "from kinspect.capture.pacing import Pacer\n"
            "from tests.capture.test_pacing import busy_cpu\n"
            f"pacer = Pacer(0.0005, 0.0002, native={native}, idle_only=True)\n"
            "assert pacer.native is " + str(native) + "\n"
            "naps = []\n"
            "for enter_idle in (False, True):\n"
            "    if enter_idle:\n"
            "        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "    before = pacer.naps\n"
            "    with pacer:\n"
            "        busy_cpu(0.05)\n"
            "    naps.append(pacer.naps - before)\n"
            "print(*naps)\n")
    normal, idle = map(int, run_snippet(code, timeout=120).split())
    # a hundred slices of work each: none napped in the normal class, most in the idle class (on busy cores a
    # slice may hold under half a slice of CPU, and end without a nap)
    assert normal == 0 and idle >= 10, (normal, idle)
