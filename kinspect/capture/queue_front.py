"""The capture queue's event-loop end: facts taken and queued within the bounds, counted, the writer woken (C in capture._take)."""

from __future__ import annotations

from kinspect.protocol.codec.wire_program import optional_extension


class QueueFront:
    """What the event loop does for each exchange a capture keeps (the reference of capture._take.QueueFront).

    front(exchange): take(exchange) -> (facts, bytes they hold), then offer them. A take that raises
    is counted (fact_errors), the first one handed to on_error(exception), and never raised.
    front.offer(facts, nbytes) -> bool: append facts to the queue, or drop them (counted) when it holds
    queue_rows exchanges, or would hold more than queue_bytes, or is closed. wake() is called as the
    queue's length reaches wake_at's first or second value, and as the bytes held pass half the bound:
    the writer thread sleeps until then.

    Bytes held = offered_bytes - taken_bytes; each counter has one writer (the loop, the writer thread),
    so neither update can be lost to the other.
    """

    __slots__ = ("queue", "queue_rows", "queue_bytes", "take", "on_error", "offered_bytes", "taken_bytes",
                 "accepted", "dropped", "fact_errors", "closed", "_append", "_wake", "_wake_at")

    def __init__(self, queue, queue_rows: int, queue_bytes: int, wake_at: tuple[int, int], wake, take,
                 on_error) -> None:
        self.queue, self.queue_rows, self.queue_bytes = queue, queue_rows, queue_bytes
        self.take, self.on_error = take, on_error
        self.offered_bytes = self.taken_bytes = self.accepted = self.dropped = self.fact_errors = 0
        self.closed = False
        self._append, self._wake, self._wake_at = queue.append, wake, wake_at

    def offer(self, facts, nbytes: int = 0) -> bool:
        queue = self.queue
        if len(queue) >= self.queue_rows or self.closed or \
                self.offered_bytes - self.taken_bytes + nbytes > self.queue_bytes:
            self.dropped += 1
            return False
        self._append(facts)
        self.offered_bytes += nbytes
        self.accepted += 1
        held, half = self.offered_bytes - self.taken_bytes, self.queue_bytes // 2
        if len(queue) in self._wake_at or held - nbytes < half <= held:
            self._wake()
        return True

    def __call__(self, exchange) -> None:
        try:
            facts, nbytes = self.take(exchange)
        except Exception as exc:  # a bug in taking facts: counted, never raised into the loop
            self.fact_errors += 1
            if self.fact_errors == 1 and self.on_error is not None:
                try:
                    self.on_error(exc)
                except Exception:  # the log failed: the error is still counted
                    pass
            return
        self.offer(facts, nbytes)


def queue_front(queue, queue_rows: int, queue_bytes: int, wake_at: tuple[int, int], wake, take=None,
                on_error=None, native: bool = True):
    """The queue's front: capture._take.QueueFront where built (and native), else QueueFront."""
    module = optional_extension("kinspect.capture._take") if native else None
    kind = getattr(module, "QueueFront", None) or QueueFront
    return kind(queue, queue_rows, queue_bytes, wake_at, wake, take, on_error)
