"""The capture's batch builder against its per-row reference (tests/support/per_row_batch.py), in C and numpy.

BatchBuilder converts whole columns with numpy and cuts the integer_fields figures in C
(capture._columns) or numpy (IntegerFieldColumns.cut_numpy, where the extension is not
built or KINSPECT_PURE_PYTHON=1). Both must give the record batches of the per-row builder
the writer used before, and byte-identical Parquet: on every recorded conversation in
batches of several sizes, and on edge cases (empty batches, exchanges without a response,
reasons instead of scans, rows without integer fields, slots of absent fields, histograms
with zeros, nulls in some rows of a nullable column, times at half a microsecond).
"""

from __future__ import annotations

import io
import os
import pickle
import random
from array import array

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kinspect.capture import columns as columns_module
from kinspect.capture.batch import BatchBuilder
from kinspect.capture.columns import _LAYOUT, IntegerFieldColumns, native_cut
from kinspect.capture.facts import FIELDS, share_alike_sides
from kinspect.capture.writer_process import pickled_slices
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codegen import SLOT_OCCURRENCES, SLOT_STRIDE, SLOT_UHIST, SLOT_ZHIST
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV
from tests.support.capture_facts import AT, recorded_facts, with_fields, with_side
from tests.support.per_row_batch import BatchBuilder as PerRowBuilder

PURE = os.environ.get(PURE_PYTHON_ENV) == "1"
# The C cutter where it can be used; the tests of it fail (never skip) when it is not built: CI builds it.
NATIVE = [False] if PURE else [False, True]


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


@pytest.fixture(scope="module")
def recorded(codec) -> list[tuple]:
    return recorded_facts(codec)


def builders(codec, native: bool, offset: float = 1_700_000_000.25) -> tuple:
    if native and native_cut() is None:
        pytest.fail(f"kinspect.capture._columns is not built; reinstall with a C compiler or set {PURE_PYTHON_ENV}=1")
    ours = BatchBuilder(offset, codec.registry, native=native)
    assert (ours._integer_fields._cut is not None) == native
    return ours, PerRowBuilder(offset, codec.registry)


def parquet(batches: list) -> bytes:
    out = io.BytesIO()
    with pq.ParquetWriter(out, batches[0].schema, compression="zstd") as writer:
        writer.write_table(pa.Table.from_batches(batches))
    return out.getvalue()


def same_batches(ours: BatchBuilder, theirs: PerRowBuilder, facts: list[tuple], size: int, write: bool = True) -> None:
    """Equal record batches, `size` rows at a time, and byte-identical Parquet of them all (`write`)."""
    mine, reference = [], []
    for i in range(0, max(len(facts), 1), size):
        part = facts[i:i + size]
        mine.append(ours.build(part))
        reference.append(theirs.build(part))
        assert mine[-1].schema.equals(reference[-1].schema, check_metadata=True)
        for name in mine[-1].schema.names:
            assert mine[-1].column(name).equals(reference[-1].column(name)), (name, i)
        mine[-1].validate(full=True)
    if write:
        assert parquet(mine) == parquet(reference)


def counters(rows: list[list[int]]) -> bytes:
    """A scan's int_stats: one slot of SLOT_STRIDE counters per row (missing counters are 0)."""
    return array("i", [v for row in rows for v in (row + [0] * SLOT_STRIDE)[:SLOT_STRIDE]]).tobytes()


def slot(occurrences: int, uhist: list[int], zhist: list[int], count: int = 3, fixed=(8, 5, 4)) -> list[int]:
    row = [0] * SLOT_STRIDE
    row[SLOT_OCCURRENCES] = occurrences
    row[1], row[2], row[3], row[4] = count, *fixed
    row[SLOT_UHIST:SLOT_UHIST + len(uhist)] = uhist
    row[SLOT_ZHIST:SLOT_ZHIST + len(zhist)] = zhist
    return row


# ----------------------------------------------------------------------------- recorded traffic


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("size", [512, 37, 1])
def test_recorded_traffic_gives_the_per_row_builders_batches_and_parquet(codec, recorded, native, size):
    ours, theirs = builders(codec, native)
    same_batches(ours, theirs, recorded * 2, size)


@pytest.mark.parametrize("native", NATIVE)
def test_rows_sharing_their_scans_keep_what_their_own_header_and_sizes_say(codec, recorded, native):
    """What a row's sides give is reused while the next row has the same SCAN objects; each row's header tags,
    client id, sizes and response header version still count as its own (a shared scan met with other
    headers right after it, and again in any order)."""
    rng = random.Random(11)
    flexible = [f for f in recorded if type(f[AT["request_side"]]) is tuple and f[AT["request_side"]][2] is not None]
    responded = [f for f in recorded if type(f[AT["response_side"]]) is tuple and f[AT["response_side"]][2] is not None]
    assert flexible and responded  # non-flexible versions with compact deltas on both sides
    rows = []
    for facts in (flexible + responded) * 3:
        rows.append(facts)
        rows.append(with_fields(
            facts, client_id=rng.choice([None, "", "other-client", "klient-\u00e9\u00e8"]),
            request_header_tags=rng.choice([(), ((0, 3),), ((1, 2), (7, 40))]),
            request_header_tag_bytes=rng.randrange(0, 50), request_size=facts[AT["request_size"]] + rng.randrange(9),
            request_header_size=facts[AT["request_header_size"]] + rng.randrange(5),
            **({} if facts[AT["response_size"]] is None else dict(
                response_header_version=rng.choice([0, 1]), response_size=facts[AT["response_size"]] + rng.randrange(9),
                response_header_tag_bytes=rng.randrange(0, 9), response_header_tags=rng.choice([(), ((2, 5),)])))))
    shuffled = list(rows)
    rng.shuffle(shuffled)
    ours, theirs = builders(codec, native)
    same_batches(ours, theirs, rows, 512)  # each row right after one with the same sides
    same_batches(ours, theirs, shuffled, 512)


@pytest.mark.parametrize("native", NATIVE)
def test_shuffled_traffic_with_every_kind_of_row_mixed(codec, recorded, native):
    """Every edge case below, mixed into the recorded rows in one batch (nulls in some rows of each column)."""
    rng = random.Random(7)
    rows = list(recorded) + edge_rows(recorded)
    rng.shuffle(rows)
    ours, theirs = builders(codec, native)
    same_batches(ours, theirs, rows, 512)


# ----------------------------------------------------------------------------- edge cases


def scanned(recorded: list[tuple]) -> tuple:
    """A recorded exchange whose two sides have scans with integer counters and a compact-size delta."""
    return next(f for f in recorded if type(f[AT["request_side"]]) is tuple and type(f[AT["response_side"]]) is tuple
                and f[AT["request_side"]][4] is not None and f[AT["response_side"]][4] is not None
                and f[AT["request_side"]][2] is not None)


def half_microseconds() -> list[float]:
    """Times whose microseconds end in exactly .5 (round() takes them to the even neighbour)."""
    out = []
    for k in range(1, 200_000):
        t = k / 2 ** 20
        if (t * 1_000_000) % 1 == 0.5:
            out.append(t)
        if len(out) == 8:
            return out
    raise AssertionError("no time at half a microsecond")


def edge_rows(recorded: list[tuple]) -> list[tuple]:
    base = scanned(recorded)
    req, side = base[AT["request_side"]], base[AT["response_side"]]
    slots = (("A", "int32"), ("B.C", "int64"), ("D", "int16"))
    no_response = dict.fromkeys(FIELDS[AT["response_time"]:], None)
    rows = [
        with_fields(base, **no_response),  # acks=0: no response, no latency
        with_fields(base, request_side="the 9999-byte frame was larger than the inspection limit",
                    response_side="unknown api"),
        with_fields(base, response_side="decode error at offset 3"),
        with_fields(base, request_side=with_side(req, stats=None), response_side=with_side(side, stats=None)),
        with_fields(base, request_side=with_side(req, stats=None)),
        with_fields(base, response_side=with_side(side, stats=None)),
        with_fields(base, client_id=None),  # the flexible header's ClientId of a null client id
        with_fields(base, client_id="zé✓-\U0001f600"),  # 1 to 4 UTF-8 bytes a character
        with_fields(base, node_id=7, request_header_tags=((1, 3), (2, 0)), response_header_tags=((5, 2),)),
        with_fields(base, request_side=with_side(req, slots=slots, stats=counters([
            slot(0, [1], [1]),  # absent: its figures are never read
            slot(2, [0, 0, 0], [0] * 10),  # present, every count zero
            slot(-1, [4], [4]),  # a negative occurrence counts as absent
        ])), response_side=with_side(side, slots=slots, stats=counters([
            slot(1, [0, 3, 0, 1], [0] * 9 + [2], count=2 ** 31 - 1),  # zeros inside; the last bucket; the largest count
            slot(5, [1] * 10, [-3], fixed=(2 ** 31 - 1, -1, -2 ** 31)),
            slot(0, [], []),
        ]))),
        with_fields(base, request_side=with_side(req, slots=slots, stats=counters([slot(0, [], [])] * 3))),
    ]
    rows += [with_fields(base, request_time=t, response_time=t + 0.5, latency=t) for t in half_microseconds()]
    return rows


@pytest.mark.parametrize("native", NATIVE)
def test_record_summaries_magics_and_topics_of_both_sides(codec, recorded, native):
    """Produce requests of one batch (the builder's short cut) and of several, old magics, negative counts,
    record fields without batches; response topics the same as the request's, or not."""
    base = with_fields(scanned(recorded), api_key=0, api_name="Produce")
    req, side = base[AT["request_side"]], base[AT["response_side"]]
    one = ("t", 1),
    summaries = [  # RECORDS: per records field, None or its batches' (magic, records, compression, length)
        (((0, 3, "none", 100),),), (((1, 2, "gzip", 80),),), (((2, -1, "zstd", 60),),),  # one batch
        (((2, 5, "lz4", 70), (0, 1, "none", 30), (2, 4, "lz4", 50)),),  # several in one field
        (((1, 2, "none", 10),), None, ((2, 2, "snappy", 20),)),  # several fields, one not a record set
        ((),), (None,), ()]
    rows = []
    for records in summaries:
        for topics in (one, (("t", 3),), (("u", 1), ("t", 1)), ()):
            rows.append(with_fields(base, request_side=with_side(req, topics=one, records=records),
                                    response_side=with_side(side, topics=topics, records=())))
            rows.append(with_fields(base, api_key=1, api_name="Fetch", request_side=with_side(req, topics=topics),
                                    response_side=with_side(side, topics=one, records=records)))
    ours, theirs = builders(codec, native)
    for row in rows:
        same_batches(ours, theirs, [row], 1, write=False)
    same_batches(ours, theirs, rows, 512)
    magics = ours.build(rows).column("record_magics").to_pylist()
    assert [0] in magics and [1] in magics and [0, 2] in magics and [1, 2] in magics


@pytest.mark.parametrize("native", NATIVE)
def test_edge_cases_one_at_a_time_and_together(codec, recorded, native):
    rows = edge_rows(recorded)
    for offset in (0.0, 1_700_000_000.25):
        ours, theirs = builders(codec, native, offset)
        for row in rows:
            same_batches(ours, theirs, [row], 1)
        same_batches(ours, theirs, rows, 512)


def test_many_client_ids_are_sized_right_and_not_all_remembered(codec, recorded):
    ours, theirs = builders(codec, False)
    base = scanned(recorded)
    rows = [with_fields(base, client_id=f"client-{i}-" + "é" * (i % 5)) for i in range(5000)]
    same_batches(ours, theirs, rows, 512)
    assert 0 < len(ours._utf8_sizes) <= 4096


@pytest.mark.parametrize("native", NATIVE)
def test_slices_unpickled_one_at_a_time_number_each_slot_table_once(codec, recorded, native, monkeypatch):
    """A writer process unpickles each slice of a batch into copies of its own of the codec's slot tables:
    each distinct table keeps one number (it got a new one with every copy, kept for good), the lookup by
    id stays bounded, and the rows are the per-row builder's."""
    monkeypatch.setattr(columns_module, "ID_CACHE_ENTRIES", 50, raising=False)
    ours, theirs = builders(codec, native)
    distinct = {(location, side[3]) for f in recorded for location, side in enumerate((f[AT["request_side"]],
                                                                                       f[AT["response_side"]]))
                if type(side) is tuple and side[4] is not None}
    assert len(distinct) > 10
    pieces = pickled_slices(share_alike_sides(recorded))
    copies = [row for _ in range(4) for piece in pieces for row in pickle.loads(piece)]
    first = next(i for i, f in enumerate(recorded) if type(f[AT["request_side"]]) is tuple and f[AT["request_side"]][3])
    assert copies[first][AT["request_side"]][3] is not recorded[first][AT["request_side"]][3]  # copies indeed
    same_batches(ours, theirs, copies, 512)
    assert len(ours._integer_fields._table_labels) == len(distinct)
    assert all(len(by_id) <= 50 for by_id in ours._integer_fields.tables)


@pytest.mark.parametrize("native", NATIVE)
def test_an_empty_batch_and_batches_without_integer_fields(codec, recorded, native):
    ours, theirs = builders(codec, native)
    same_batches(ours, theirs, [], 512)
    assert ours.build([]).num_rows == 0
    plain = [with_fields(f, request_side="not inspected", response_side=None) for f in recorded[:40]]
    same_batches(ours, theirs, plain, 512)
    assert ours.build(plain).column("integer_fields").to_pylist() == [[]] * 40


@pytest.mark.parametrize("native", NATIVE)
def test_every_nullable_column_all_null_some_null_and_none_null(codec, recorded, native):
    base = scanned(recorded)
    no_response = with_fields(base, **dict.fromkeys(FIELDS[AT["response_time"]:], None))
    ours, theirs = builders(codec, native)
    for rows in ([base] * 5, [no_response] * 5, [base, no_response] * 3):
        for node_id in (None, 3):
            same_batches(ours, theirs, [with_fields(r, node_id=node_id) for r in rows], 512)
    batch = ours.build([no_response, base])
    assert batch.column("response_size").null_count == 1 and batch.column("response_time").null_count == 1


@pytest.mark.parametrize("native", NATIVE)
def test_facts_that_are_not_exchanges_raise_and_nulls_stay_nulls_as_before(codec, recorded, native):
    """A tuple of another length, or a value out of its column's range, raises (the sink then builds the batch's
    rows one by one and counts the bad one); a None where the schema has no nulls is a null, as it was."""
    ours, theirs = builders(codec, native)
    base = recorded[0]
    for bad in ([base[:-1]], [with_fields(base, request_size=2 ** 40)], [with_fields(base, api_key=-2 ** 15 - 1)],
                [with_fields(base, request_header_tag_bytes=2 ** 31)],
                [with_fields(base, node_id=2 ** 31), with_fields(base, node_id=None)]):  # with nulls beside it
        for builder in (ours, theirs):
            with pytest.raises((ValueError, OverflowError, pa.ArrowInvalid)):
                builder.build(bad)
    nulls = [with_fields(base, api_key=None), with_fields(base, correlation_id=None), with_fields(base, request_time=None),
             with_fields(base, connection_id=None)]
    same_batches(ours, theirs, nulls, 512, write=False)  # Parquet refuses them, in both: the sink counts a write error


# ----------------------------------------------------------------------------- the C cutter against numpy


def random_batch(rng: random.Random, columns: IntegerFieldColumns, tables: list[tuple]) -> tuple:
    """(counters, table numbers, scans per row) of a random batch."""
    counts, numbers, per_row = [], [], []
    for _ in range(rng.randrange(0, 60)):
        k = rng.choice((0, 0, 1, 2))
        per_row.append(k)
        for _ in range(k):
            location, slots = rng.choice(tables)
            numbers.append(columns.table_number(location, slots))
            counts.append(counters([
                slot(rng.choice((0, 0, 1, 3, -2)), [rng.choice((0, 0, 1, 2 ** 31 - 1)) for _ in range(rng.randrange(11))],
                     [rng.choice((0, 1, -1)) for _ in range(rng.randrange(11))], count=rng.randrange(-5, 2 ** 31),
                     fixed=(rng.randrange(2 ** 31), -rng.randrange(9), rng.randrange(9)))
                for _ in slots]))
    return counts, numbers, per_row


def test_the_c_cutter_cuts_what_numpy_cuts():
    cut = native_cut()
    if PURE:
        assert cut is None
        pytest.skip(f"{PURE_PYTHON_ENV}=1 forces the numpy path")
    assert cut is not None, "kinspect.capture._columns is not built; reinstall with a C compiler"
    rng = random.Random(11)
    columns = IntegerFieldColumns(native=False)
    tables = [(rng.randrange(2), tuple((f"F{i}.{j}", "int32") for j in range(rng.randrange(0, 6)))) for i in range(8)]
    for _ in range(300):
        scans, numbers, per_row = random_batch(rng, columns, tables)
        labels = [columns._table_labels[n] for n in numbers]
        for rows in (per_row, tuple(per_row)):
            native = [np.frombuffer(part, np.int64 if i in (3, 4, 5) else np.int32)
                      for i, part in enumerate(cut(scans, labels, rows, *_LAYOUT))]
            reference = columns.cut_numpy(np, scans, numbers, rows)
            assert len(native) == len(reference) == 10
            for mine, theirs in zip(native, reference):
                assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


def test_counters_that_do_not_fit_their_tables_are_refused_by_both():
    columns = IntegerFieldColumns(native=False)
    number = columns.table_number(0, (("A", "int32"), ("B", "int32")))
    labels = columns._table_labels[number]
    one = counters([slot(1, [1], [1])])
    cases = [
        ([one[:-8]], [number], [1]),  # not whole slots
        ([one], [number], [1]),  # one slot for a table of two
        ([one + one], [number], [2]),  # rows of two scans, one given
        ([one + one], [number], [0]),
    ]
    cut = native_cut()
    for scans, numbers, per_row in cases:
        with pytest.raises(ValueError):
            columns.cut_numpy(np, scans, numbers, per_row)
        if cut is not None:
            with pytest.raises(ValueError):
                cut(scans, [labels] * len(numbers), per_row, *_LAYOUT)
    if cut is not None:
        with pytest.raises(TypeError):
            cut([bytearray(one + one)], [labels], [1], *_LAYOUT)
        with pytest.raises(ValueError):
            cut([one + one], [labels], [-1], *_LAYOUT)
