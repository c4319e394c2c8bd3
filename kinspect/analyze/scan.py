"""Spark tasks that read the capture files with pyarrow and yield each aggregate's partial rows.

The driver splits the captures into pieces (`plan`): for files it can see, runs of Parquet
row groups balanced by rows, enough to keep every core busy; for other URIs (s3a://,
hdfs://...), Spark lists the files through its Hadoop filesystems and each file is one
piece, its bytes fetched by Spark. Local pieces go to at most WAVES tasks per core, a bin
of pieces about equal in rows each. A task reads its pieces in turn and, for each aggregate
in turn, only the columns it needs, up to half a million rows at a time, and yields the
aggregate's partial rows (kinspect.analyze.partials) in buckets by key, as Arrow bytes
keyed by their shuffle partition (an RDD's mapPartitions, no Python per row); a second
stage merges them (`merger`). A small local capture is read the same way on the driver.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from kinspect.analyze.inputs import (CAPTURE_GLOB, MALFORMED, SMALL_ROWS, AnalyzeInputError, capture_files,
                                     is_local, row_runs)

# About this many rows per piece, a quarter more at most (inputs.row_runs): a Python worker then
# peaks at about 600 MB (1M rows: 860 MB), memory a cluster counts in the executor's
# overhead, not in Spark's own; measured no slower.
PIECE_ROWS = 500_000
# With a local master, captures of at most this many rows (all local files) are read and grouped
# on the driver, in this process: Python workers for so few rows cost more than the work
# (docs/analyze.md). On a cluster the executors read, whatever the size.
DRIVER_ROWS = SMALL_ROWS
# Read tasks per core at most: a Spark task costs about 50 ms of the cores' time whatever it
# does (an empty two-stage mapInArrow job of 15 + 6 tasks took 0.8 to 1.0 s on local[2], of
# 8 + 2 tasks 0.5 s), so a local task reads several pieces in turn (its memory is still one
# piece's). Four waves leave Spark room to balance the cores when another process takes
# one. The 5M capture, jobs alternating in one session (load 2.4 to 3.9): 8 tasks (4 waves)
# won 8 of 9 pairs against a task per piece (15), medians 6.6 and 9.5 s against 8.5 and 9.7
# s, CPU 10.3 and 10.8 s against 10.5 and 12.0 s; 4 tasks (2 waves) 6.6 s, 10.1 CPU s.
WAVES = 4
_RAISED = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")  # a Python traceback's last line


@dataclass
class Scan:
    """What every aggregate reads: the pieces for Spark's tasks, as an RDD of bins (a bin: a
    list of (file URI, row groups or None for all, the file's bytes or None to open it)), or,
    for a small local capture, the pieces the driver reads itself (`on_driver`)."""

    pieces: object  # pyspark RDD, or None when on_driver
    tasks: int
    input_bytes: int
    on_driver: list | None = None  # [(file: URI, row groups)] read in this process


def plan(spark, paths: list[str], driver_rows: int | None = None) -> Scan:
    """The pieces of the captures at `paths` (local paths as file: URIs, or other URIs).
    Local captures of at most `driver_rows` rows are read on the driver (default: DRIVER_ROWS
    with a local master or no Spark at all (`spark` None), 0 on a cluster)."""
    local = [p for p in paths if is_local(p)]
    remote = [p for p in paths if not is_local(p)]
    cores = max(1, spark.sparkContext.defaultParallelism) if spark is not None else os.cpu_count() or 1
    pieces, size, rows = _local_pieces(local, cores) if local else ([], 0, 0)
    if driver_rows is None:
        driver_rows = DRIVER_ROWS if spark is None or spark.sparkContext.master.startswith("local") else 0
    if not remote and rows <= driver_rows:
        return Scan(None, 0, size, on_driver=[(path, groups) for path, groups, _ in pieces])
    if spark is None:
        raise AnalyzeInputError(f"{rows:,} capture rows at {', '.join(paths)}: more than {driver_rows:,}, "
                                "or not all local: the job needs a SparkSession")
    context = spark.sparkContext
    parts = []
    bins = _bins(pieces, min(len(pieces), WAVES * cores))
    if bins:
        # a bin of pieces per partition (an RDD element each), read one after the other by its task
        parts.append(context.parallelize([[(path, groups, None) for path, groups, _ in b] for b in bins], len(bins)))
    tasks = len(bins)
    if remote:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        try:
            listed = spark.read.format("binaryFile").option("pathGlobFilter", CAPTURE_GLOB).load(remote)
            files = listed.select("path", "length").collect()
        except (PySparkException, Py4JJavaError) as exc:
            raise AnalyzeInputError(f"cannot read captures at {', '.join(remote)}: {first_line(exc)}") from None
        if not files:
            raise AnalyzeInputError(f"no capture files ({CAPTURE_GLOB}) in {', '.join(remote)}")
        size += sum(row["length"] for row in files)
        tasks += len(files)
        # Spark's own partitions of the listing, a few files each, each file's bytes fetched once
        parts.append(listed.select("path", "content").rdd.map(_remote_piece))
    return Scan(parts[0] if len(parts) == 1 else context.union(parts), tasks, size)


def _remote_piece(row) -> list:
    """A remote file's listing row as a bin of one piece: (path, all row groups, its bytes)."""
    return [(row[0], None, bytes(row[1]))]


def _bins(pieces: list[tuple[str, list[int], int]], number: int) -> list[list[tuple[str, list[int], int]]]:
    """The pieces (file, row groups, rows; largest first) in `number` bins about equal in rows,
    largest bin first: each piece into the bin with the fewest rows so far."""
    import heapq

    bins: list[list] = [[] for _ in range(number)]
    filled = [(0, i) for i in range(number)]
    for piece in pieces:
        rows, i = heapq.heappop(filled)
        bins[i].append(piece)
        heapq.heappush(filled, (rows + piece[2], i))
    return sorted(bins, key=lambda b: -sum(piece[2] for piece in b))


def _local_pieces(paths: list[str], cores: int) -> tuple[list[tuple[str, list[int], int]], int, int]:
    """Runs of row groups of every local capture file, about equal in rows: at least one per
    core (when there are enough row groups), about PIECE_ROWS rows each at most (a quarter
    more where a row group fits better in than out, `row_runs`; one row group larger stays
    whole), in as few pieces as that allows (a small capture is one task); each as (file,
    row groups, rows), largest first."""
    import pyarrow.parquet as pq

    groups, size = [], 0
    for path in paths:
        for file in capture_files(path):
            meta = pq.read_metadata(file)
            size += file.stat().st_size
            groups += [(file.resolve().as_uri(), i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    total = sum(rows for _, _, rows in groups)
    wanted = max(-(-total // PIECE_ROWS), min(cores, len(groups)) if total > PIECE_ROWS // 10 else 1)
    wanted = -(-wanted // cores) * cores if wanted > 1 else 1  # whole waves of tasks
    per_piece = max(1, -(-total // wanted))
    pieces: list[tuple[str, list[int]]] = []
    piece_rows: list[int] = []
    for uri in dict.fromkeys(uri for uri, _, _ in groups):  # a piece is row groups of one file
        mine = [(group, rows) for u, group, rows in groups if u == uri]
        for run in row_runs([rows for _, rows in mine], per_piece):
            pieces.append((uri, [mine[i][0] for i in run]))
            piece_rows.append(sum(mine[i][1] for i in run))
    # largest first: the order `_bins` places them in (each into the emptiest bin), and the
    # order a bin's task reads them
    order = sorted(range(len(pieces)), key=lambda i: -piece_rows[i])
    return [(*pieces[i], piece_rows[i]) for i in order], size, total


def reader(buckets: dict[str, list[int]]):
    """The first stage's function (RDD mapPartitions): bins of pieces in; each aggregate's
    partial rows of each piece out, split into buckets by their keys, as (partition, (aggregate,
    Arrow IPC bytes)) pairs (`buckets`: aggregate -> the partition of each of its buckets,
    kinspect.analyze.aggregates.placement)."""
    from kinspect.analyze.merge import BUCKET_KEYS

    def read(bins):
        from kinspect.analyze.partials import piece_blobs, read_file

        _kept_memory()
        for pieces in bins:
            for path, groups, content in pieces:
                parquet = read_file(path, content)  # its footer parsed once for every aggregate
                # one aggregate's columns at a time (those several read, once): a piece's memory
                yield from piece_blobs(parquet, path, groups, buckets, BUCKET_KEYS)
        _settled()
    return read


def partition_of(partition: int) -> int:
    """The shuffle's partitioner: a pair's key is its partition already (RDD.partitionBy takes it
    modulo the partitions)."""
    return partition


def merger():
    """The second stage's function: (partition, (aggregate, partial rows)) pairs in, each
    aggregate merged out as (aggregate, Arrow IPC bytes)."""
    def merge(pairs):
        from kinspect.analyze.merge import merge_blobs

        _kept_memory()
        yield from merge_blobs(blob for _, blob in pairs)
        _settled()
    return merge


_MALLOC_SET = False
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _kept_memory() -> None:
    """Once per Python worker (glibc only): the memory numpy's large arrays free is kept for
    the next ones, not handed back to the kernel. By default glibc maps each array of more
    than a few hundred kilobytes on its own and unmaps it when freed, and trims the heap's
    top, so every piece's arrays were fresh pages again: page faults, a third of a worker's
    system time. With arrays up to 32 MB (glibc's largest threshold on 64 bits) taken from
    the heap and the heap's top kept up to 1 GB, the 5M capture's pieces took 5 to 10 times
    fewer page faults (the system CPU of four pieces 0.2-0.3 s -> 0.05-0.08 s) at the same
    peak memory. A worker then holds its peak until it exits, which was a piece's anyway."""
    global _MALLOC_SET
    if _MALLOC_SET:
        return
    _MALLOC_SET = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own defaults
        pass


def _settled() -> None:
    """At a task's end, the Python worker's objects so far are left out of the cyclic garbage
    collector's future passes (gc.freeze): PySpark's daemon runs gc.collect() after every task,
    and with pyarrow, numpy and PySpark loaded each pass walked some 60,000 long-lived objects,
    20 to 40 ms a task (11% of the workers' CPU samples at 5M rows). A task's own data is
    freed by reference counting as before."""
    import gc

    gc.freeze()


def first_line(exc: BaseException) -> str:
    """The line of a Spark error that says what went wrong: a Python task's own error (the last
    `SomeError: ...` line of its traceback) if there is one, else the error's first line."""
    text = str(exc).strip().splitlines()
    for line in text:
        if MALFORMED in line:
            return line[line.index(MALFORMED):][:300]
    raised = [line.strip() for line in text if _RAISED.match(line.strip())]
    if raised:
        return raised[-1][:300]
    return (text[0] if text else type(exc).__name__)[:300]


__all__ = ["DRIVER_ROWS", "PIECE_ROWS", "Scan", "first_line", "merger", "partition_of", "plan", "reader"]
