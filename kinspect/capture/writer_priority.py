"""The capture writer process's scheduling: below the proxy once ready, and lifted again while it falls behind."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import termios
import threading

log = logging.getLogger("kinspect.capture")

# Once ready, the process runs at a lower priority than the proxy (capture.writer_priority): on a sidecar's few
# cores, a batch being built and compressed must not take a core from the forwarding.
#   "low": NICENESS nicer than the proxy.
#   "idle": Linux's idle scheduling class while it works on a batch, paced (capture.pacing): it runs only on a
#     core nothing else wants, so a woken proxy, client or broker never waits behind it. Beside eight
#     connections' round trips this lowered their p99 by about 0.55 ms against "low" (docs/performance.md,
#     twenty-second section). But on cores other work keeps busy an idle process gets almost nothing: where it
#     may leave the class again, it does (GiveWay) while it waits for its input (so that a file is still finished
#     on time) and while that input holds more (it is behind), and the proxy lifts it out mid-batch when the next
#     batch finds it behind (LiftWhenBehind). Where it may not, it stays in the class: its queue fills and drops
#     rows, counted.
#   "auto" (the default): "idle" where the process may leave the idle class again (CAP_SYS_NICE, or an
#     RLIMIT_NICE that allows NICENESS nicer than the proxy), else "low": never a writer that can starve.
# Start-up (pyarrow's import, its warm-up) runs at the proxy's priority, before the proxy serves: an idle process
# could take seconds over it on busy cores.
NICENESS = 10

IDLE = "idle class"
NICER = f"nice +{NICENESS}"
UNCHANGED = "the proxy's priority"


def resolve(priority: str) -> tuple[str, bool]:
    """The proxy's side: the writer process's priority, "low" or "idle" ("auto" decided here), and whether it may
    leave the idle class again (and the proxy lift it out)."""
    if priority not in ("idle", "auto"):
        return "low", False
    liftable = may_leave_idle_class()
    return ("idle" if liftable or priority == "idle" else "low"), liftable


def lower_priority(priority: str = "low", liftable: bool = False) -> str:
    """The writer process's side, once: make every thread of this process NICENESS nicer, and for "idle" where the
    process may not leave the idle class again, put them in it for good (where it may, GiveWay moves them in and
    out); says which they got (IDLE, NICER, or UNCHANGED where even the niceness is refused). Linux keeps both per
    thread, and pyarrow's start-up left threads of its own. Nicer first: leaving the idle class then needs only
    the right to run at that niceness, not at the proxy's."""
    try:
        _each_thread(os.getpid(), lambda tid: os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS)))
    except OSError:  # not allowed here: the process runs at the proxy's priority
        return UNCHANGED
    if priority != "idle":
        return NICER
    if liftable:
        return IDLE
    try:
        _each_thread(os.getpid(), set_idle)
    except (AttributeError, OSError):  # not Linux, or refused
        return NICER
    return IDLE


def set_idle(tid: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def set_normal(tid: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def may_leave_idle_class() -> bool:
    """Whether a thread of this process (and so of a process it starts), made NICENESS nicer and put in the idle
    class, may go back to the normal class (Linux allows it with CAP_SYS_NICE, or where RLIMIT_NICE allows that
    niceness). Tried on a thread of its own that ends with the answer: on the calling thread a refusal would
    leave it in the idle class."""
    answer = []

    def probe() -> None:
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS))
            set_idle(tid)
            set_normal(tid)
            answer.append(True)
        except (AttributeError, OSError):
            answer.append(False)

    thread = threading.Thread(target=probe, name="kinspect-capture-probe")
    thread.start()
    thread.join()
    return answer == [True]


def _each_thread(pid: int, change) -> None:
    """change(thread id) for every thread of process pid (the calling thread alone, 0, where /proc does not list
    them)."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [0] if pid == os.getpid() else []
    for tid in threads:
        try:
            change(tid)
        except ProcessLookupError:  # it ended meanwhile
            pass


_INT = struct.Struct("i")


def waiting_bytes(fd: int) -> int:
    """Bytes a pipe holds unread (FIONREAD; either end of it)."""
    return _INT.unpack(fcntl.ioctl(fd, termios.FIONREAD, bytes(_INT.size)))[0]


class GiveWay:
    """The writer process's side, for "idle" where it may leave the class: a context manager its work on a batch
    runs inside; every thread of the process is in the idle class inside it and back in the normal class (at its
    niceness) outside. Two system calls a thread, a batch. Where the return is refused (the right taken away
    meanwhile), it stays in the idle class from then on, and where entering fails, in the normal class; said once
    in the log."""

    def __init__(self) -> None:
        self.refused = False  # it moves no more

    def __enter__(self) -> GiveWay:
        if not self.refused:
            try:
                _each_thread(os.getpid(), set_idle)
            except OSError as exc:  # not for want of rights (entering the class is always allowed): leave it be
                self.refused = True
                log.warning("capture writer: staying in the normal class; entering the idle class failed (%s)", exc)
        return self

    def __exit__(self, *exc) -> None:
        if self.refused:
            return
        try:
            _each_thread(os.getpid(), set_normal)
        except OSError as exc:
            self.refused = True
            log.warning("capture writer: staying in the idle class; leaving it was refused (%s)", exc)


class LiftWhenBehind:
    """The proxy's side, for an idle writer process that may leave the class: every thread of it goes to the normal
    class (at its niceness), where it finishes its batch and, while its input holds more, the next (GiveWay), once
    it is behind, perhaps starved mid-batch in the idle class on busy cores:
    - `judge()`, from the proxy's writer thread as it sends a batch (a few µs): the pipe still holds one unread
      (each goes over in one write), so the process is at least a batch behind, and the proxy's queue would fill
      until it dropped rows;
    - `overdue()`, from the thread that reads its reports: it has held a batch for long without taking it in
      (writer_process.OVERDUE_SECONDS), as when no more come after it;
    - `finishing()`, so that its last batch and file get written.
    The process itself could not: it gets no core."""

    def __init__(self, fd: int, pid: int, lift=set_normal) -> None:
        self.fd = fd
        self.pid = pid
        self.lifts = 0  # times it was found behind (a send that found it so after one that did not; a batch overdue)
        self._behind = False
        self._lift = lift
        self._counting = threading.Lock()  # two threads count

    def judge(self) -> None:
        """Before a batch is sent."""
        try:
            behind = waiting_bytes(self.fd) > 0
        except OSError:  # the pipe is closed: the sender finds out
            return
        if behind and self._set() and not self._behind:
            self._count()
        self._behind = behind

    def overdue(self) -> None:
        if self._set():
            self._count()

    def finishing(self) -> None:
        self._set()

    def _count(self) -> None:
        with self._counting:
            self.lifts += 1
            first = self.lifts == 1
        if first:
            log.info("capture: the writer process fell behind; out of the idle class until it catches up "
                     "(logged once)")

    def _set(self) -> bool:
        try:
            _each_thread(self.pid, self._lift)
        except OSError as exc:  # the right was taken away meanwhile: it stays as it is
            log.warning("capture: could not move the writer process out of the idle class (%s)", exc)
            return False
        return True
