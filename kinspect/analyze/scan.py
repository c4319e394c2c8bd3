"""Spark tasks that read the capture files with pyarrow and yield each aggregate's partial rows.

The driver splits the captures into pieces (`plan`): for files it can see, runs of Parquet
row groups balanced by rows, enough to keep every core busy; for other URIs (s3a://,
hdfs://...), Spark lists the files through its Hadoop filesystems and each file is one
piece, its bytes read by Spark. Each task then reads only the columns one aggregate needs,
a row group at a time, and yields that aggregate's partial rows
(kinspect.analyze.partials) as Arrow batches: Spark's `mapInArrow`, no Python per row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kinspect.analyze.inputs import CAPTURE_GLOB, REQUIRED_COLUMNS, AnalyzeInputError, capture_files, is_local

PIECE_ROWS = 1_000_000  # at most this many rows per task (a few hundred MB of Arrow memory at most)
SCAN_SCHEMA = "path string, row_groups array<int>, content binary"
MALFORMED = "malformed capture file"  # what a task's error says when a file lacks columns
_RAISED = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")  # a Python traceback's last line


@dataclass
class Scan:
    """The pieces every aggregate's tasks read, as a Spark DataFrame (SCAN_SCHEMA), and their size."""

    pieces: object  # pyspark DataFrame
    tasks: int
    input_bytes: int


def plan(spark, paths: list[str]) -> Scan:
    """The pieces of the captures at `paths` (local paths as file: URIs, or other URIs)."""
    local = [p for p in paths if is_local(p)]
    remote = [p for p in paths if not is_local(p)]
    cores = max(1, spark.sparkContext.defaultParallelism)
    pieces, size = _local_pieces(local, cores) if local else ([], 0)
    frames = []
    if pieces:
        # one piece per partition, with no shuffle
        rows = spark.sparkContext.parallelize([(path, groups, None) for path, groups in pieces], len(pieces))
        frames.append(spark.createDataFrame(rows, SCAN_SCHEMA))
    tasks = len(pieces)
    if remote:
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F

        try:
            listed = spark.read.format("binaryFile").option("pathGlobFilter", CAPTURE_GLOB).load(*remote)
            files = listed.select("path", "length").collect()
        except PySparkException as exc:
            raise AnalyzeInputError(f"cannot read captures at {', '.join(remote)}: {first_line(exc)}") from None
        if not files:
            raise AnalyzeInputError(f"no capture files ({CAPTURE_GLOB}) in {', '.join(remote)}")
        size += sum(row["length"] for row in files)
        tasks += len(files)
        # Spark's own partitions of the listing: a few files each, read by Spark (content)
        frames.append(listed.select("path", F.lit(None).cast("array<int>").alias("row_groups"), "content"))
    scan = frames[0]
    for frame in frames[1:]:
        scan = scan.unionByName(frame)
    return Scan(scan, tasks, size)


def _local_pieces(paths: list[str], cores: int) -> tuple[list[tuple[str, list[int]]], int]:
    """Runs of row groups of every local capture file, about equal in rows: at least one per
    core (when there are enough row groups), at most PIECE_ROWS rows each (unless one row
    group is larger), in as few pieces as that allows (a small capture is one task)."""
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
    rows_in = 0
    for uri, group, rows in groups:
        if pieces and pieces[-1][0] == uri and rows_in + rows <= per_piece:
            pieces[-1][1].append(group)
            rows_in += rows
        else:
            pieces.append((uri, [group]))
            rows_in = rows
    return pieces, size


def reader(name: str):
    """The mapInArrow function of aggregate `name`: scan pieces in, its partial rows out."""
    def read(batches):
        from kinspect.analyze.partials import partial_batches

        for batch in batches:
            for path, groups, content in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                             batch.column(2).to_pylist()):
                yield from partial_batches(name, path, groups, content)
    return read


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


__all__ = ["MALFORMED", "REQUIRED_COLUMNS", "Scan", "first_line", "plan", "reader"]
