"""The Parquet sink gathers facts and builds them build_rows at a time: part batches share a build, rows keep their order."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.sink import ParquetSink
from kinspect.protocol.codec import Codec
from tests.capture.test_capture import read_rows, recorded_facts


class Counting:
    """A batch builder that keeps the size of every build it is asked for."""

    def __init__(self, bad: set[int] = frozenset()) -> None:
        self.inner = BatchBuilder(0.0)
        self.sizes: list[int] = []
        self.bad = bad  # ids of facts whose row cannot be built

    def build(self, facts):
        self.sizes.append(len(facts))
        if any(id(f) in self.bad for f in facts):
            raise ValueError("a row that cannot be built")
        return self.inner.build(facts)


def sink(directory: Path, builder, **kw) -> ParquetSink:
    settings = dict(max_file_bytes=1 << 30, max_file_seconds=3600.0, row_group_rows=6, compression=None)
    return ParquetSink(directory, builder, **{**settings, **kw})


def correlation_ids(paths) -> list[int]:
    return read_rows(paths).column("correlation_id").to_pylist()


def test_part_batches_wait_to_be_built_together_and_row_groups_stay_whole(codec: Codec, tmp_path: Path):
    facts = [f for f, _ in recorded_facts(codec, 13)]
    builder = Counting()
    s = sink(tmp_path, builder, build_rows=4)
    for one in facts:  # thirteen part batches of one exchange
        s.add([one])
    assert builder.sizes == [4, 2, 4, 2]  # a build at four, and the rest of each row group as it fills
    assert s.rows_written == 12
    s.finish()
    assert builder.sizes == [4, 2, 4, 2, 1]
    assert s.rows_written == 13 and s.row_errors == 0
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in s.files] == [3]
    assert [pq.ParquetFile(s.files[0]).metadata.row_group(i).num_rows for i in range(3)] == [6, 6, 1]
    assert correlation_ids(s.files) == [f[11] for f in facts]  # in the order they came


def test_without_build_rows_each_add_is_built_at_once(codec: Codec, tmp_path: Path):
    facts = [f for f, _ in recorded_facts(codec, 5)]
    builder = Counting()
    s = sink(tmp_path, builder)
    s.add(facts[:1])
    s.add(facts[1:4])
    s.add(facts[4:])
    assert builder.sizes == [1, 3, 1]
    s.finish()
    assert correlation_ids(s.files) == [f[11] for f in facts]


def test_a_file_finished_by_age_takes_the_facts_not_yet_built(codec: Codec, tmp_path: Path):
    facts = [f for f, _ in recorded_facts(codec, 3)]
    builder = Counting()
    s = sink(tmp_path, builder, build_rows=100, max_file_seconds=0.05)
    s.add(facts)
    s.tick()  # not old yet
    assert builder.sizes == [] and s.files == []
    deadline = time.monotonic() + 10
    while not s.files and time.monotonic() < deadline:
        s.tick()
        time.sleep(0.01)
    assert builder.sizes == [3] and s.rows_written == 3
    assert correlation_ids(s.files) == [f[11] for f in facts]


def test_a_row_that_cannot_be_built_is_counted_alone_when_built_late(codec: Codec, tmp_path: Path):
    facts = [f for f, _ in recorded_facts(codec, 10)]
    builder = Counting(bad={id(facts[2])})
    s = sink(tmp_path, builder, build_rows=8, row_group_rows=100)
    for one in facts:
        s.add([one])
    s.finish()
    assert (s.rows_written, s.row_errors) == (9, 1)
    assert correlation_ids(s.files) == [f[11] for i, f in enumerate(facts) if i != 2]


def test_row_groups_carry_statistics_for_the_top_level_columns_only(codec: Codec, tmp_path: Path):
    """Readers filter on times, apis and sizes (min/max let them skip row groups); no reader filters on a
    leaf inside a list column, and writing those statistics cost 7-10% of the write."""
    s = sink(tmp_path, BatchBuilder(0.0), compression="zstd")
    s.add([f for f, _ in recorded_facts(codec, 20)])
    s.finish()
    columns = pq.ParquetFile(s.files[0]).metadata.row_group(0)
    stats = {columns.column(i).path_in_schema: columns.column(i).statistics for i in range(columns.num_columns)}
    assert stats["request_time"].has_min_max and stats["api_key"].has_min_max
    assert stats["request_size"].min > 0 and stats["client_address"].has_min_max
    nested = {path: st for path, st in stats.items() if "." in path}
    assert len(nested) > 20 and all(st is None for st in nested.values()), nested
