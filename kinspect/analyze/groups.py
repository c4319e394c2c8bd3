"""Rows grouped by several key columns at once: the keys packed into one int64 per row, sums by numpy.

Arrow's hash aggregation hashes every key column of every row and runs one kernel per
aggregation; most of a partial aggregate's time went there. Here each key column becomes
small integer codes (a dictionary column's indices, an integer's offset from its minimum),
the codes of all the keys one int64 per row (mixed radix; folded in by _grouping.c where it
is built, else by numpy), and that one column is hashed once into dense group ids (in C
too, else by Arrow); the sums, minima, maxima and counts of a group are then one C call, a
loop each over Arrow's buffers (else a numpy ufunc.at each; exact integer arithmetic). A
group's key values are those of its first row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kinspect.protocol.codec.wire_program import optional_extension

_I64 = pa.int64()
_LIMIT = 1 << 62  # the packed key's span stays below this: an int64, with room to spare
_MIN = -(1 << 63)


def whole(array) -> pa.Array:
    """One contiguous array of a (chunked) column; a dictionary column's chunks share one dictionary."""
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return array.chunk(0)
        if pa.types.is_dictionary(array.type):
            array = array.unify_dictionaries()
        return array.combine_chunks()
    return array


def decoded(array) -> pa.Array:
    """A dictionary array's values as a plain array (any other array as it is)."""
    return array.cast(array.type.value_type) if pa.types.is_dictionary(array.type) else array


def native_kernel(name: str):
    """analyze._grouping's function `name`, or None where it is not built or KINSPECT_PURE_PYTHON=1."""
    module = optional_extension("kinspect.analyze._grouping")
    return None if module is None else getattr(module, name)


_FIRST_SEEN = native_kernel("first_seen")
_LIST_SUMS = native_kernel("list_sums")
_ACCUMULATE = native_kernel("accumulate_codes")
_SORT = native_kernel("sort_int64")
_REDUCE = native_kernel("reduce_groups")
_SUM, _MIN, _MAX, _COUNT = 0, 1, 2, 3  # reduce_groups' operations
# from this many keys the radix sort wins clearly where numpy sorts by comparisons (1,024 keys: 13 us
# either way; 4,096: 32 against 81 us)
_RADIX_MIN = 4096


def first_seen(key: np.ndarray, native: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each int64 key's id, dense in the order the keys first appear, and each id's first row:
    in C where it is built (`native`), else by Arrow's hashing (the reference: the same ids)."""
    key = np.ascontiguousarray(key, np.int64)
    if native and _FIRST_SEEN is not None:
        ids, first = np.empty(len(key), np.int64), np.empty(len(key), np.int64)
        number = _FIRST_SEEN(key, ids, first)
        return ids.astype(np.intp, copy=False), first[:number].copy()
    encoded = pc.dictionary_encode(pa.array(key, _I64))
    ids = encoded.indices.to_numpy().astype(np.intp)
    first = np.full(len(encoded.dictionary), len(ids), np.int64)
    np.minimum.at(first, ids, np.arange(len(ids), dtype=np.int64))
    return ids, first


def list_sums(ids: np.ndarray, number: int, offsets: np.ndarray, values: np.ndarray, width: int,
              native: bool = True) -> np.ndarray:
    """Each group's element-wise sums of its lists (list i: values[offsets[i]:offsets[i + 1]],
    in group ids[i]), as a (number x width) int64 array; a list's elements past `width` are
    left out. In C where it is built (`native`), else numpy (the reference)."""
    ids, offsets = np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(offsets, np.int64)
    values = np.ascontiguousarray(values, np.int64)
    sums = np.zeros((number, width), np.int64)
    if native and _LIST_SUMS is not None:
        _LIST_SUMS(ids, offsets, values, width, sums)
        return sums
    lengths, starts = np.diff(offsets), offsets[:-1]
    # each value's place in the sums: its group's row, plus its place in its list
    place = np.repeat(ids * width - starts, lengths) + np.arange(offsets[0], offsets[-1])
    counts = values[offsets[0]:offsets[-1]]
    if len(lengths) and lengths.max() > width:
        inside = np.arange(offsets[0], offsets[-1]) - np.repeat(starts, lengths) < width
        place, counts = place[inside], counts[inside]
    np.add.at(sums.reshape(-1), place, counts)  # both int64: numpy's fast path (int32 counts took 6x longer)
    return sums


def sorted_keys(keys: np.ndarray, native: bool = True) -> np.ndarray:
    """An integer array's values ascending, as int64: a radix sort in C where it is built
    (`native`) and faster on this machine's processor (`_radix_faster`), else numpy's sort (the
    reference)."""
    if native and _SORT is not None and len(keys) >= _RADIX_MIN and _radix_faster(keys):
        return _radix_sorted(keys)
    return np.sort(np.asarray(keys, np.int64))


def _radix_sorted(keys: np.ndarray) -> np.ndarray:
    ordered = np.array(keys, np.int64)  # a copy: sorted in place
    _SORT(ordered, np.empty_like(ordered))
    return ordered


# Which sort is faster depends on the processor, not on the keys: numpy 2.4 sorts int64 with
# AVX-512 on an Intel Xeon (13 ms for the 1.5M packed keys of a `values` piece, against the radix
# sort's 26), but by comparisons on the AMD EPYC measured before (82 ms, against 23; numpy leaves
# its AVX-512 sort out on AMD's Zen 4). So the first call with CALIBRATION_KEYS keys or more times
# both on its first CALIBRATION_KEYS (three times each, the fastest of each counted: a few ms once
# per process) and every later call takes the faster; smaller calls before it take the radix sort.
CALIBRATION_KEYS = 1 << 17
_CHOICE: list = []  # [radix faster], once measured


def _radix_faster(keys: np.ndarray) -> bool:
    if not _CHOICE:
        if len(keys) < CALIBRATION_KEYS:
            return True
        import time

        sample = np.array(keys[:CALIBRATION_KEYS], np.int64)
        best = {"radix": float("inf"), "numpy": float("inf")}
        for _ in range(3):
            for name, sort in (("radix", _radix_sorted), ("numpy", np.sort)):
                started = time.perf_counter()
                sort(sample)
                best[name] = min(best[name], time.perf_counter() - started)
        _CHOICE.append(best["radix"] < best["numpy"])
    return _CHOICE[0]


def distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct values of an integer array, ascending: a sort and a mask. (numpy 2.4's
    np.unique hashes them instead when asked for nothing else: 220 ms for 294k int64 here,
    against 5 for this.)"""
    ordered = sorted_keys(keys)
    return ordered[_starts(ordered)]


def distinct_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an integer array, ascending, and how many times each occurs: what
    np.unique(return_counts=True) gives, a third cheaper (1.4M keys: 57 -> 38 ms)."""
    ordered = sorted_keys(keys)
    starts = np.flatnonzero(_starts(ordered))
    return ordered[starts], np.diff(starts, append=len(ordered))


def _starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a sorted array begins, as a mask."""
    mask = np.empty(len(ordered), bool)
    mask[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=mask[1:])
    return mask


def _dense(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..n-1 of the distinct values of an int64 array (by hash), and n."""
    ids, first = first_seen(values)
    return ids.astype(np.int64, copy=False), len(first)


def codes(array, null_as=None) -> tuple[np.ndarray, int]:
    """Each value's code in [0, span), equal values equal codes, null code 0; and span. A string
    is its index in the column's dictionary (dictionary-encoded here if the read did not);
    `null_as` is a string value that null joins (Spark's coalesce(column, null_as)), so both
    get one code. An integer, boolean or timestamp is its offset from the column's minimum."""
    array = pa.array(array) if isinstance(array, np.ndarray) else whole(array)
    kind = array.type
    if not pa.types.is_dictionary(kind) and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        array = pc.dictionary_encode(array)
        kind = array.type
    if pa.types.is_dictionary(kind):
        dictionary = array.dictionary
        if dictionary.null_count or len(pc.unique(dictionary)) != len(dictionary):  # a value twice, or null
            array = pc.dictionary_encode(array.cast(kind.value_type))
            dictionary = array.dictionary
        indices = array.indices
        code = pc.fill_null(indices, -1).to_numpy().astype(np.int64) + 1
        if null_as is not None and indices.null_count:
            at = pc.index(dictionary, pa.scalar(null_as, dictionary.type)).as_py()
            if at >= 0:
                code[code == 0] = at + 1
        return code, len(dictionary) + 1
    values = array if pa.types.is_int64(kind) else array.cast(_I64)
    low, high = (s.as_py() for s in pc.min_max(values).values())
    if low is None:  # every value null
        return np.zeros(len(values), np.int64), 1
    if high - low + 2 < _LIMIT and low > _MIN:
        return pc.fill_null(values, low - 1).to_numpy() - (low - 1), high - low + 2
    code, span = _dense(pc.fill_null(values, low).to_numpy())  # a range too wide: hashed
    if values.null_count:  # null keeps code 0
        return np.where(pc.is_valid(values).to_numpy(zero_copy_only=False), code + 1, 0), span + 1
    return code, span


def pack(columns, native: bool = True) -> np.ndarray:
    """One int64 per row, equal exactly where every column's value is (each column an array, or
    (array, null_as) as `codes` takes): the columns' codes in mixed radix; when the product of
    their spans would pass 2^62, the key so far is first made dense (hashed to 0..n-1). A
    dictionary or integer column's codes are folded in by C where it is built (`native`),
    straight from its Arrow buffers (`_code_source`); else by numpy (`codes`, the reference)."""
    key, span = None, 1
    for column in columns:
        array, null_as = column if isinstance(column, tuple) else (column, None)
        source = _code_source(array, null_as) if native and _ACCUMULATE is not None else None
        code, more = (None, source.span) if source is not None else codes(array, null_as)
        if key is not None and span * more >= _LIMIT:
            key, span = _dense(key)
            if span * more >= _LIMIT:
                code, more = _dense(code if code is not None else codes(array, null_as)[0])
        if code is None:  # one pass over the column's own buffers
            first = key is None
            if first:
                key = np.empty(len(source.values), np.int64)
            _ACCUMULATE(key, *source, first)
            span = more if first else span * more
        elif key is None:
            key, span = code, more
        else:
            key = key * more + code
            span *= more
    return key


class _CodeSource(NamedTuple):
    """A key column as accumulate_codes takes it (in this order): code = value - low + 1, null null_code."""

    values: np.ndarray  # its values, or a dictionary's indices: a view of Arrow's buffer from the column's offset
    width: int  # bytes a value
    signed: bool
    validity: np.ndarray | bytes  # Arrow's validity bitmap; empty: no nulls
    bit_offset: int  # the column's first bit in it
    low: int
    span: int
    null_code: int


def _code_source(array, null_as) -> _CodeSource | None:
    """What accumulate_codes folds a key column's codes from, the codes `codes` would make; None
    where only `codes` makes them (strings to encode, booleans, timestamps, a dictionary holding
    a value twice or null, a range too wide)."""
    array = pa.array(array) if isinstance(array, np.ndarray) else whole(array)
    kind, rows, null_code = array.type, len(array), 0
    if not rows:
        return None
    if pa.types.is_dictionary(kind):
        dictionary = array.dictionary
        if dictionary.null_count or len(pc.unique(dictionary)) != len(dictionary):
            return None
        values, low, span = array.indices, 0, len(dictionary) + 1
        if null_as is not None and values.null_count:
            null_code = pc.index(dictionary, pa.scalar(null_as, dictionary.type)).as_py() + 1  # 0: not there
    elif pa.types.is_signed_integer(kind) or pa.types.is_unsigned_integer(kind) and kind.bit_width <= 32:
        low, high = (s.as_py() for s in pc.min_max(array).values())
        if low is None or not (high - low + 2 < _LIMIT and low > _MIN):
            return None
        values, span = array, high - low + 2
    else:
        return None
    signed = pa.types.is_signed_integer(values.type)
    width = values.type.bit_width // 8
    data = np.frombuffer(values.buffers()[1], np.dtype(f"{'i' if signed else 'u'}{width}"),
                         count=values.offset + rows)[values.offset:]
    bitmap = values.buffers()[0]
    validity = np.frombuffer(bitmap, np.uint8) if bitmap is not None and values.null_count else b""
    return _CodeSource(data, width, signed, validity, values.offset, low, span, null_code)


class Groups:
    """Rows grouped by an int64 key (`pack`): each row's group id, dense in the order the groups
    first appear, and each group's first row. Its sums, minima, maxima and counts are a C loop each
    over Arrow's buffers where it is built (`native`), else numpy's (the reference)."""

    def __init__(self, key: np.ndarray, native: bool = True):
        self.ids, self.first = first_seen(key, native)
        self.number = len(self.first)  # of groups
        self.native = native and _REDUCE is not None

    @classmethod
    def of(cls, columns) -> "Groups":
        return cls(pack(columns))

    def keys(self, array) -> pa.Array:
        """A key column's value for each group (its first row's); a dictionary stays one."""
        return whole(array).take(pa.array(self.first))

    def size(self) -> pa.Array:
        """Rows per group (Spark's count(*))."""
        return pa.array(np.bincount(self.ids, minlength=self.number).astype(np.int64))

    def count(self, condition) -> pa.Array:
        """Each group's rows where `condition` holds, null counting as false (count(when(...)))."""
        return self.reduce([("count", condition)])[0]

    def sum(self, values, where=None) -> pa.Array:
        """Each group's sum of `values` (int64), over the rows where `where` holds if given;
        null where no such value is valid (Spark's sum(when(where, values)))."""
        return self.reduce([("sum", values, where)])[0]

    def min(self, values) -> pa.Array:
        return self.reduce([("min", values)])[0]

    def max(self, values) -> pa.Array:
        return self.reduce([("max", values)])[0]

    def reduce(self, requests) -> list[pa.Array]:
        """Several reductions at once, each ("sum", values[, where]), ("min", values), ("max", values) or
        ("count", condition), as the methods above give them: in one C call where it is built and every
        column is an integer or timestamp (a condition boolean), else one numpy reduction each."""
        requests = [(op, whole(column), None if len(rest) == 0 or rest[0] is None else whole(rest[0]))
                    for op, column, *rest in requests]
        specs = [self._spec(*request) for request in requests] if self.native else [None]
        if any(spec is None for spec in specs) or not requests:
            return [self._count(column) if op == "count" else self._reduce(_UFUNCS[op], column, where)
                    for op, column, where in requests]
        k = len(specs)
        out = np.empty((k, self.number), np.int64)
        # a group left empty (null) is possible only where rows are left out: a null value or a condition
        partial = [op != "count" and (column.null_count or where is not None) for op, column, where in requests]
        seen = np.empty((k, self.number), np.uint8) if any(partial) else _UNSEEN
        _REDUCE(np.ascontiguousarray(self.ids, np.int64), tuple(specs), out, seen)
        return [pa.array(out[j], mask=seen[j] == 0 if partial[j] else None) for j in range(k)]

    @staticmethod
    def _spec(op: str, column: pa.Array, where) -> tuple | None:
        """A request as reduce_groups takes it; None where numpy must reduce it."""
        if op == "count":
            column, where = None, column
            source = (b"", 0, False, b"", 0)
        else:
            source = _int_source(column)
        if source is None or (where is not None and not pa.types.is_boolean(where.type)):
            return None
        condition = (b"", 0, b"", 0) if where is None else (_bitmap(where, 1), where.offset, _bitmap(where, 0),
                                                             where.offset)
        return (_OPS[op], *source, *condition)

    def _count(self, condition) -> pa.Array:
        return pa.array(np.bincount(self.ids, weights=_mask(condition), minlength=self.number).astype(np.int64))

    def _reduce(self, ufunc, values, where) -> pa.Array:
        """ufunc over each group's valid values (chosen by `where`), null for a group with none.
        Rows not chosen count as ufunc's identity: no row is copied out by a mask."""
        array = whole(values)
        start = _STARTS[ufunc]
        out = np.full(self.number, start, np.int64)
        data = _numpy(array)
        if not array.null_count and where is None:
            ufunc.at(out, self.ids, data)
            return pa.array(out)
        chosen = _mask(pc.is_valid(array)) if where is None else _mask(pc.and_(where, pc.is_valid(array)))
        # a product is cheaper than np.where (and the sum's identity is 0)
        ufunc.at(out, self.ids, data * chosen if ufunc is np.add else np.where(chosen, data, start))
        return pa.array(out, mask=np.bincount(self.ids, weights=chosen, minlength=self.number) == 0)


_UFUNCS = {"sum": np.add, "min": np.minimum, "max": np.maximum}
_STARTS = {np.add: 0, np.minimum: np.iinfo(np.int64).max, np.maximum: np.iinfo(np.int64).min}
_OPS = {"sum": _SUM, "min": _MIN, "max": _MAX, "count": _COUNT}
_UNSEEN = np.empty(0, np.uint8)  # reduce_groups' `seen` when no group can be left empty: not written


def _bitmap(array, index: int) -> np.ndarray | bytes:
    """Buffer `index` of an array (0: validity, 1: a boolean's values) as bytes numpy can lend; b"" for none
    (a validity bitmap of an array without nulls is not read)."""
    buffer = array.buffers()[index]
    if buffer is None or (index == 0 and not array.null_count):
        return b""
    return np.frombuffer(buffer, np.uint8)


def _int_source(array: pa.Array) -> tuple | None:
    """An integer or timestamp array as reduce_groups' values: (values, itemsize, signed, validity, bit offset);
    None for other types (numpy reduces them)."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        kind, signed = _I64, True
    elif pa.types.is_signed_integer(kind):
        signed = True
    elif pa.types.is_unsigned_integer(kind) and kind.bit_width <= 32:
        signed = False
    else:
        return None
    width = kind.bit_width // 8
    data = array.buffers()[1]
    if data is None or not len(array):
        return None
    values = np.frombuffer(data, np.dtype(f"{'i' if signed else 'u'}{width}"), count=array.offset + len(array))
    return values[array.offset:], width, signed, _bitmap(array, 0), array.offset


def _mask(condition) -> np.ndarray:
    """A boolean column as numpy booleans, null as false."""
    return pc.fill_null(whole(condition), False).to_numpy(zero_copy_only=False)


def _numpy(array: pa.Array) -> np.ndarray:
    """An integer, boolean or timestamp array's values as int64 (nulls as 0)."""
    kind = array.type
    if pa.types.is_boolean(kind):
        array = array.cast(pa.int8())
    elif not pa.types.is_integer(kind):
        array = array.cast(_I64)
    return pc.fill_null(array, 0).to_numpy().astype(np.int64, copy=False)
