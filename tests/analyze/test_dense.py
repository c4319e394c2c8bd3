"""analyze._dense (dense ids of int64 keys in C) against its reference, kinspect.analyze.groups.first_seen's Python path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kinspect.analyze.groups import Groups, first_seen, native_first_seen
from tests.support.native import bytes_grown, native_module

_dense, _MISSING = native_module("kinspect.analyze._dense")
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.fixture(autouse=True)
def built():
    assert _dense is not None, _MISSING
    assert native_first_seen() is _dense.first_seen


def keys_of(kind: str) -> np.ndarray:
    rng = np.random.default_rng(len(kind))
    return {
        "empty": np.array([], np.int64),
        "one": np.array([42], np.int64),
        "all equal": np.full(5000, -7, np.int64),
        "few distinct": rng.integers(0, 20, 20000),
        "mostly distinct": rng.integers(0, 1 << 40, 300_000),  # the table grows many times
        "runs of neighbours": np.repeat(np.arange(100_000, dtype=np.int64), 3),
        "extremes": rng.choice(np.array([I64_MIN, I64_MAX, -1, 0, 1], np.int64), 10_000),
        # multiples of a large power of two: the same low bits, which the hash must still spread
        "same low bits": rng.integers(0, 50_000, 100_000) << 40,
    }[kind]


@pytest.mark.parametrize("kind", ["empty", "one", "all equal", "few distinct", "mostly distinct",
                                  "runs of neighbours", "extremes", "same low bits"])
def test_c_ids_and_first_rows_equal_the_reference(kind):
    key = keys_of(kind)
    ids, first = first_seen(key)
    reference_ids, reference_first = first_seen(key, native=False)
    assert ids.dtype == reference_ids.dtype == np.intp and first.dtype == reference_first.dtype == np.int64
    assert np.array_equal(ids, reference_ids) and np.array_equal(first, reference_first)
    # and what they mean: rows share an id exactly where their keys are equal, ids in order of first appearance
    assert len(first) == len(np.unique(key))
    assert np.array_equal(key[first[ids]], key)
    assert np.array_equal(first, np.sort(first)) and (ids.max() + 1 if len(ids) else 0) == len(first)


def test_a_slice_of_a_larger_array_is_read_as_its_own_values():
    """A strided view (every other key) is made contiguous first: the C reads the keys it is given."""
    key = np.arange(20, dtype=np.int64) % 7
    ids, first = first_seen(key[::2])
    assert np.array_equal(ids, first_seen(key[::2].copy(), native=False)[0]) and len(first) == 7


def test_groups_sum_the_same_with_either_path(monkeypatch):
    rng = np.random.default_rng(5)
    key, values = rng.integers(0, 3000, 50_000), pa.array(rng.integers(-5, 1 << 40, 50_000))
    native = Groups(key)
    monkeypatch.setattr("kinspect.analyze.groups._FIRST_SEEN", None)
    python = Groups(key)
    assert native.number == python.number
    assert native.sum(values).equals(python.sum(values)) and native.min(values).equals(python.min(values))


def test_buffers_of_the_wrong_size_are_refused():
    key = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="ids holds fewer than 10 int64s"):
        _dense.first_seen(key, np.empty(9, np.int64), np.empty(10, np.int64))
    with pytest.raises(ValueError, match="not a whole number of int64s"):
        _dense.first_seen(b"123", np.empty(1, np.int64), np.empty(1, np.int64))
    with pytest.raises(TypeError):
        _dense.first_seen(key, b"read-only" * 10, np.empty(10, np.int64))


def test_no_memory_is_kept_between_calls():
    key = np.random.default_rng(1).integers(0, 1 << 30, 100_000)
    ids, first = np.empty(len(key), np.int64), np.empty(len(key), np.int64)
    assert bytes_grown(lambda: [_dense.first_seen(key, ids, first) for _ in range(20)]) < 4096
