"""Where captured exchanges become files: record batches, row groups, rotated Parquet files named only once whole.

A file is written as `capture-<start-utc>-<seq>.parquet.tmp` and renamed to its final name
only once closed, so a reader listing `*.parquet` never sees half a file. Used by the
capture writer's thread, or by its own process (capture.writer_process).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.schema import arrow_schema, parquet_options

log = logging.getLogger("kinspect.capture")


class ParquetSink:
    """Record batches of exchange facts, a row group every `row_group_rows` rows, files rotated by size and age.

    Facts are gathered until `build_rows` of them wait (or the row group fills, or the file is
    finished) and only then built, build_rows to a record batch (None: each add's facts are built
    at once). A build costs about 0.6 ms whatever its size, then about 7 µs a row: the part
    batches of a quiet proxy (a few exchanges every quarter second) cost a build each where they
    can share one. No reader sees rows before their file is finished, so building them later
    changes nothing anyone reads.

    Counters: rows_written (in files), row_errors (an exchange whose row could not be built),
    write_errors (rows lost because a file could not be written), files_written; `files`:
    every file finished, in order.
    """

    def __init__(self, directory: str | Path, builder: BatchBuilder, *, max_file_bytes: int, max_file_seconds: float,
                 row_group_rows: int, compression: str | None, build_rows: int | None = None) -> None:
        self.directory = Path(directory)
        self.builder = builder
        self.build_rows = build_rows
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.rows_written = 0
        self.row_errors = 0
        self.write_errors = 0
        self.files_written = 0
        self.files: list[Path] = []
        self._seq = 0
        self._writer = None  # the open pyarrow ParquetWriter
        self._tmp: Path | None = None
        self._final_stem = ""
        self._file_started = 0.0  # monotonic time of the open file's first row
        self._batches: list = []  # record batches of the row group being gathered
        self._batched_rows = 0
        self._unbuilt: list = []  # facts of that row group not yet built (fewer than build_rows)
        self._schema = None  # made when the first file is (pyarrow is imported only then)
        self._write_failed = False  # logged once; later failures are only counted
        self._file_rows = 0  # rows in the open file (lost with it if it cannot be finished)

    def add(self, facts: list) -> None:
        """Gather these exchanges, built once build_rows wait, split where a row group fills; each full row
        group is written."""
        while facts:
            room = self.row_group_rows - self._batched_rows - len(self._unbuilt)
            part, facts = (facts, None) if len(facts) <= room else (facts[:room], facts[room:])
            if not self._batches and not self._unbuilt and self._writer is None:
                self._file_started = time.monotonic()
            self._unbuilt += part
            if self.build_rows is None or len(part) == room:
                self._build_unbuilt()
            elif len(self._unbuilt) >= self.build_rows:
                self._build_unbuilt(whole=False)
            if self._batched_rows >= self.row_group_rows:
                self._write_pending()

    def tick(self) -> None:
        """Finish the open file once it is max_file_seconds old."""
        if (self._writer is not None or self._batches or self._unbuilt) and \
                time.monotonic() - self._file_started >= self.max_file_seconds:
            self._finish_file()

    def _build_unbuilt(self, whole: bool = True) -> None:
        """Build the gathered facts build_rows at a time, and the rest too when whole."""
        unbuilt, start = self._unbuilt, 0
        size = self.build_rows or max(1, len(unbuilt))
        while len(unbuilt) - start >= size or (whole and start < len(unbuilt)):
            self._build(unbuilt[start:start + size])
            start += size
        self._unbuilt = unbuilt[start:]

    def finish(self) -> None:
        """Write what is gathered and close the open file under its final name."""
        self._finish_file()

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
        self._build_unbuilt()
        batches, count = self._batches, self._batched_rows
        self._batches, self._batched_rows = [], 0
        if not count:
            return
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            if self._schema is None:
                self._schema = arrow_schema()
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
        self._writer = pq.ParquetWriter(str(self._tmp), self._schema, **parquet_options(self.compression))

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
