"""kinspect.analyze.groups (keys packed into one int64 per row) and the partials built on it, against plain Python."""

from __future__ import annotations

import collections
import random

import numpy as np
import pyarrow as pa
import pytest

from kinspect.analyze.groups import Groups, pack
from kinspect.analyze.partials import LATENCY, REQUEST, RESPONSE, values

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def same_groups(groups: Groups, keys: list[tuple]) -> None:
    """Rows share a group id exactly where their key tuples are equal."""
    by_key = {}
    for key, group in zip(keys, groups.ids.tolist()):
        assert by_key.setdefault(key, group) == group, key
    assert len(set(by_key.values())) == len(by_key) == groups.number


def test_rows_group_by_every_key_nulls_included():
    rng = random.Random(7)
    rows = 3000
    names = [rng.choice(["a", "b", None, "unknown"]) for _ in range(rows)]
    small = [rng.choice([None, -3, 0, 5]) for _ in range(rows)]
    wide = [rng.choice([I64_MIN, I64_MAX, None, 0, 1 << 61]) for _ in range(rows)]  # a range past 2^62: hashed
    flags = [rng.choice([True, False, None]) for _ in range(rows)]
    # chunks with dictionaries of their own, one holding a value twice
    half = rows // 2
    dictionary = pa.chunked_array([
        pa.DictionaryArray.from_arrays(pa.array([rng.choice([0, 1, 2, None]) for _ in range(half)], pa.int32()),
                                       pa.array(["x", "y", "x"])),
        pa.array([rng.choice(["y", "z", None]) for _ in range(rows - half)]).dictionary_encode()])
    columns = [pa.array(names), pa.array(small, pa.int16()), pa.array(wide, pa.int64()), pa.array(flags),
               dictionary]
    keys = list(zip(names, small, wide, flags, dictionary.to_pylist()))
    groups = Groups.of(columns)
    same_groups(groups, keys)
    assert all(keys[row] == keys[first] for row, first in zip(range(rows), groups.first[groups.ids]))
    assert groups.first.tolist() == sorted(groups.first.tolist())  # ids in the order groups first appear
    joined = Groups.of([(columns[0], "unknown")] + columns[1:])  # null joins "unknown"
    same_groups(joined, [("unknown" if k[0] is None else k[0],) + k[1:] for k in keys])


def test_spans_past_2_to_the_62_are_made_dense():
    """Several key columns whose spans multiply past 2^62: the key so far is hashed to dense
    codes before the next column joins, and rows still group exactly."""
    rng = np.random.default_rng(3)
    columns = [rng.integers(0, 1 << 40, 2000) for _ in range(3)]
    columns[1][::3] = columns[1][0]  # some keys repeat
    columns[2][::3] = 5
    for c in columns:
        c[1::4] = c[0]
    keys = list(zip(*(c.tolist() for c in columns)))
    same_groups(Groups(pack(columns)), keys)


def test_sums_counts_and_extremes_as_spark_computes_them():
    groups = Groups(np.array([0, 0, 1, 1, 2, 2]))
    values = pa.array([1, 2, None, None, 7, None], pa.int32())
    condition = pa.array([True, None, True, False, False, True])
    assert groups.size().to_pylist() == [2, 2, 2]
    assert groups.sum(values).to_pylist() == [3, None, 7]  # all null: null
    assert groups.sum(values, condition).to_pylist() == [1, None, None]
    assert groups.count(condition).to_pylist() == [1, 1, 1]
    assert groups.min(values).to_pylist() == [1, None, 7]
    assert groups.max(pa.array([I64_MIN, -1, 4, 3, I64_MAX, 0])).to_pylist() == [-1, 4, I64_MAX]


def values_table(latency: list) -> pa.Table:
    rows = len(latency)
    rng = random.Random(11)
    return pa.table({
        "api_key": pa.array([rng.choice([0, 1, 9999]) for _ in range(rows)], pa.int16()),
        "api_name": pa.array([rng.choice(["Produce", None]) for _ in range(rows)]).dictionary_encode(),
        "request_version": pa.array([rng.choice([0, 3, 12]) for _ in range(rows)], pa.int16()),
        "response_version": pa.array([rng.choice([None, 2, 12]) for _ in range(rows)], pa.int16()),
        "request_size": pa.array([rng.choice([30, 31, 4000]) for _ in range(rows)], pa.int32()),
        "response_size": pa.array([rng.choice([None, 12, 1 << 30]) for _ in range(rows)], pa.int32()),
        "latency_us": pa.array(latency, pa.int64())})


def counted(table: pa.Table) -> collections.Counter:
    """`values` in plain Python: every (api, direction, version, value) and its count."""
    out = collections.Counter()
    for r in table.to_pylist():
        api = (r["api_key"], r["api_name"])
        out[api + (REQUEST, r["request_version"], r["request_size"])] += 1
        if r["response_size"] is not None:
            version = r["response_version"] if r["response_version"] is not None else r["request_version"]
            out[api + (RESPONSE, version, r["response_size"])] += 1
        if r["latency_us"] is not None:
            out[api + (LATENCY, None, r["latency_us"])] += 1
    return out


@pytest.mark.parametrize("latency", [[50, None, 900, 50], [50, None, 1 << 62, -(1 << 62)]],
                         ids=["packed", "too wide to pack"])
def test_values_counts_every_value(latency):
    table = values_table(latency * 200)
    got = values(table)
    keys = zip(*(got[c].to_pylist() for c in ("api_key", "api_name", "direction", "version", "v")))
    assert dict(zip(keys, got["n"].to_pylist())) == counted(table)
    assert got.num_rows == len(counted(table))


def test_distinct_and_distinct_counts_are_np_unique():
    """The sort-and-mask versions give np.unique's values and counts, on every size from empty up."""
    from kinspect.analyze.groups import distinct, distinct_counts

    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 3, 10, 1000, 100_000):
        for high in (2, 1000, 1 << 62):
            keys = rng.integers(-high, high, size, dtype=np.int64)
            want, counts = np.unique(keys, return_counts=True)
            assert distinct(keys).tolist() == want.tolist()
            got, got_counts = distinct_counts(keys)
            assert got.tolist() == want.tolist() and got_counts.tolist() == counts.tolist()
