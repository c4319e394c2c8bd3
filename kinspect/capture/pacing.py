"""Pacing the capture writer process (capture.writer_priority = "idle"): short naps between short slices of its work.

On a machine whose few cores the proxy, its clients and the broker keep busy, the writer process building a
batch (a few ms) or writing a row group (30 ms and more in one pyarrow call) held a core in one stretch, and
the round trips in flight meanwhile came back 1-3 ms late at p99, at nice +10 and under SCHED_IDLE alike. A
process that works 0.2-0.3 ms at a time and naps between costs them far less at the same share of the CPU:
each nap leaves its core idle, and the scheduler moves a waiting task there at once (docs/performance.md,
twentieth section). The naps come from a timer signal, in C (`_pace`) so that they interrupt pyarrow's calls
too; the Python fallback (SIGALRM and a Python handler) naps only between Python bytecodes, and only on the
main thread (elsewhere it does not pace). Where pacing cannot start (no timers, its signal taken), the work
goes on unpaced, said once in the log.

The writer paces every batch it works on in the idle class. It once paced only while its own thread waited for a
core half its time or more, since on one connection of a quiet machine the naps cost about 0.08 ms at p99; but the
idle class ranks it only against the tasks of its own scheduling group. A client, a broker or anything in another
container (cgroup), or another session where Linux groups sessions (autogroup), waits behind the writer's stretch as
behind any task, up to a 4 ms tick, while the writer itself seldom waits: beside eight connections at 2,000
requests a second in all it paced too seldom, and their p99 paid for it (docs/performance.md, twenty-fifth section).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from kinspect.protocol.codec.wire_program import optional_extension

log = logging.getLogger("kinspect.capture")

# A slice of 0.2 ms and a nap of 0.1 ms: of the slices and naps tried beside eight connections' round trips
# (0.1-0.3 ms, 0.05-0.15 ms), the lowest p99 and p50 both. Busy, the writer works two thirds of the time (in C
# the paced thread's timer slack is 1 µs; the Python fallback's naps take Linux's default 50 µs more), which
# gives more rows/s than the capture needs (docs/performance.md).
SLICE_SECONDS = 0.0002
NAP_SECONDS = 0.0001


class Pacer:
    """A context manager: the thread inside it naps `nap` seconds at the end of every `slice` seconds (wall time)
    in which it ran half a slice of CPU at least; with `idle_only`, only while it is in the idle scheduling class
    (a writer lifted out of it has fallen behind and must catch up: capture.writer_priority)."""

    def __init__(self, slice_seconds: float = SLICE_SECONDS, nap_seconds: float = NAP_SECONDS,
                 native: bool = True, idle_only: bool = False) -> None:
        if slice_seconds <= 0 or not 0 < nap_seconds < 1:
            raise ValueError(f"capture pacing: slice {slice_seconds!r} s, nap {nap_seconds!r} s")
        self.slice_seconds = slice_seconds
        self.nap_seconds = nap_seconds
        self.idle_only = idle_only
        self.naps = 0  # naps taken inside this pacer
        self._native = optional_extension("kinspect.capture._pace") if native else None
        self._naps_before = 0
        self._previous = None  # the SIGALRM handler the Python fallback replaced
        self._python_armed = False
        self._cpu_mark = 0.0  # the Python fallback's thread CPU time as its slice began
        self.off: str | None = None  # why it stopped pacing, where it could not (the work goes on unpaced)

    @property
    def native(self) -> bool:
        return self._native is not None

    def __enter__(self) -> Pacer:
        if self.off is not None:
            return self
        if self._native is not None:
            self._naps_before = self._native.naps()
            try:
                self._native.arm(round(self.slice_seconds * 1e9), round(self.nap_seconds * 1e9), self.idle_only)
            except (OSError, RuntimeError) as exc:  # no timers here (a sandbox), or the signal taken
                self._stop_pacing(str(exc))
        elif threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
                self._stop_pacing("SIGALRM is in use")
                return self
            self._previous = signal.signal(signal.SIGALRM, self._nap_python)
            self._cpu_mark = time.thread_time()
            self._python_armed = True
            signal.setitimer(signal.ITIMER_REAL, self.slice_seconds)
        return self

    def _stop_pacing(self, reason: str) -> None:
        self.off, self._native = reason, None
        log.warning("capture writer: working unpaced (%s)", reason)

    def __exit__(self, *exc) -> None:
        if self._native is not None:
            self._native.disarm()
            self.naps += self._native.naps() - self._naps_before
        elif self._python_armed:
            self._python_armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)

    def _nap_python(self, signum, frame) -> None:
        # as in C: no nap after a slice spent mostly waiting for a core
        if time.thread_time() - self._cpu_mark >= self.slice_seconds / 2 and (
                not self.idle_only or os.sched_getscheduler(0) == os.SCHED_IDLE):
            time.sleep(self.nap_seconds)
            self.naps += 1
        self._cpu_mark = time.thread_time()
        if self._python_armed:  # the next slice counts from the end of this one's nap, as in C
            signal.setitimer(signal.ITIMER_REAL, self.slice_seconds)
