"""The capture writer: a bounded queue of exchange facts, and a thread that takes them to rotated Parquet files.

The event loop only appends to the queue (`offer`); when the queue holds `queue_rows`
exchanges, or `queue_bytes` bytes (of the facts it holds, as the observer estimates
them), the new one is dropped and counted. The thread takes the facts a batch at a time
(BATCH_ROWS, or what waited BATCH_SECONDS) and hands each batch to where rows are made
and written (capture.sink: record batches, row groups, files rotated by size and age):
- in this process (`process=False`): the thread builds and writes them itself, holding
  the GIL while it builds, so the event loop waits for it at each wake-up;
- in a process of its own (`process=True`, the proxy's default): the thread only encodes
  each batch with the GIL released (capture.facts_wire; pickled a slice at a time where it
  cannot be) and writes it to the writer process's pipe (capture.writer_process), which
  builds and writes the files and reports its counters back.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from pathlib import Path

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.facts import held_total
from kinspect.capture.queue_front import queue_front
from kinspect.capture.sink import ParquetSink

PRIORITIES = ("auto", "low", "idle")  # the writer process's (writer_priority.lower_priority); config checks its own copy

log = logging.getLogger("kinspect.capture")

# The thread sleeps until there is a batch to take: a part batch's BATCH_SECONDS, or the loop's wake-up as
# the queue stops being empty or fills a batch (one Event.set each time, none for the exchanges between),
# and at most IDLE_WAIT, to keep the open file's age (capture.max_file_seconds). Polling every 50 ms
# instead cost an idle proxy 3 ms of CPU a second, each look taking the GIL from the loop (docs/performance.md).
IDLE_WAIT = 1.0
# The longest the event loop waits for the GIL while this thread runs Python code. CPython hands
# the GIL to a waiting thread only after sys.getswitchinterval() (5 ms by default): a busy writer
# would add up to that to each wake-up of the loop, and a forwarded frame needs one or two. At
# 0.1 ms the wait stays well inside the 0.5 ms p99 budget; the cost is a GIL handoff per wake-up
# of the loop while the writer works, the same at any interval. Lowered, never raised, on start,
# whether the rows are built here or in the writer process (for which this thread shares alike sides, and
# pickles a batch the encoder declines).
SWITCH_INTERVAL = 0.0001
# Exchanges per record batch. Each batch costs a fixed ~40 pyarrow calls (one per column, a
# dozen kernels for integer_fields), so tiny batches cost more per row; but each pa.array call
# holds the GIL for its whole column, whatever the switch interval. On the recorded traffic the
# longest (tagged_fields) holds it 0.23 ms at 512 rows, 0.37 ms at 1,024, at the same cost a row.
BATCH_ROWS = 512
# A batch that is not full is built once its first exchange waited this long in the queue.
BATCH_SECONDS = 0.25


class CaptureWriter:
    """Bounded queue + writer thread + where rows are written (in this process or its own), with counters for metrics.

    Counters: rows_accepted (queued), rows_written (in files), rows_dropped (queue full), row_errors (an exchange whose row
    could not be built), fact_errors (its facts could not be taken on the event loop), write_errors (rows lost because a file could not be written,
    or the writer process could not take them), files_written; `queue_depth` is the queue's length now.
    """

    def __init__(self, directory: str | Path, builder: BatchBuilder, *, max_file_bytes: int = 64 * 1024 * 1024,
                 max_file_seconds: float = 300.0, queue_rows: int = 100_000, row_group_rows: int = 10_000,
                 queue_bytes: int = 256 * 1024 * 1024, compression: str | None = "zstd", process: bool = False,
                 warm_facts: tuple | None = None, writer_priority: str = "auto") -> None:
        for name, value in (("max_file_bytes", max_file_bytes), ("max_file_seconds", max_file_seconds),
                            ("queue_rows", queue_rows), ("row_group_rows", row_group_rows),
                            ("queue_bytes", queue_bytes)):
            if value <= 0:
                raise ValueError(f"capture.{name} must be positive, not {value!r}")
        self.directory = Path(directory)
        self.queue_rows = queue_rows
        self.queue_bytes = queue_bytes
        self.row_group_rows = row_group_rows
        self.compression = compression  # Parquet column compression (None: plain, e.g. to search a file's bytes)
        self.process = process  # rows made and written in a process of the writer's own
        self.warm_facts = warm_facts  # one exchange's facts the writer process builds first (capture.warm_up)
        if writer_priority not in PRIORITIES:
            raise ValueError(f"capture.writer_priority must be one of {', '.join(PRIORITIES)}, "
                             f"not {writer_priority!r}")
        self.writer_priority = writer_priority  # the writer process's (capture.writer_priority.lower_priority)
        self._sink = ParquetSink(directory, builder, max_file_bytes=max_file_bytes, max_file_seconds=max_file_seconds,
                                 row_group_rows=row_group_rows, compression=compression)
        self._out = self._sink  # where batches go: the sink, or the writer process once started
        # A deque appended by the event loop and popped by the thread: both are atomic in
        # CPython, and an append takes no lock (queue.Queue would take one and notify).
        # It holds the facts alone: the thread counts their bytes again (facts.held_bytes) as it
        # takes them, rather than the loop making a (facts, bytes) pair for each.
        self._queue: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by offer as the queue stops being empty or fills a batch, and by close
        # The queue's event-loop end (in C where built): bounds, counters, and the thread's wake-up as the
        # queue stops being empty, and as it holds a batch the thread takes at once (BATCH_ROWS, or half
        # the queue's bound when that is less: see _drain). The capture observer sets its take.
        self.front = queue_front(self._queue, queue_rows, queue_bytes, (1, min(BATCH_ROWS, max(1, queue_rows // 2))),
                                 self._wake.set)
        self._thread: threading.Thread | None = None
        if not process:
            # Imported now, on this thread: an import in the writer thread would hold the GIL ~0.1 s.
            import pyarrow.compute  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        self._waiting_since: float | None = None  # when the thread saw the queue's oldest exchange

    # What the rows' maker counts: the sink's, or the writer process's as it last reported them.
    rows_written = property(lambda self: self._out.rows_written)
    row_errors = property(lambda self: self._out.row_errors)
    write_errors = property(lambda self: self._out.write_errors)
    files_written = property(lambda self: self._out.files_written)
    files = property(lambda self: self._out.files)
    # Times an idle-class writer process fell behind and was lifted out (capture.writer_priority): 0 elsewhere.
    writer_lifts = property(lambda self: getattr(self._out, "lifts", 0))
    # What the event loop counts, at the queue's front.
    rows_accepted = property(lambda self: self.front.accepted)  # queued (rows_written lags it)
    rows_dropped = property(lambda self: self.front.dropped)
    fact_errors = property(lambda self: self.front.fact_errors)  # exchanges whose facts could not be taken

    @property
    def builder(self) -> BatchBuilder:
        return self._sink.builder

    @builder.setter
    def builder(self, builder) -> None:
        self._sink.builder = builder

    # ------------------------------------------------------------------ event-loop side

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self.front.offered_bytes - self.front.taken_bytes

    def offer(self, item, nbytes: int = 0) -> bool:
        """Queue an exchange's facts (holding nbytes: facts.held_bytes(item)) without ever blocking.

        False, and counted, when the queue is full by rows or by bytes, or closed.
        """
        return self.front.offer(item, nbytes)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> CaptureWriter:
        if self._thread is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.process:
                from kinspect.capture.writer_process import WriterProcess

                sink = self._sink
                self._out = WriterProcess.start(
                    directory=str(self.directory), wall_offset=sink.builder.wall_offset,
                    versions=sink.builder.versions_table(), spec_layers=sink.builder.spec_layers(),
                    max_file_bytes=sink.max_file_bytes,
                    max_file_seconds=sink.max_file_seconds, row_group_rows=self.row_group_rows,
                    compression=self.compression, warm_facts=self.warm_facts, priority=self.writer_priority)
            if sys.getswitchinterval() > SWITCH_INTERVAL:
                sys.setswitchinterval(SWITCH_INTERVAL)
            self._thread = threading.Thread(target=self._run, name="kinspect-capture", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop taking exchanges, write every queued one, close the file (renamed to its final name)."""
        self.front.closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("capture writer did not finish within %s s; %d exchanges still queued",
                          timeout, len(self._queue))
                return
            self._thread = None
        else:
            self._drain()  # never started: whatever was queued is still written
            self._out.finish()

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        out = self._out
        while True:
            stopping = self._stop.is_set()
            # Cleared before the queue is looked at: an exchange queued from here on sets it again.
            self._wake.clear()
            worked = self._drain(limit=self.row_group_rows, force=stopping)
            out.tick()
            if stopping and not self._queue:
                out.finish()
                return
            if not worked:
                self._wake.wait(self._sleep_for())

    def _sleep_for(self) -> float:
        """Seconds until the part batch waiting (if one is) is BATCH_SECONDS old; at most IDLE_WAIT."""
        if self._queue and self._waiting_since is not None:
            return min(IDLE_WAIT, max(0.0, BATCH_SECONDS - (time.monotonic() - self._waiting_since)))
        return IDLE_WAIT

    def _drain(self, limit: int | None = None, force: bool = True) -> int:
        """Hand queued exchanges on a batch at a time (at most limit).

        A batch short of BATCH_ROWS waits until its first exchange was seen BATCH_SECONDS ago
        (unless force, or the queue is half full by a bound): batches of a few rows would cost
        their fixed pyarrow calls per row.
        """
        queue, done, out = self._queue, 0, self._out
        while queue and (limit is None or done < limit):
            size = min(len(queue), BATCH_ROWS)
            if size < BATCH_ROWS and not force and \
                    len(queue) < self.queue_rows // 2 and self.queued_bytes < self.queue_bytes // 2:
                now = time.monotonic()
                if self._waiting_since is None:
                    self._waiting_since = now
                if now - self._waiting_since < BATCH_SECONDS:
                    break
            self._waiting_since = None
            popleft = queue.popleft
            taken = [popleft() for _ in range(size)]
            self.front.taken_bytes += held_total(taken)
            done += size
            out.add(taken)
        return done
