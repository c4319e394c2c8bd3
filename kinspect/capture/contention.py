"""Whether the calling thread waits for a core: its share of run-queue waiting, from Linux's schedstat."""

from __future__ import annotations

SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_times(path: str = SCHEDSTAT) -> tuple[int, int] | None:
    """(ns run on a CPU, ns waited on a run queue) of the calling thread so far; None where Linux does not say
    (not Linux, or a kernel without schedstat)."""
    try:
        with open(path, "rb") as f:
            ran, waited, _ = f.read().split()
        return int(ran), int(waited)
    except (OSError, ValueError):
        return None


class WaitShare:
    """The share of its time a thread waited for a core, measured over stretches of its work (start() and stop()
    around each), judged once every `window` ns of running and waiting: `contended` is whether the last judged
    window waited `threshold` of its time or more (False until one is judged). Where the thread's times are
    unknown it is contended."""

    def __init__(self, threshold: float, window_ns: int, path: str = SCHEDSTAT) -> None:
        self.threshold = threshold
        self.window_ns = window_ns
        self.path = path
        self.contended = False
        self.share: float | None = None  # the last judged window's
        self._mark: tuple[int, int] | None = None
        self._ran = self._waited = 0

    def start(self) -> None:
        self._mark = thread_times(self.path)
        if self._mark is None:
            self.contended = True

    def stop(self) -> None:
        mark, self._mark = self._mark, None
        now = thread_times(self.path) if mark is not None else None
        if now is None:
            return
        self._ran += now[0] - mark[0]
        self._waited += now[1] - mark[1]
        total = self._ran + self._waited
        if total >= self.window_ns:
            self.share = self._waited / total
            self.contended = self.share >= self.threshold
            self._ran = self._waited = 0
