"""The capture writer: a bounded queue of exchange facts, a thread that turns them into rotated Parquet files.

The event loop only appends to the queue (`offer`); when the queue holds `queue_rows`
exchanges, or `queue_bytes` bytes (of the facts it holds, as the observer estimates
them), the new one is dropped and counted. The thread takes the facts a batch at a time
(BATCH_ROWS, or what waited BATCH_SECONDS), makes one Arrow record batch of each
(capture.batch), writes a row group every `row_group_rows` rows, and rotates files by
size and age. A file is written as `capture-<start-utc>-<seq>.parquet.tmp` and renamed to
its final name only once closed, so a reader listing `*.parquet` never sees half a file.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.facts import held_bytes
from kinspect.capture.schema import arrow_schema

log = logging.getLogger("kinspect.capture")

_IDLE_WAIT = 0.05  # seconds the thread sleeps when it has nothing to do (the loop never signals it)
# The longest the event loop waits for the GIL while this thread runs Python code. CPython hands
# the GIL to a waiting thread only after sys.getswitchinterval() (5 ms by default): a busy writer
# would add up to that to each wake-up of the loop, and a forwarded frame needs one or two. At
# 0.1 ms the wait stays well inside the 0.5 ms p99 budget; the cost is a GIL handoff per wake-up
# of the loop while the writer works, the same at any interval. Lowered, never raised, on start.
SWITCH_INTERVAL = 0.0001
# Exchanges per record batch. Each batch costs a fixed ~40 pyarrow calls (one per column, a
# dozen kernels for integer_fields), so tiny batches cost more per row; but each pa.array call
# holds the GIL for its whole column, whatever the switch interval. On the recorded traffic the
# longest (tagged_fields) holds it 0.23 ms at 512 rows, 0.37 ms at 1,024, at the same cost a row.
BATCH_ROWS = 512
# A batch that is not full is built once its first exchange waited this long in the queue.
BATCH_SECONDS = 0.25


class CaptureWriter:
    """Bounded queue + writer thread + pyarrow ParquetWriter, with counters for metrics.

    Counters: rows_accepted (queued), rows_written (in files), rows_dropped (queue full), row_errors (an exchange whose row
    could not be built), fact_errors (its facts could not be taken on the event loop), write_errors (rows lost because a file could not be written),
    files_written; `queue_depth` is the queue's length now.
    """

    def __init__(self, directory: str | Path, builder: BatchBuilder, *, max_file_bytes: int = 64 * 1024 * 1024,
                 max_file_seconds: float = 300.0, queue_rows: int = 100_000, row_group_rows: int = 10_000,
                 queue_bytes: int = 256 * 1024 * 1024, compression: str | None = "zstd") -> None:
        for name, value in (("max_file_bytes", max_file_bytes), ("max_file_seconds", max_file_seconds),
                            ("queue_rows", queue_rows), ("row_group_rows", row_group_rows),
                            ("queue_bytes", queue_bytes)):
            if value <= 0:
                raise ValueError(f"capture.{name} must be positive, not {value!r}")
        self.directory = Path(directory)
        self.builder = builder
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self.queue_rows = queue_rows
        self.queue_bytes = queue_bytes
        self.row_group_rows = row_group_rows
        self.compression = compression  # Parquet column compression (None: plain, e.g. to search a file's bytes)
        # A deque appended by the event loop and popped by the thread: both are atomic in
        # CPython, and an append takes no lock (queue.Queue would take one and notify).
        # It holds the facts alone: the thread counts their bytes again (facts.held_bytes) as it
        # takes them, rather than the loop making a (facts, bytes) pair for each.
        self._queue: collections.deque = collections.deque()
        # Bytes held by the queue = offered - taken; each counter has one writer (the loop,
        # the thread), so neither update can be lost to the other.
        self._offered_bytes = 0
        self._taken_bytes = 0
        self.rows_accepted = 0  # offered and queued (the event loop's count; rows_written lags it)
        self.rows_written = 0
        self.rows_dropped = 0
        self.row_errors = 0
        self.fact_errors = 0  # exchanges whose facts could not be taken (the event loop's count)
        self.write_errors = 0
        self.files_written = 0
        self.files: list[Path] = []  # every file written, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._seq = 0
        self._writer = None  # the open pyarrow ParquetWriter
        self._tmp: Path | None = None
        self._final_stem = ""
        self._file_started = 0.0  # monotonic time of the open file's first row
        self._batches: list = []  # record batches of the row group being gathered
        self._batched_rows = 0
        self._schema = arrow_schema()
        # Imported now, on this thread: an import in the writer thread would hold the GIL ~0.1 s.
        import pyarrow.compute  # noqa: F401
        import pyarrow.parquet  # noqa: F401
        self._waiting_since: float | None = None  # when the thread saw the queue's oldest exchange
        self._write_failed = False  # logged once; later failures are only counted
        self._file_rows = 0  # rows in the open file (lost with it if it cannot be finished)

    # ------------------------------------------------------------------ event-loop side

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._offered_bytes - self._taken_bytes

    def offer(self, item, nbytes: int = 0) -> bool:
        """Queue an exchange's facts (holding nbytes: facts.held_bytes(item)) without ever blocking.

        False, and counted, when the queue is full by rows or by bytes, or closed.
        """
        queue = self._queue
        if len(queue) >= self.queue_rows or self._closed or \
                self._offered_bytes - self._taken_bytes + nbytes > self.queue_bytes:
            self.rows_dropped += 1
            return False
        self._offered_bytes += nbytes
        self.rows_accepted += 1
        queue.append(item)
        return True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> CaptureWriter:
        if self._thread is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            if sys.getswitchinterval() > SWITCH_INTERVAL:
                sys.setswitchinterval(SWITCH_INTERVAL)
            self._thread = threading.Thread(target=self._run, name="kinspect-capture", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop taking exchanges, write every queued one, close the file (renamed to its final name)."""
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("capture writer did not finish within %s s; %d exchanges still queued",
                          timeout, len(self._queue))
                return
            self._thread = None
        else:
            self._drain()  # never started: whatever was queued is still written
            self._finish_file()

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            worked = self._drain(limit=self.row_group_rows, force=stopping)
            if (self._writer is not None or self._batches) and \
                    time.monotonic() - self._file_started >= self.max_file_seconds:
                self._finish_file()
            if stopping and not self._queue:
                self._finish_file()
                return
            if not worked:
                self._stop.wait(_IDLE_WAIT)

    def _drain(self, limit: int | None = None, force: bool = True) -> int:
        """Turn queued exchanges into record batches (at most limit); write a row group when one is full.

        A batch short of BATCH_ROWS waits until its first exchange was seen BATCH_SECONDS ago
        (unless force, or the queue is half full by a bound): batches of a few rows would cost
        their fixed pyarrow calls per row.
        """
        queue, done = self._queue, 0
        while queue and (limit is None or done < limit):
            size = min(len(queue), BATCH_ROWS, self.row_group_rows - self._batched_rows)
            if size < BATCH_ROWS and not force and size < self.row_group_rows - self._batched_rows and \
                    len(queue) < self.queue_rows // 2 and self.queued_bytes < self.queue_bytes // 2:
                now = time.monotonic()
                if self._waiting_since is None:
                    self._waiting_since = now
                if now - self._waiting_since < BATCH_SECONDS:
                    break
            self._waiting_since = None
            popleft = queue.popleft
            taken = [popleft() for _ in range(size)]
            self._taken_bytes += sum(map(held_bytes, taken))
            done += size
            if not self._batches and self._writer is None:
                self._file_started = time.monotonic()
            self._build(taken)
            if self._batched_rows >= self.row_group_rows:
                self._write_pending()
        return done

    def _build(self, facts: list) -> None:
        """Add a record batch of these exchanges; an exchange whose row cannot be built is counted and left out."""
        try:
            batch = self.builder.build(facts)
        except Exception:  # one bad exchange must not stop the capture: find it, keep the others
            batch = None
            if len(facts) > 1:
                for one in facts:
                    self._build([one])
                return
            self.row_errors += 1
            if self.row_errors == 1:
                log.exception("capture: cannot build a row (further failures are only counted)")
        if batch is not None:
            self._batches.append(batch)
            self._batched_rows += batch.num_rows

    def _write_pending(self) -> None:
        batches, count = self._batches, self._batched_rows
        self._batches, self._batched_rows = [], 0
        if not count:
            return
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            if self._writer is None:
                self._open(pq)
            # write_table releases the GIL while it encodes and compresses.
            self._writer.write_table(pa.Table.from_batches(batches, schema=self._schema), row_group_size=count)
            self.rows_written += count
            self._file_rows += count
        except Exception:  # a full disk, a bad directory: count the rows, keep going with a new file
            self.write_errors += count
            if not self._write_failed:
                self._write_failed = True
                log.exception("capture: cannot write %d rows to %s (further failures are only counted)",
                              count, self._tmp or self.directory)
            self._abandon_file()
            return
        if self._tmp.stat().st_size >= self.max_file_bytes:
            self._finish_file()

    def _open(self, pq) -> None:
        started = datetime.now(UTC) - timedelta(seconds=max(0.0, time.monotonic() - self._file_started))
        self._seq += 1
        self._final_stem = f"capture-{started:%Y%m%dT%H%M%S}Z"
        self._tmp = self.directory / f"{self._final_stem}-{self._seq:06d}.parquet.tmp"
        self._writer = pq.ParquetWriter(str(self._tmp), self._schema, compression=self.compression or "none")

    def _finish_file(self) -> None:
        """Write the pending rows, close the file and give it its final name."""
        self._write_pending()
        if self._writer is None:
            return
        writer, tmp = self._writer, self._tmp
        self._writer = self._tmp = None
        try:
            writer.close()
            final = self._final_name()
            # link + unlink: never replaces a file of the same name (another writer's), unlike rename.
            while True:
                try:
                    os.link(tmp, final)
                    break
                except FileExistsError:
                    self._seq += 1
                    final = self._final_name()
            tmp.unlink()
        except Exception:
            self._lose_file_rows()
            log.exception("capture: cannot finish %s", tmp)
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            return
        self._file_rows = 0
        self.files_written += 1
        self.files.append(final)

    def _final_name(self) -> Path:
        return self.directory / f"{self._final_stem}-{self._seq:06d}.parquet"

    def _lose_file_rows(self) -> None:
        self.rows_written -= self._file_rows
        self.write_errors += self._file_rows
        self._file_rows = 0

    def _abandon_file(self) -> None:
        self._lose_file_rows()
        writer, tmp = self._writer, self._tmp
        self._writer = self._tmp = None
        try:
            if writer is not None:
                writer.close()
        except Exception:
            log.debug("capture: closing an abandoned file failed", exc_info=True)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
