"""analyze._grouping (dense ids, list sums, packed keys, the radix sort, the groups' reductions in C) against their references, the Python paths of kinspect.analyze.groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kinspect.analyze import groups
from kinspect.analyze.groups import (_RADIX_MIN, Groups, distinct_counts, first_seen, list_sums, native_kernel, pack,
                                     sorted_keys)
from tests.support.native import bytes_grown, native_module

_grouping, _MISSING = native_module("kinspect.analyze._grouping")
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.fixture(autouse=True)
def built():
    assert _grouping is not None, _MISSING
    assert native_kernel("first_seen") is _grouping.first_seen and native_kernel("list_sums") is _grouping.list_sums
    assert native_kernel("accumulate_codes") is _grouping.accumulate_codes


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
        _grouping.first_seen(key, np.empty(9, np.int64), np.empty(10, np.int64))
    with pytest.raises(ValueError, match="not a whole number of int64s"):
        _grouping.first_seen(b"123", np.empty(1, np.int64), np.empty(1, np.int64))
    with pytest.raises(TypeError):
        _grouping.first_seen(key, b"read-only" * 10, np.empty(10, np.int64))


def test_no_memory_is_kept_between_calls():
    key = np.random.default_rng(1).integers(0, 1 << 30, 100_000)
    ids, first = np.empty(len(key), np.int64), np.empty(len(key), np.int64)
    assert bytes_grown(lambda: [_grouping.first_seen(key, ids, first) for _ in range(20)]) < 4096


def lists_of(seed: int, lists: int, groups: int, longest: int, first_offset: int = 0):
    """Random lists of counts (lengths 0 to `longest`), each in one of `groups` groups; the offsets
    start at `first_offset`, as a sliced Arrow list array's do."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest + 1, lists)
    offsets = first_offset + np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(-(1 << 40), 1 << 40, first_offset + int(lengths.sum()) + 3)
    return rng.integers(0, groups, lists), offsets, values


@pytest.mark.parametrize("lists, groups, longest, first_offset", [
    (0, 1, 10, 0), (1, 1, 10, 0), (5000, 24, 10, 0), (5000, 3000, 10, 7),
    (20000, 50, 14, 0),  # lists longer than the width: their tail is left out
])
def test_c_list_sums_equal_the_reference(lists, groups, longest, first_offset):
    ids, offsets, values = lists_of(lists + groups, lists, groups, longest, first_offset)
    native = list_sums(ids, groups, offsets, values, 10)
    reference = list_sums(ids, groups, offsets, values, 10, native=False)
    assert native.shape == reference.shape == (groups, 10) and np.array_equal(native, reference)
    # and what they mean, in plain Python
    expected = [[0] * 10 for _ in range(groups)]
    for i, group in enumerate(ids.tolist()):
        for p, count in enumerate(values[offsets[i]:offsets[i + 1]].tolist()[:10]):
            expected[group][p] += count
    assert native.tolist() == expected


def test_list_sums_refuse_ids_and_offsets_that_do_not_fit():
    ids, offsets, values = lists_of(1, 100, 5, 10)
    sums = np.zeros((5, 10), np.int64)
    for bad_ids, bad_offsets, bad_values, width in (
            (ids, offsets[:-1], values, 10),                      # one offset short
            (np.where(ids == 0, 5, ids), offsets, values, 10),    # an id past the sums' rows
            (ids, offsets[::-1].copy(), values, 10),              # descending
            (ids, offsets, values[:int(offsets[-1]) - 1], 10),    # past the values
            (ids, offsets, values, 0)):                           # no width
        with pytest.raises(ValueError, match="list_sums: offsets must be one more than ids"):
            _grouping.list_sums(bad_ids.astype(np.int64), bad_offsets.astype(np.int64), bad_values, width, sums)
        assert not sums.any()  # nothing added by a refused call
    _grouping.list_sums(ids, offsets, values, 10, sums)
    assert sums.any()


def key_column(rng, n: int, kind: int):
    """A key column of one of the kinds the partials and merges pack (with nulls half the time)."""
    nulls = rng.random(n) < 0.2 if rng.random() < 0.5 else None
    return [
        lambda: pa.array(rng.integers(-5, 5, n).astype(np.int8), mask=nulls),
        lambda: pa.array(rng.integers(0, 60_000, n).astype(np.uint16), mask=nulls),
        lambda: pa.array(rng.integers(0, 3, n).astype(np.uint32), mask=nulls),
        lambda: pa.array(rng.integers(-(1 << 40), 1 << 40, n), mask=nulls),  # two of these pass 2^62: made dense
        lambda: pa.array(rng.choice(["a", "b", "c", None], n)).dictionary_encode(),
        lambda: (pa.array(rng.choice(["x", "unknown", None], n)).dictionary_encode(), "unknown"),  # null joins it
        lambda: rng.integers(0, 9, n),  # a numpy column (the api codes, group ids)
        lambda: pa.array(rng.random(n) < 0.5),  # booleans: numpy's path, beside C's
        lambda: pa.array(rng.choice(["p", "q"], n)),  # plain strings: encoded by numpy's path
        lambda: pa.array([None] * n, pa.int32()),  # every value null
    ][kind]()


@pytest.mark.parametrize("seed", range(40))
def test_c_packed_keys_equal_the_reference(seed):
    """pack folds dictionary and integer columns in C: the same keys as numpy's codes, for every kind
    of column, chunked or sliced (buffers read from an offset), nulls and null_as included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    columns = [key_column(rng, n, int(rng.integers(0, 10))) for _ in range(int(rng.integers(1, 9)))]
    if seed % 3 == 1:  # sliced past their start
        cut = int(rng.integers(0, n))
        columns = [(c[0].slice(cut), c[1]) if isinstance(c, tuple) else c[cut:] for c in columns]
    elif seed % 3 == 2:  # chunked, as a table's columns are
        columns = [(pa.chunked_array([c[0][:n // 2], c[0][n // 2:]]), c[1]) if isinstance(c, tuple) else
                   c if isinstance(c, np.ndarray) else pa.chunked_array([c[:n // 2], c[n // 2:]]) for c in columns]
    native, python = pack(columns), pack(columns, native=False)
    assert native.dtype == np.int64 and native.tolist() == python.tolist()


def test_accumulate_codes_refuses_buffers_that_do_not_fit():
    key, values = np.full(10, 7, np.int64), np.arange(10, dtype=np.int32)
    for bad in ((key[:9].view(np.uint8)[:-1], values, 4, True, b"", 0),   # not whole int64s
                (key, values[:9], 4, True, b"", 0),                       # fewer values than keys
                (key, values, 3, True, b"", 0),                           # no such width
                (key, values.astype(np.uint64), 8, False, b"", 0),        # unsigned 64-bit
                (key, values, 4, True, b"\xff", 0),                       # a bitmap of 8 bits for 10 rows
                (key, values, 4, True, b"\xff\xff", 7)):                  # from bit 7: 17 bits needed
        with pytest.raises(ValueError, match="accumulate_codes: key must be int64s"):
            _grouping.accumulate_codes(*bad, 0, 11, 0, False)
        assert key.tolist() == [7] * 10  # nothing written by a refused call
    _grouping.accumulate_codes(key, values, 4, True, b"\xfe\x03", 0, 0, 11, -1, False)  # row 0 null
    assert key.tolist() == [7 * 11 - 1] + [7 * 11 + v + 1 for v in range(1, 10)]


@pytest.fixture
def radix_chosen(monkeypatch):
    """sorted_keys takes the radix sort from _RADIX_MIN keys on, whichever sort this machine found faster."""
    monkeypatch.setattr(groups, "_CHOICE", [True])
    calls = []
    real = groups._SORT
    monkeypatch.setattr(groups, "_SORT", lambda *args: calls.append(len(args[0])) or real(*args))
    yield calls


def test_the_faster_sort_is_chosen_once_on_a_large_call(monkeypatch):
    """The first call of CALIBRATION_KEYS keys or more times both sorts on a sample and keeps the faster for the
    process; smaller calls before it take the radix sort; every call sorts the same either way."""
    monkeypatch.setattr(groups, "_CHOICE", [])
    rng = np.random.default_rng(11)
    small = rng.integers(0, 1 << 34, _RADIX_MIN * 2)
    assert np.array_equal(sorted_keys(small), np.sort(small)) and groups._CHOICE == []
    large = rng.integers(0, 1 << 34, groups.CALIBRATION_KEYS + 5)
    assert np.array_equal(sorted_keys(large), np.sort(large))
    assert len(groups._CHOICE) == 1 and isinstance(groups._CHOICE[0], bool)
    monkeypatch.setattr(groups, "_CHOICE", [False])  # numpy faster: C is not called
    monkeypatch.setattr(groups, "_SORT", lambda *args: pytest.fail("the radix sort was called"))
    assert np.array_equal(sorted_keys(large), np.sort(large))


@pytest.mark.parametrize("kind", ["empty", "one", "all equal", "few distinct", "mostly distinct",
                                  "runs of neighbours", "extremes", "same low bits"])
def test_c_sort_equals_numpys(kind, radix_chosen):
    """The radix sort against np.sort (sorted_keys' reference), above and below the size where C takes over,
    and what distinct_counts makes of it."""
    key = keys_of(kind)
    assert native_kernel("sort_int64") is _grouping.sort_int64
    for keys in (key, key[:_RADIX_MIN - 1], key[::-1]):
        ordered = sorted_keys(keys)
        assert ordered.dtype == np.int64 and np.array_equal(ordered, np.sort(keys))
        assert np.array_equal(ordered, sorted_keys(keys, native=False))
    assert radix_chosen == ([len(key)] * 2 if len(key) >= _RADIX_MIN else [])  # the C sort did the large ones
    values, counts = distinct_counts(key)
    reference_values, reference_counts = np.unique(key, return_counts=True)
    assert np.array_equal(values, reference_values) and np.array_equal(counts, reference_counts)


def test_c_sort_leaves_its_input_alone_and_sorts_any_dtype(radix_chosen):
    """sorted_keys sorts a copy (the caller's array is kept), of int32 or strided input too."""
    rng = np.random.default_rng(9)
    key = rng.integers(-(1 << 31), 1 << 31, 50_000)
    kept = key.copy()
    assert np.array_equal(sorted_keys(key), np.sort(kept)) and np.array_equal(key, kept)
    assert np.array_equal(sorted_keys(key.astype(np.int32)), np.sort(key))
    assert np.array_equal(sorted_keys(key[::3]), np.sort(key[::3]))
    assert len(radix_chosen) == 3


def test_sort_refuses_buffers_that_do_not_fit():
    key = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="scratch .*at least as long"):
        _grouping.sort_int64(key, np.empty(9, np.int64))
    with pytest.raises(ValueError, match="must be int64s"):
        _grouping.sort_int64(bytearray(b"123"), bytearray(8))
    with pytest.raises(TypeError):
        _grouping.sort_int64(b"read-only", np.empty(10, np.int64))
    assert np.array_equal(key, np.arange(10))


def test_sort_keeps_no_memory_between_calls():
    key = np.random.default_rng(2).integers(0, 1 << 40, 100_000)
    work, scratch = key.copy(), np.empty_like(key)
    assert bytes_grown(lambda: [_grouping.sort_int64(work, scratch) for _ in range(20)]) < 4096


def column_of(kind, rng, rows: int, nulls: float) -> pa.Array:
    """A column of `rows` values of an Arrow type, a share of them null, sliced so that its offset is not 0."""
    low, high = {"int8": (-128, 128), "int16": (-(1 << 15), 1 << 15), "int32": (-(1 << 31), 1 << 31),
                 "int64": (I64_MIN, I64_MAX), "uint8": (0, 256), "uint16": (0, 1 << 16), "uint32": (0, 1 << 32),
                 "timestamp": (-(1 << 50), 1 << 50)}[kind]
    values = rng.integers(low, high, rows + 5, dtype=np.int64, endpoint=False)
    mask = rng.random(rows + 5) < nulls
    if kind == "timestamp":
        array = pa.array(values, pa.int64(), mask=mask).cast(pa.timestamp("us", "UTC"))
    else:
        array = pa.array(values, mask=mask).cast(getattr(pa, kind)())
    return array.slice(5)


@pytest.mark.parametrize("kind", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "timestamp"])
@pytest.mark.parametrize("nulls, groups", [(0.0, 40), (0.3, 40), (0.3, 20_000), (1.0, 10)])
def test_c_reductions_equal_the_reference(kind, nulls, groups):
    """Sums (with and without a condition that is itself partly null), minima, maxima and counts of every
    integer width, with nulls and offsets, many groups left empty or none: the same arrays, nulls included,
    from the one C pass as from numpy's reductions one by one."""
    rng = np.random.default_rng(groups + int(nulls * 10))
    rows = 30_000
    key = rng.integers(0, groups, rows)
    column = column_of(kind, rng, rows, nulls)
    condition = pa.array(rng.random(rows + 3) < 0.4, mask=rng.random(rows + 3) < 0.2).slice(3)
    requests = [("sum", column), ("sum", column, condition), ("min", column), ("max", column),
                ("count", condition), ("count", pa.array(rng.random(rows) < 0.5))]
    native, python = Groups(key), Groups(key, native=False)
    assert native.native and not python.native
    got, expected = native.reduce(requests), python.reduce(requests)
    for request, a, b in zip(requests, got, expected):
        assert a.type == b.type == pa.int64() and a.equals(b), request[0]
    # and what they mean, for the plain sum: each group's valid values added up, null where it has none
    sums = {}
    for g, v in zip(key.tolist(), column.cast(pa.int64()).to_pylist()):
        if v is not None:
            sums[g] = (sums.get(g, 0) + v + (1 << 63)) % (1 << 64) - (1 << 63)  # numpy's int64 wraps round
    firsts = key[native.first].tolist()
    assert got[0].to_pylist() == [sums.get(g) for g in firsts]


def test_reductions_over_chunked_columns_and_no_rows():
    """A chunked column is read whole; a table without rows gives empty results either way."""
    rng = np.random.default_rng(3)
    chunked = pa.chunked_array([pa.array(rng.integers(0, 100, 700)), pa.array(rng.integers(0, 100, 300))])
    key = rng.integers(0, 30, 1000)
    native, python = Groups(key), Groups(key, native=False)
    assert all(a.equals(b) for a, b in zip(native.reduce([("sum", chunked), ("max", chunked)]),
                                           python.reduce([("sum", chunked), ("max", chunked)])))
    empty = Groups(np.array([], np.int64))
    assert [len(a) for a in empty.reduce([("sum", pa.array([], pa.int64())), ("count", pa.array([], pa.bool_()))])] \
        == [0, 0]


def test_reduce_groups_refuses_calls_that_do_not_fit_and_changes_nothing():
    ids = np.array([0, 1, 1, 2], np.int64)
    values = np.arange(4, dtype=np.int64)
    every = (0, values, 8, True, b"", 0, b"", 0, b"", 0)
    out = np.full((1, 3), 99, np.int64)
    seen = np.empty(0, np.uint8)
    cases = [
        (np.array([0, 1, 3, 2], np.int64), (every,), out, seen),  # an id past the groups
        (np.array([0, -1, 1, 2], np.int64), (every,), out, seen),  # a negative id
        (ids, ((0, values[:3], 8, True, b"", 0, b"", 0, b"", 0),), out, seen),  # values for fewer rows
        (ids, ((0, values, 8, False, b"", 0, b"", 0, b"", 0),), out, seen),  # unsigned 64-bit
        (ids, ((5, values, 8, True, b"", 0, b"", 0, b"", 0),), out, seen),  # no such operation
        (ids, ((0, values, 8, True, b"", 0, np.zeros(1, np.uint8)[:0], 0, np.zeros(1, np.uint8), 7),), out,
         seen),  # a condition's validity bitmap too short for its offset
        (ids, (every,), out, np.empty(2, np.uint8)),  # seen neither empty nor as long as out
        (ids, (), out, seen),  # no reduction
    ]
    for args in cases:
        with pytest.raises(ValueError, match="reduce_groups: "):
            _grouping.reduce_groups(*args)
        assert (out == 99).all()
    with pytest.raises(TypeError):
        _grouping.reduce_groups(ids, (every,), b"read-only" * 3, seen)
    with pytest.raises(TypeError):
        _grouping.reduce_groups(ids, ((0, values),), out, seen)
    _grouping.reduce_groups(ids, (every,), out, seen)
    assert out.tolist() == [[0, 3, 3]]


def test_reduce_groups_keeps_no_memory_between_calls():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 1000, 100_000)
    values = rng.integers(0, 1 << 40, 100_000)
    where = np.packbits(rng.random(100_000) < 0.5, bitorder="little")
    specs = ((0, values, 8, True, b"", 0, where, 0, b"", 0), (3, b"", 0, False, b"", 0, where, 0, b"", 0))
    out, seen = np.empty((2, 1000), np.int64), np.empty((2, 1000), np.uint8)
    assert bytes_grown(lambda: [_grouping.reduce_groups(ids, specs, out, seen) for _ in range(20)]) < 4096
