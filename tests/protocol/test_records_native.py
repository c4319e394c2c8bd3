"""The C record-set summary (_wire.summarize_records) agrees exactly with records.summarize_records_python.

Same batches, same field values and types, same truncated tails, same RecordsError
(message and byte offset) on every record set tests/protocol/test_records.py builds, on every
truncation of a mixed set, and on random and corrupted bytes; and the C scanner puts
exactly the reference summaries (None for what is not a record set) in ScanResult.records.
"""

from __future__ import annotations

import array
import gc
import random
import struct
import sys
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinspect.protocol.codec import codegen
from kinspect.protocol import records as records_module
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codec import _compile
from kinspect.protocol.codec.runtime import summarize_spans_python
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.records import BatchSummary, RecordsError, RecordsSummary, summarize_records_python
from kinspect.protocol.codec.scan_result import ScanResult
from tests.protocol.test_records import (
    CODEC_NAMES,
    GZIP,
    HYPOTHESIS,
    LZ4,
    NEEDS_XXHASH,
    NONE,
    SNAPPY,
    TS,
    V2_ATTRIBUTES_POS,
    V2_COUNT_POS,
    V2_HEADER,
    ZSTD,
    _entry,
    broker_stamp_v2,
    control_batch,
    legacy_entries,
    legacy_set_attributes,
    legacy_set_timestamp,
    memory_records,
    mixed_record_set,
    refresh_legacy_crc,
    refresh_v2_crc,
    v2_batch,
)
from tests.support.native import native_module

_wire, _MISSING = native_module("kinspect.protocol.codec._wire")


def native():
    """_wire.summarize_records; fails the test when the extension is missing."""
    if _wire is None:
        pytest.fail(_MISSING)
    return _wire.summarize_records


# --------------------------------------------------------------------------- comparing


def outcome(fn, data, *args):
    try:
        return "ok", fn(data, *args)
    except RecordsError as err:
        assert type(err) is RecordsError
        return "error", (str(err), err.reason, err.offset, err.args)


def assert_same_summary(ours, ref) -> None:
    """Equal, with the same classes and the same type for every value (True is not 1 here)."""
    assert type(ours) is type(ref) is RecordsSummary
    assert type(ours.batches) is tuple
    assert ours.to_dict() == ref.to_dict()
    assert ours == ref and hash(ours) == hash(ref)
    assert [type(v) for v in ours[1:]] == [type(v) for v in ref[1:]] == [int, int]
    assert len(ours.batches) == len(ref.batches)
    for a, b in zip(ours.batches, ref.batches):
        assert type(a) is type(b) is BatchSummary
        assert [type(v) for v in a] == [type(v) for v in b]
        assert tuple(a) == tuple(b)


def agree(data, *, valid: bool | None = None):
    """The C and Python summaries of data: both fail alike or both give the same summary."""
    c_kind, c_value = outcome(native(), data)
    py_kind, py_value = outcome(summarize_records_python, data)
    assert c_kind == py_kind, (bytes(data).hex(), c_value, py_value)
    if valid is not None:
        assert (py_kind == "ok") is valid, py_value
    if py_kind == "ok":
        if py_value is None:
            assert c_value is None
        else:
            assert_same_summary(c_value, py_value)
    else:
        assert c_value == py_value  # same message, reason, offset
    return py_value


# --------------------------------------------------------------------------- the record sets of test_records.py


def _legacy_minimum_sizes() -> bytes:
    v0 = bytearray(26)
    struct.pack_into(">qiIbbii", v0, 0, 1, 14, 0, 0, 0, -1, -1)
    refresh_legacy_crc(v0)
    v1 = bytearray(34)
    struct.pack_into(">qiIbbqii", v1, 0, 2, 22, 0, 1, 0, TS, -1, -1)
    refresh_legacy_crc(v1)
    return bytes(v0 + v1)


def _v2_empty_batch() -> bytes:
    buf = bytearray(61)
    struct.pack_into(">qiib", buf, 0, 10, 49, 0, 2)
    refresh_v2_crc(buf)
    return bytes(buf)


def _v2_headers_and_nulls() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, NONE, False, -1, -1, -1, 1 << 20)
    builder.append(0, TS, None, None, [("h", b"v"), ("n", None)])
    builder.append(1, TS + 1, b"", b"", [])
    return bytes(builder.build())


def _v2_unknown_codecs() -> list[bytes]:
    out = []
    for codec in (5, 6, 7):
        buf = bytearray(v2_batch(NONE))
        struct.pack_into(">h", buf, V2_ATTRIBUTES_POS, codec)
        out.append(bytes(buf))
    return out


def _huge_declared_lengths() -> list[bytes]:
    header = bytearray(V2_HEADER)
    struct.pack_into(">qiibIhiqqqhii", header, 0, 5, 2**31 - 1, 1, 2, 0, 1, 9, TS, TS, -1, -1, -1, 2**31 - 1)
    return [bytes(header) + b"\x00" * 100, struct.pack(">qiIbbq", 0, 2**31 - 1, 0, 1, 0, TS)]


def _garbage_payloads() -> bytes:
    data = bytearray(mixed_record_set())
    for batch in summarize_records_python(bytes(data)).batches:
        header = {2: V2_HEADER, 1: 26, 0: 18}[batch.magic]
        start, end = batch.offset + header, batch.offset + batch.size
        data[start:end] = bytes((i * 131 + 7) & 0xFF for i in range(end - start))
    return bytes(data)


def _invalid_sets() -> list[bytes]:
    first = bytes(v2_batch())
    out = [
        struct.pack(">qi", 0, -1) + bytes(20),
        struct.pack(">qi", 0, -5),
        first + struct.pack(">qi", 0, -(2**31)) + bytes(30),
        struct.pack(">qi", 0, 3) + b"\x00",
        struct.pack(">qi", 0, 13) + bytes(4),
        struct.pack(">qi", 0, 13) + bytes(5),
    ]
    short_v2 = bytearray(first)
    struct.pack_into(">i", short_v2, 8, 48)
    out.append(bytes(short_v2))
    struct.pack_into(">i", short_v2, 8, 49)
    out.append(bytes(short_v2[:61]))  # valid: an empty batch, truncated
    for magic, minimum in ((0, 14), (1, 22)):
        out.append(struct.pack(">qiIbbq", 0, minimum - 1, 0, magic, 0, 0) + bytes(40))
    for magic in (3, 4, 0x7F, 0x80, 0xFF):
        buf = bytearray(first)
        buf[16] = magic
        out += [bytes(buf), bytes(buf[:17])]
    negative = bytearray(first)
    struct.pack_into(">i", negative, V2_COUNT_POS, -1)
    out += [bytes(negative), bytes(negative[:70]), bytes(negative[:61]), bytes(negative[:60])]
    return out


def record_sets() -> list[bytes]:
    """Every record set tests/protocol/test_records.py builds (valid, truncated and invalid)."""
    import importlib.util

    sets: list = [b""]
    for codec in sorted(CODEC_NAMES):
        sets.append(v2_batch(codec, n=5, timestamps=[TS + 5, TS + 1, TS + 9, TS + 2, TS + 3]))
        sets.append(v2_batch(codec, n=4, transactional=True, producer_id=123456789012, producer_epoch=7,
                             base_sequence=2_000_000_000))
    sets.append(v2_batch(GZIP, producer_id=5, producer_epoch=0, base_sequence=0))
    sets += [control_batch(True), control_batch(False)]
    sets.append(broker_stamp_v2(v2_batch(LZ4, n=3), base_offset=2**40 + 3, leader_epoch=17, extra_attributes=0x08))
    sets += _v2_unknown_codecs()
    sets += [_v2_headers_and_nulls(), _v2_empty_batch()]
    sets += [legacy_entries(0, NONE, n=3), legacy_entries(1, NONE, n=3)]
    has_xxhash = importlib.util.find_spec("xxhash") is not None
    for magic, codec in [(0, GZIP), (0, SNAPPY), (0, LZ4), (1, GZIP), (1, SNAPPY), (1, LZ4)]:
        if magic == 0 and codec == LZ4 and not has_xxhash:
            continue
        sets.append(legacy_entries(magic, codec, n=5))
    sets.append(legacy_set_timestamp(legacy_set_attributes(legacy_entries(1, GZIP, n=3), GZIP | 0x08), TS + 777))
    sets.append(_legacy_minimum_sizes())
    for magic, codec in ([(0, c) for c in (NONE, GZIP, SNAPPY)] + [(1, c) for c in (NONE, GZIP, SNAPPY, LZ4)]
                         + [(2, c) for c in sorted(CODEC_NAMES)]):
        sets.append(memory_records(magic, codec, n=4))
    sets.append(memory_records(2, ZSTD, n=6, transactional=True, producer_id=99, producer_epoch=1, base_sequence=12))
    mixed = mixed_record_set()
    sets += [mixed, mixed + v2_batch(GZIP)[:40], _garbage_payloads()]
    gzip3 = bytes(v2_batch(GZIP, n=3, transactional=True, producer_id=77, producer_epoch=5, base_sequence=9))
    sets += [gzip3[:cut] for cut in (22, 23, 51, 61)]
    sets += [bytes(v2_batch())[:cut] for cut in range(12, 17)]
    sets += _huge_declared_lengths()
    sets.append(bytes(v2_batch(ZSTD, n=2)) + bytes(legacy_entries(1, GZIP, n=2)))
    sets.append(bytes(legacy_entries(0, GZIP, n=2)) + bytes(control_batch(False)))
    sets += _invalid_sets()
    return [bytes(s) for s in sets]


RECORD_SETS = record_sets()


def test_every_record_set_of_the_records_tests():
    outcomes = [agree(data) for data in RECORD_SETS]
    assert sum(isinstance(o, RecordsSummary) for o in outcomes) > 50
    assert sum(isinstance(o, tuple) and not isinstance(o, RecordsSummary) for o in outcomes) > 15  # errors


def test_every_truncation_of_the_mixed_set():
    data = mixed_record_set()
    assert len(agree(data, valid=True).batches) == 10
    for cut in range(len(data) + 1):
        agree(data[:cut], valid=True)
        agree(data[cut:])  # from the middle of a batch: mostly garbage


def test_every_truncation_with_broken_headers():
    """The error checks (length, magic, count) of a cut batch, at every length."""
    base = bytes(v2_batch(GZIP, n=2))
    legacy = bytes(legacy_entries(1, NONE, n=1))
    for head, pos, value in ((base, 8, struct.pack(">i", 30)), (base, 16, b"\x05"),
                             (base, V2_COUNT_POS, struct.pack(">i", -7)), (legacy, 8, struct.pack(">i", 20)),
                             (legacy, 8, struct.pack(">i", -3)), (legacy, 16, b"\x00")):
        broken = bytearray(head)
        broken[pos : pos + len(value)] = value
        for cut in range(len(broken) + 1):
            agree(base + bytes(broken[:cut]))


def test_error_messages_and_offsets():
    first = bytes(v2_batch())
    cases = {
        struct.pack(">qi", 0, -1) + bytes(20): ("negative batch length -1", 8),
        first + struct.pack(">qi", 0, -(2**31)) + bytes(30): ("negative batch length -2147483648", len(first) + 8),
        struct.pack(">qi", 0, 3) + b"\x00": ("batch length 3 is smaller than any record batch or message (14)", 8),
        struct.pack(">qiIbbq", 0, 21, 0, 1, 0, 0) + bytes(40):
            ("message size 21 is smaller than the magic 1 message minimum 22", 8),
        first[:16] + b"\xff": ("unknown magic 255", 16),
    }
    for data, (reason, offset) in cases.items():
        for fn in (native(), summarize_records_python):
            with pytest.raises(RecordsError) as info:
                fn(data)
            assert (info.value.reason, info.value.offset) == (reason, offset)
            assert str(info.value) == f"{reason} (byte {offset})"


# --------------------------------------------------------------------------- inputs


def test_none_and_non_buffers():
    assert native()(None) is None
    for bad in ("not bytes", 12, [1, 2], object()):
        with pytest.raises(TypeError):
            native()(bad)
        with pytest.raises(TypeError):
            summarize_records_python(bad)
    released = memoryview(b"abc")
    released.release()
    with pytest.raises(ValueError):
        native()(released)
    with pytest.raises(TypeError):
        native()()
    with pytest.raises(TypeError):
        native()(b"", 0, 0, 0)


def test_buffer_types_agree():
    data = mixed_record_set() + bytes(v2_batch(GZIP))[:70]
    doubled = bytes(b for byte in data for b in (byte, 0))
    padded = data + bytes(-len(data) % 4)
    views = [
        data, bytearray(data), memoryview(data), memoryview(bytearray(data)),
        memoryview(b"\xff" * 37 + data + b"\xee" * 5)[37 : 37 + len(data)],
        memoryview(data).cast("c"), memoryview(data).cast("b"),
        memoryview(doubled)[::2],  # strided: read in logical order
        memoryview(padded).cast("B", shape=[len(padded) // 4, 4]),  # 2-D, C-contiguous
        memoryview(padded).cast("B", shape=[len(padded) // 4, 4])[::2],  # 2-D, strided
        array.array("I", padded), memoryview(array.array("I", padded))[::-1],
    ]
    for view in views:
        agree(view)


def test_bytearray_cannot_be_resized_while_read():
    data = bytearray(mixed_record_set())
    summary = native()(data)
    data.extend(b"\x00" * 5)  # the export was released
    assert native()(data).truncated_bytes == 5
    assert summary.batch_count == 10


def test_start_and_end():
    data = b"\x01\x02\x03" + mixed_record_set() + b"\xee" * 9
    inner = data[3:-9]
    reference = summarize_records_python(inner)
    assert_same_summary(native()(data, 3, len(data) - 9), reference)
    assert_same_summary(native()(memoryview(data), 3, len(data) - 9), reference)
    assert_same_summary(native()(bytes(inner), 0, None), reference)
    assert_same_summary(native()(bytes(inner), 0), reference)
    for start, end in ((3, 3), (3, 20), (3, 80), (len(data) - 9, len(data))):
        c_kind, c_value = outcome(native(), data, start, end)
        py_kind, py_value = outcome(summarize_records_python, data[start:end])
        assert c_kind == py_kind
        if c_kind == "ok":
            assert_same_summary(c_value, py_value)
        else:
            assert c_value == py_value
    for start, end in ((-1, 5), (5, 4), (0, len(data) + 1)):
        with pytest.raises(ValueError):
            native()(data, start, end)
    with pytest.raises(TypeError):
        native()(data, "0")


# --------------------------------------------------------------------------- hostile input


@HYPOTHESIS
@given(st.binary(max_size=600))
def test_random_bytes(data):
    agree(data)


_VALID_SETS = [
    mixed_record_set(),
    bytes(v2_batch(ZSTD, n=2)) + bytes(legacy_entries(1, GZIP, n=2)),
    bytes(legacy_entries(0, GZIP, n=2)) + bytes(control_batch(False)),
]


@HYPOTHESIS
@given(st.data())
def test_bit_flips_of_valid_sets(data):
    original = data.draw(st.sampled_from(_VALID_SETS))
    buf = bytearray(original)
    # flips anywhere, and flips in the header bytes the walk reads
    anywhere = st.integers(0, len(buf) * 8 - 1)
    headers = [b.offset for b in summarize_records_python(original).batches]
    in_header = st.builds(lambda start, bit: start * 8 + bit, st.sampled_from(headers).flatmap(
        lambda h: st.integers(h, min(h + V2_HEADER, len(buf)) - 1)), st.integers(0, 7))
    flips = data.draw(st.lists(st.one_of(anywhere, in_header), min_size=1, max_size=8))
    for bit in flips:
        buf[bit // 8] ^= 1 << (bit % 8)
    agree(bytes(buf))
    agree(bytes(buf[: data.draw(st.integers(0, len(buf)))]))


@HYPOTHESIS
@given(st.lists(_entry(), max_size=6), st.booleans())
def test_structured_hostile_headers(entries, with_valid_prefix):
    data = (mixed_record_set() if with_valid_prefix else b"") + b"".join(entries)
    agree(data)
    for cut in (len(data) - 1, len(data) // 2, 17, 16, 12, 11):
        if 0 <= cut <= len(data):
            agree(data[:cut])


# --------------------------------------------------------------------------- the scanner


def _scanners(codec: Codec, key: int, direction: str, version: int):
    compiled = codec.body(key, direction, version)
    if not compiled.native:
        pytest.fail(_MISSING if _wire is None else f"{compiled.label} is not served by the C scanner")
    spec = compiled.spec.struct
    reference = _compile(codegen.generate_scanner(spec, version, compiled.flexible, compiled.label), "scan",
                         compiled.label)
    return compiled, reference


def _scan_records_agree(compiled, reference, frame: bytes, fields: list) -> None:
    """C scan: records are the reference summaries of each field, None where RecordsError.

    Both scanners note the same spans, each the bytes of one non-null records field, and
    ScanResult.records summarizes them only when read.
    """
    result = compiled.scan(frame)
    assert result.source is frame
    assert [frame[start:start + n] for start, n in result.spans] == [bytes(d) for d in fields]
    assert result._summaries == []  # nothing summarized before records is read
    expected = []
    for data in fields:
        try:
            expected.append(summarize_records_python(data))
        except RecordsError:
            expected.append(None)
    assert len(result.records) == len(expected)
    for ours, ref in zip(result.records, expected):
        if ref is None:
            assert ours is None
        else:
            assert_same_summary(ours, ref)
    assert result.records is result.records  # summarized once, then kept
    py_result = ScanResult()
    assert reference(frame, 0, py_result) == len(frame)
    assert py_result.record_spans == result.record_spans
    py_result.source = frame
    assert result.finish().to_dict() == py_result.finish().to_dict()
    # The same frame in pieces (as FrameStream hands a large one): the batch headers are read where
    # they lie, a header cut between two pieces included; the scan and its summaries are the same.
    rng = random.Random(len(frame))
    for _ in range(6):
        cuts = sorted(rng.sample(range(len(frame) + 1), min(len(frame) + 1, 5)))
        pieces = FramePieces(frame[a:b] for a, b in zip([0, *cuts], [*cuts, len(frame)]))
        in_pieces = compiled.scan(pieces)
        assert in_pieces.source is pieces and in_pieces.record_spans == result.record_spans
        assert in_pieces.finish().to_dict() == result.to_dict()


_CODEC = Codec()

RECORDS_FIELDS = [
    mixed_record_set(),
    mixed_record_set()[:-30],  # the last batch cut short
    b"",
    bytes(v2_batch())[:16],  # only a tail
    struct.pack(">qi", 0, -1) + bytes(20),  # not a record set: None
    bytes(v2_batch(GZIP))[:16] + b"\x09" + bytes(80),  # unknown magic: None
    bytes(legacy_entries(1, SNAPPY, n=2)),
    None,
]


def test_scanner_produce_records_are_the_reference_summaries(codec):
    compiled, reference = _scanners(codec, 0, "request", 9)
    parts = [{"Index": i, "Records": data} for i, data in enumerate(RECORDS_FIELDS)]
    value = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30000,
             "TopicData": [{"Name": "orders", "PartitionData": parts[:5]},
                           {"Name": "payments", "PartitionData": parts[5:]}]}
    frame = bytes(compiled.encode(value))
    _scan_records_agree(compiled, reference, frame, [d for d in RECORDS_FIELDS if d is not None])


def test_scanner_fetch_records_are_the_reference_summaries(codec):
    compiled, reference = _scanners(codec, 1, "response", 12)
    partitions = [
        {"PartitionIndex": i, "ErrorCode": 0, "HighWatermark": 10, "LastStableOffset": 10, "LogStartOffset": 0,
         "AbortedTransactions": None, "PreferredReadReplica": -1, "Records": data}
        for i, data in enumerate(RECORDS_FIELDS)
    ]
    value = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 1,
             "Responses": [{"Topic": "t", "Partitions": partitions}]}
    frame = bytes(compiled.encode(value))
    _scan_records_agree(compiled, reference, frame, [d for d in RECORDS_FIELDS if d is not None])


@HYPOTHESIS
@given(st.lists(st.one_of(st.binary(max_size=120), st.sampled_from(RECORD_SETS[:40])), min_size=1, max_size=4))
def test_scanner_random_records_fields(fields):
    compiled, reference = _scanners(_CODEC, 0, "request", 9)
    value = {"TransactionalId": None, "Acks": 1, "TimeoutMs": 5,
             "TopicData": [{"Name": "x", "PartitionData": [{"Index": i, "Records": d} for i, d in enumerate(fields)]}]}
    _scan_records_agree(compiled, reference, bytes(compiled.encode(value)), fields)


def _reference_summaries(fields: list) -> list:
    out = []
    for data in fields:
        if data is None:
            continue  # a null records field: no span, no entry
        try:
            out.append(summarize_records_python(data))
        except RecordsError:
            out.append(None)
    return out


def _same_summaries(ours: list, ref: list) -> None:
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        if b is None:
            assert a is None
        else:
            assert_same_summary(a, b)


def test_summaries_of_a_frame_in_pieces_cut_anywhere():
    """summarize_spans over pieces: every cut through the mixed set's batch headers (and one
    cut in two places at once) gives the summaries of the contiguous bytes; so does the
    reference, which joins the pieces."""
    data = mixed_record_set()
    spans = [len(data)]  # one span: start 0, the whole set
    whole: list = []
    _wire.summarize_spans(data, spans, whole)
    for cut in range(len(data) + 1):
        for pieces in (FramePieces((data[:cut], data[cut:])),
                       FramePieces((data[:cut], b"", memoryview(data)[cut:cut + 7], bytearray(data[cut + 7:])))):
            for fn in (_wire.summarize_spans, summarize_spans_python):
                into: list = []
                fn(pieces, spans, into)
                _same_summaries(into, whole)


def test_scan_result_records_are_lazy_and_follow_their_buffer():
    """Spans are summarized from the buffer they were found in, however scans and reads interleave."""
    compiled = _CODEC.body(0, "request", 9)

    def frame(fields):
        return bytes(compiled.encode({"TransactionalId": None, "Acks": 1, "TimeoutMs": 5, "TopicData": [
            {"Name": "x", "PartitionData": [{"Index": i, "Records": d} for i, d in enumerate(fields)]}]}))

    first = [mixed_record_set(), struct.pack(">qi", 0, -1) + bytes(20)]
    second = [bytes(v2_batch()), None, mixed_record_set()[:-30]]
    a, b = frame(first), frame(second)
    expected = _reference_summaries(first + second)

    # Two buffers scanned into one result before records is read.
    result = ScanResult()
    compiled.scan(a, 0, result)
    compiled.scan(b, 0, result)
    assert result.source is b and len(result.record_spans) == 4
    _same_summaries(result.records, expected)

    # Read between the scans: the list grows with the spans of the later scan.
    result = ScanResult()
    compiled.scan(a, 0, result)
    early = result.records
    _same_summaries(early, expected[:2])
    compiled.scan(b, 0, result)
    assert result.records is early
    _same_summaries(early, expected)

    # The reference (what KINSPECT_PURE_PYTHON=1 uses) summarizes the same spans alike.
    result = compiled.scan(b)
    for fn in (_wire.summarize_spans, summarize_spans_python):
        into = ["kept"]
        fn(b, result.record_spans, into)
        _same_summaries(into[1:], expected[2:])
        into = []
        fn(b, result.record_spans, into, 1)
        _same_summaries(into, expected[3:])

    # Spans without a buffer to read them from (a scanner called directly) say so.
    result = ScanResult()
    compiled._scan(a, 0, result)
    with pytest.raises(ValueError, match="source"):
        result.records
    result.source = a
    _same_summaries(result.records, expected[:2])


def test_summarize_spans_rejects_what_the_reference_rejects():
    data = mixed_record_set()
    source = b"ab" + data
    good = 2 << 32 | len(data)
    native()  # fails the test when the extension is missing
    for fn in (_wire.summarize_spans, summarize_spans_python):
        into: list = []
        fn(source, [good, 2 << 32, 0], into)  # the whole set, an empty one at 2, none at 0
        assert into[0] == summarize_records_python(data) and len(into) == 3
        for bad in ([3 << 32 | len(data)], [(len(source) + 1) << 32], [-1], [1 << 72 | 5], [-(1 << 72)]):
            with pytest.raises(ValueError):
                fn(source, bad, [])
    for bad in ((source, ["x"], []), (bytearray(source), [good], []), (source, (good,), []), (source, [good])):
        with pytest.raises(TypeError):
            _wire.summarize_spans(*bad)


# --------------------------------------------------------------------------- memory


def test_no_leaks():
    """Summaries, RecordsErrors and scans leave nothing behind (memory, type references)."""
    fn = native()
    valid = mixed_record_set()
    doubled = bytes(b for byte in valid for b in (byte, 0))
    inputs = [valid, valid[:-30], bytearray(valid), memoryview(valid)[::1], memoryview(doubled)[::2]]
    invalid = [struct.pack(">qi", 0, -1) + bytes(20), valid[:16] + b"\x07", b"\x00" * 80, "not bytes", 7]
    compiled = _CODEC.body(0, "request", 9)
    frame = bytes(compiled.encode({"TransactionalId": None, "Acks": 1, "TimeoutMs": 5, "TopicData": [
        {"Name": "x", "PartitionData": [{"Index": i, "Records": d} for i, d in enumerate([valid, invalid[0]])]}]}))

    def run(times: int) -> None:
        for _ in range(times):
            for data in inputs:
                fn(data)
            fn(valid, 0, len(valid) - 3)
            for data in invalid:
                try:
                    fn(data)
                except (RecordsError, TypeError):
                    pass
            compiled.scan(frame).records
            try:
                _wire.summarize_spans(frame, [len(frame) << 32], [])
            except ValueError:
                pass

    run(50)
    gc.collect()
    refs = (sys.getrefcount(BatchSummary), sys.getrefcount(RecordsSummary), sys.getrefcount(RecordsError))
    tracemalloc.start()
    try:
        run(20)
        before = tracemalloc.get_traced_memory()[0]
        run(500)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    gc.collect()
    assert grown < 20_000, f"{grown} bytes still allocated after 500 rounds"
    assert (sys.getrefcount(BatchSummary), sys.getrefcount(RecordsSummary), sys.getrefcount(RecordsError)) == refs


def test_results_are_untracked_but_complete():
    """C results are left out of the cycle collector (they hold no containers); nothing is lost."""
    summary = native()(mixed_record_set())
    assert not gc.is_tracked(summary) and not gc.is_tracked(summary.batches)
    assert not any(gc.is_tracked(b) for b in summary.batches)
    gc.collect()
    assert summary == summarize_records_python(mixed_record_set())
    assert records_module.summarize_records is _wire.summarize_records
