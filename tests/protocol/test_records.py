"""Tests for kinspect.protocol.records: record-set summaries checked against kafka-python."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka.record import MemoryRecords, MemoryRecordsBuilder
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

from kinspect.protocol import records as records_module
from kinspect.protocol.records import (
    BatchSummary,
    RecordsError,
    RecordsSummary,
    crc32c_py,
    summarize_records,
    verify_crc,
)

try:
    from crc32c import crc32c as crc32c_c
except ImportError:  # pragma: no cover - the test extra installs it
    crc32c_c = None

RECORDS_PY = pathlib.Path(records_module.__file__)

# kafka-python writes magic 0 lz4 (the old, broken framing) only with xxhash installed.
NEEDS_XXHASH = pytest.mark.skipif(
    importlib.util.find_spec("xxhash") is None, reason="magic 0 lz4 needs xxhash"
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
TIMESTAMP_TYPES = {None: "none", 0: "create", 1: "log_append"}
TS = 1_700_000_000_000

HYPOTHESIS = settings(
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Byte positions inside an entry.
V2_CRC_POS, V2_ATTRIBUTES_POS, V2_COUNT_POS, V2_HEADER = 17, 21, 57, 61
LEGACY_CRC_POS, LEGACY_MAGIC_POS, LEGACY_ATTRIBUTES_POS = 12, 16, 17


# --------------------------------------------------------------------------- builders


def _value(i: int) -> bytes:
    # Compressible, so kafka-python keeps the codec instead of falling back to none.
    return b"value-%d-" % i + b"x" * 200


def v2_batch(
    codec: int = NONE,
    n: int = 3,
    *,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamps: list[int] | None = None,
    headers: list | None = None,
) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    timestamps = timestamps or [TS + 10 * i for i in range(n)]
    for i in range(n):
        meta = builder.append(i, timestamps[i], b"key-%d" % i, _value(i), headers or [])
        assert meta is not None
    return builder.build()


def legacy_entries(magic: int, codec: int = NONE, n: int = 3, timestamps=None) -> bytearray:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    timestamps = timestamps or [TS + 10 * i for i in range(n)]
    for i in range(n):
        assert builder.append(i, timestamps[i], b"key-%d" % i, _value(i)) is not None
    return builder.build()


def memory_records(magic: int, codec: int, n: int = 4, **kwargs) -> bytes:
    builder = MemoryRecordsBuilder(magic, codec, 1 << 20, **kwargs)
    for i in range(n):
        assert builder.append(TS + i, b"k%d" % i, _value(i)) is not None
    builder.close()
    return bytes(builder.buffer())


def refresh_v2_crc(buf: bytearray, start: int = 0) -> None:
    (length,) = struct.unpack_from(">i", buf, start + 8)
    end = start + 12 + length
    crc = crc32c_py(memoryview(buf)[start + V2_ATTRIBUTES_POS : end])
    struct.pack_into(">I", buf, start + V2_CRC_POS, crc)


def refresh_legacy_crc(buf: bytearray, start: int = 0) -> None:
    (length,) = struct.unpack_from(">i", buf, start + 8)
    end = start + 12 + length
    crc = zlib.crc32(memoryview(buf)[start + LEGACY_MAGIC_POS : end]) & 0xFFFFFFFF
    struct.pack_into(">I", buf, start + LEGACY_CRC_POS, crc)


def broker_stamp_v2(
    buf: bytearray,
    *,
    base_offset: int | None = None,
    leader_epoch: int | None = None,
    extra_attributes: int = 0,
) -> bytearray:
    """What a broker does to a batch (offset, epoch, log-append/control bits); CRC kept valid."""
    buf = bytearray(buf)
    if base_offset is not None:
        struct.pack_into(">q", buf, 0, base_offset)
    if leader_epoch is not None:
        struct.pack_into(">i", buf, 12, leader_epoch)
    if extra_attributes:
        (attributes,) = struct.unpack_from(">h", buf, V2_ATTRIBUTES_POS)
        struct.pack_into(">h", buf, V2_ATTRIBUTES_POS, attributes | extra_attributes)
    refresh_v2_crc(buf)
    return buf


def control_batch(commit: bool = True) -> bytearray:
    """A transaction marker as a broker writes it: control + transactional, one record."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=NONE, is_transactional=True,
        producer_id=4242, producer_epoch=3, base_sequence=-1, batch_size=1 << 20,
    )
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 17)  # version, coordinator epoch
    builder.append(0, TS, key, value, [])
    return broker_stamp_v2(builder.build(), base_offset=90, extra_attributes=0x20)


def legacy_set_attributes(buf: bytearray, attributes: int, start: int = 0) -> bytearray:
    buf = bytearray(buf)
    struct.pack_into(">b", buf, start + LEGACY_ATTRIBUTES_POS, attributes)
    refresh_legacy_crc(buf, start)
    return buf


def legacy_set_timestamp(buf: bytearray, timestamp: int, start: int = 0) -> bytearray:
    buf = bytearray(buf)
    struct.pack_into(">q", buf, start + 18, timestamp)
    refresh_legacy_crc(buf, start)
    return buf


# --------------------------------------------------------------------------- oracle


def kafka_batches(data) -> list:
    return list(MemoryRecords(bytes(data)))


def assert_matches_kafka(data, summary: RecordsSummary) -> None:
    """Every field of the summary against kafka-python's own reader."""
    theirs = kafka_batches(data)
    assert summary.batch_count == len(theirs)
    assert summary.truncated_bytes == len(data) - MemoryRecords(bytes(data)).valid_bytes()
    assert summary.total_bytes == len(data)
    position = 0
    for ours, batch in zip(summary.batches, theirs):
        assert ours.offset == position
        position += batch.size_in_bytes
        assert ours.size == batch.size_in_bytes
        assert ours.batch_length == batch.size_in_bytes - 12
        assert ours.magic == batch.magic
        assert ours.base_offset == batch.base_offset
        assert ours.compression == CODEC_NAMES[batch.compression_type]
        assert ours.timestamp_type == TIMESTAMP_TYPES[batch.timestamp_type]
        assert ours.truncated is False
        if isinstance(batch, DefaultRecordBatch):
            assert ours.record_count == batch.records_count
            assert ours.producer_id == batch.producer_id
            assert ours.producer_epoch == batch.producer_epoch
            assert ours.base_sequence == batch.base_sequence
            assert ours.transactional == batch.is_transactional
            assert ours.control == batch.is_control_batch
            assert ours.first_timestamp == batch.first_timestamp
            assert ours.max_timestamp == batch.max_timestamp
            assert ours.partition_leader_epoch == batch.leader_epoch
            assert ours.wrapper is False
            assert ours.record_count == len(list(batch))  # the count field is honest here
        else:
            assert isinstance(batch, LegacyRecordBatch)
            inner = list(batch)
            assert ours.record_count == 1
            assert ours.wrapper == (batch.compression_type != 0)
            assert ours.wrapper == (len(inner) > 1 or batch.compression_type != 0)
            assert (ours.producer_id, ours.producer_epoch, ours.base_sequence) == (-1, -1, -1)
            assert ours.partition_leader_epoch == -1
            assert ours.transactional is False and ours.control is False
            if batch.magic == 0:
                assert ours.first_timestamp == ours.max_timestamp == -1
            elif not ours.wrapper or ours.timestamp_type == "log_append":
                # kafka-python hands out the message's (or the log-append wrapper's) timestamp
                assert ours.first_timestamp == ours.max_timestamp == inner[-1].timestamp
    assert position == len(data) - summary.truncated_bytes


def summarize_ok(data) -> RecordsSummary:
    summary = summarize_records(data)
    assert isinstance(summary, RecordsSummary)
    return summary


# --------------------------------------------------------------------------- magic 2


def test_none_input():
    assert summarize_records(None) is None


def test_empty_record_set():
    summary = summarize_ok(b"")
    assert summary.batches == ()
    assert (summary.total_bytes, summary.truncated_bytes) == (0, 0)
    assert summary.record_count == summary.batch_count == 0


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_v2_each_codec(codec):
    data = v2_batch(codec, n=5, timestamps=[TS + 5, TS + 1, TS + 9, TS + 2, TS + 3])
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert batch == BatchSummary(
        offset=0, magic=2, base_offset=0, batch_length=len(data) - 12, record_count=5,
        compression=CODEC_NAMES[codec], timestamp_type="create",
        producer_id=-1, producer_epoch=-1, base_sequence=-1,
        transactional=False, control=False,
        first_timestamp=TS + 5, max_timestamp=TS + 9, partition_leader_epoch=0,
        wrapper=False, truncated=False,
    )
    assert verify_crc(data, batch)


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_v2_transactional_producer_state(codec):
    data = v2_batch(
        codec, n=4, transactional=True, producer_id=123456789012, producer_epoch=7,
        base_sequence=2_000_000_000,
    )
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert batch.transactional is True and batch.control is False
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (123456789012, 7, 2_000_000_000)
    assert batch.record_count == 4
    assert batch.compression == CODEC_NAMES[codec]


def test_v2_idempotent_not_transactional():
    data = v2_batch(GZIP, producer_id=5, producer_epoch=0, base_sequence=0)
    (batch,) = summarize_ok(data).batches
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (5, 0, 0)
    assert batch.transactional is False


@pytest.mark.parametrize("commit", [True, False])
def test_v2_control_batch(commit):
    data = control_batch(commit)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert batch.control is True and batch.transactional is True
    assert batch.base_offset == 90 and batch.record_count == 1
    (marker,) = list(kafka_batches(data)[0])
    assert marker.commit is commit
    assert verify_crc(data, batch)


def test_v2_broker_fields_log_append_epoch_offset():
    data = broker_stamp_v2(v2_batch(LZ4, n=3), base_offset=2**40 + 3, leader_epoch=17, extra_attributes=0x08)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert batch.base_offset == 2**40 + 3
    assert batch.partition_leader_epoch == 17
    assert batch.timestamp_type == "log_append"
    assert batch.compression == "lz4"
    assert verify_crc(data, batch)


def test_v2_unknown_codec_is_reported_not_rejected():
    for codec in (5, 6, 7):
        buf = bytearray(v2_batch(NONE))
        struct.pack_into(">h", buf, V2_ATTRIBUTES_POS, codec)
        (batch,) = summarize_ok(buf).batches
        assert batch.compression == f"unknown({codec})"


def test_v2_with_headers_and_null_key_value():
    builder = DefaultRecordBatchBuilder(2, NONE, False, -1, -1, -1, 1 << 20)
    builder.append(0, TS, None, None, [("h", b"v"), ("n", None)])
    builder.append(1, TS + 1, b"", b"", [])
    data = builder.build()
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    assert summary.record_count == 2


def test_v2_empty_batch_minimum_length():
    """A v2 batch with no records is exactly the 61-byte header (batchLength 49)."""
    buf = bytearray(61)
    struct.pack_into(">qiib", buf, 0, 10, 49, 0, 2)
    refresh_v2_crc(buf)
    (batch,) = summarize_ok(buf).batches
    assert (batch.batch_length, batch.record_count, batch.truncated) == (49, 0, False)
    assert verify_crc(buf, batch)


# --------------------------------------------------------------------------- magic 0 and 1


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_uncompressed_one_entry_per_message(magic):
    data = legacy_entries(magic, NONE, n=3)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    assert summary.batch_count == 3 and summary.record_count == 3
    for i, batch in enumerate(summary.batches):
        assert batch.magic == magic
        assert batch.base_offset == i
        assert batch.compression == "none" and batch.wrapper is False
        if magic == 1:
            assert batch.timestamp_type == "create"
            assert batch.first_timestamp == batch.max_timestamp == TS + 10 * i
        else:
            assert batch.timestamp_type == "none"
            assert batch.first_timestamp == batch.max_timestamp == -1
        assert verify_crc(data, batch)


@pytest.mark.parametrize(
    ("magic", "codec"),
    [(0, GZIP), (0, SNAPPY), pytest.param(0, LZ4, marks=NEEDS_XXHASH), (1, GZIP), (1, SNAPPY), (1, LZ4)],
)
def test_legacy_compressed_wrapper(magic, codec):
    data = legacy_entries(magic, codec, n=5)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert batch.wrapper is True
    assert batch.record_count == 1  # the five inner messages are compressed and not looked at
    assert len(list(kafka_batches(data)[0])) == 5
    assert batch.compression == CODEC_NAMES[codec]
    assert batch.first_timestamp == (0 if magic == 1 else -1)  # kafka-python's wrapper timestamp
    assert verify_crc(data, batch)


def test_legacy_v1_log_append_wrapper_timestamp():
    data = legacy_entries(1, GZIP, n=3)
    data = legacy_set_timestamp(legacy_set_attributes(data, GZIP | 0x08), TS + 777)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)  # inner timestamps come from the wrapper: TS + 777
    (batch,) = summary.batches
    assert batch.timestamp_type == "log_append"
    assert batch.first_timestamp == batch.max_timestamp == TS + 777


def test_legacy_minimum_sizes_accepted():
    v0 = bytearray(26)
    struct.pack_into(">qiIbbii", v0, 0, 1, 14, 0, 0, 0, -1, -1)
    refresh_legacy_crc(v0)
    v1 = bytearray(34)
    struct.pack_into(">qiIbbqii", v1, 0, 2, 22, 0, 1, 0, TS, -1, -1)
    refresh_legacy_crc(v1)
    summary = summarize_ok(bytes(v0 + v1))
    assert [(b.magic, b.batch_length, b.base_offset) for b in summary.batches] == [(0, 14, 1), (1, 22, 2)]
    assert_matches_kafka(v0 + v1, summary)
    assert all(verify_crc(v0 + v1, b) for b in summary.batches)


# --------------------------------------------------------------------------- MemoryRecordsBuilder


@pytest.mark.parametrize(
    ("magic", "codec"),
    [(0, c) for c in (NONE, GZIP, SNAPPY)]
    + [pytest.param(0, LZ4, marks=NEEDS_XXHASH)]
    + [(1, c) for c in (NONE, GZIP, SNAPPY, LZ4)]
    + [(2, c) for c in sorted(CODEC_NAMES)],
)
def test_memory_records_builder(magic, codec):
    data = memory_records(magic, codec, n=4)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    assert {b.magic for b in summary.batches} == {magic}
    if magic == 2:
        assert summary.record_count == 4 and summary.batch_count == 1
    elif codec == NONE:
        assert summary.record_count == 4 and summary.batch_count == 4
    else:
        assert summary.record_count == 1 and summary.batches[0].wrapper
    assert all(verify_crc(data, b) for b in summary.batches)


def test_memory_records_builder_transactional():
    data = memory_records(2, ZSTD, n=6, transactional=True, producer_id=99, producer_epoch=1, base_sequence=12)
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    (batch,) = summary.batches
    assert (batch.transactional, batch.producer_id, batch.producer_epoch, batch.base_sequence) == (True, 99, 1, 12)
    assert batch.record_count == 6 and batch.compression == "zstd"


# --------------------------------------------------------------------------- several batches


def mixed_record_set() -> bytes:
    parts = [
        broker_stamp_v2(v2_batch(NONE, n=2), base_offset=0, leader_epoch=3),
        broker_stamp_v2(v2_batch(GZIP, n=3, transactional=True, producer_id=7, producer_epoch=2,
                                 base_sequence=0), base_offset=2, leader_epoch=3),
        control_batch(),
        legacy_entries(0, NONE, n=2),
        legacy_entries(1, SNAPPY, n=3),
        legacy_entries(1, NONE, n=1),
        broker_stamp_v2(v2_batch(ZSTD, n=4), base_offset=100, leader_epoch=4, extra_attributes=0x08),
        broker_stamp_v2(v2_batch(SNAPPY, n=1), base_offset=104),
        broker_stamp_v2(v2_batch(LZ4, n=2), base_offset=105),
    ]
    return b"".join(bytes(p) for p in parts)


def test_several_batches_concatenated():
    data = mixed_record_set()
    summary = summarize_ok(data)
    assert_matches_kafka(data, summary)
    assert [b.magic for b in summary.batches] == [2, 2, 2, 0, 0, 1, 1, 2, 2, 2]
    assert [b.compression for b in summary.batches] == [
        "none", "gzip", "none", "none", "none", "snappy", "none", "zstd", "snappy", "lz4",
    ]
    assert summary.record_count == 2 + 3 + 1 + 2 + 1 + 1 + 4 + 1 + 2
    assert summary.truncated_bytes == 0 and summary.total_bytes == len(data)
    assert all(verify_crc(data, b) for b in summary.batches)


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "embedded", "cast_c", "strided"])
def test_buffer_types(kind):
    data = mixed_record_set()
    expected = summarize_ok(data)
    if kind == "bytearray":
        given_ = bytearray(data)
    elif kind == "memoryview":
        given_ = memoryview(data)
    elif kind == "embedded":  # the records field as a view into a larger frame
        given_ = memoryview(b"\xff" * 37 + data + b"\xee" * 5)[37 : 37 + len(data)]
    elif kind == "cast_c":
        given_ = memoryview(data).cast("c")
    elif kind == "strided":
        doubled = bytes(b for byte in data for b in (byte, 0))
        given_ = memoryview(doubled)[::2]
    else:
        given_ = data
    summary = summarize_ok(given_)
    assert summary == expected
    assert all(verify_crc(given_, b) for b in summary.batches)


def test_to_dict_is_json_friendly():
    data = mixed_record_set() + v2_batch(GZIP)[:40]
    summary = summarize_ok(data)
    as_dict = summary.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["batch_count"] == summary.batch_count == len(as_dict["batches"])
    assert as_dict["record_count"] == summary.record_count
    assert as_dict["truncated_bytes"] == 40 and as_dict["total_bytes"] == len(data)
    fields = [f.name for f in dataclasses.fields(BatchSummary)]
    for entry, batch in zip(as_dict["batches"], summary.batches):
        assert list(entry) == fields
        assert entry == dataclasses.asdict(batch)
        assert all(type(v) in (int, str, bool) for v in entry.values())
    assert as_dict["batches"][-1]["truncated"] is True


def test_summaries_are_frozen_and_hashable():
    summary = summarize_ok(mixed_record_set())
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.batches[0].magic = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.total_bytes = 0  # type: ignore[misc]
    assert hash(summary) == hash(summarize_ok(mixed_record_set()))


def test_summaries_behave_as_the_frozen_dataclasses_they_were():
    """Tuples underneath (one allocation each), dataclass behaviour on top."""
    import copy
    import pickle

    summary = summarize_ok(mixed_record_set() + v2_batch(GZIP)[:40])
    batch = summary.batches[0]
    assert type(summary) is RecordsSummary and all(type(b) is BatchSummary for b in summary.batches)
    assert isinstance(batch, tuple) and len(batch) == 17 and len(summary) == 3
    assert BatchSummary._fields == tuple(f.name for f in dataclasses.fields(BatchSummary))
    assert RecordsSummary._fields == ("batches", "total_bytes", "truncated_bytes")
    assert [getattr(batch, name) for name in BatchSummary._fields] == list(batch)
    assert batch.size == batch.batch_length + 12
    # immutable, also against deletion and new attributes
    for target, name in ((batch, "magic"), (batch, "other"), (summary, "batches")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(target, name, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(target, name)
    # == only within a class, as dataclass eq; never ordered; hash of the fields
    assert batch == BatchSummary(*batch) and not (batch != BatchSummary(*batch))
    assert batch != tuple(batch) and tuple(batch) != batch
    assert summary != (summary.batches, summary.total_bytes, summary.truncated_bytes)
    for op in ("__lt__", "__le__", "__gt__", "__ge__"):
        with pytest.raises(TypeError):
            getattr(__import__("operator"), op.strip("_"))(batch, batch)
    assert hash(batch) == hash(BatchSummary(*batch)) and len({batch, BatchSummary(*batch)}) == 1
    # repr as the dataclass wrote it
    assert repr(batch).startswith("BatchSummary(offset=0, magic=2, base_offset=0, batch_length=")
    assert repr(summary).startswith("RecordsSummary(batches=(BatchSummary(offset=0,")
    assert repr(batch).endswith(", wrapper=False, truncated=False)")
    # keyword construction, copies, pickling, dataclasses helpers, namedtuple helpers
    assert BatchSummary(**batch.to_dict()) == batch
    assert RecordsSummary(batches=summary.batches, total_bytes=summary.total_bytes,
                          truncated_bytes=summary.truncated_bytes) == summary
    for clone in (copy.copy(summary), copy.deepcopy(summary), pickle.loads(pickle.dumps(summary)),
                  pickle.loads(pickle.dumps(summary, protocol=0))):
        assert clone == summary and type(clone) is RecordsSummary
        assert all(type(b) is BatchSummary for b in clone.batches)
    assert dataclasses.is_dataclass(batch) and dataclasses.is_dataclass(RecordsSummary)
    assert dataclasses.replace(batch, truncated=True) == batch._replace(truncated=True)
    assert dataclasses.replace(batch, truncated=True).truncated is True
    assert dataclasses.asdict(batch) == batch.to_dict() == batch._asdict()
    assert dataclasses.asdict(summary)["batches"] == tuple(b.to_dict() for b in summary.batches)
    assert dataclasses.astuple(batch) == tuple(batch)
    match batch:
        case BatchSummary(0, 2, magic_two_offset):
            assert magic_two_offset == batch.base_offset
        case _:
            pytest.fail("positional match on BatchSummary")
    with pytest.raises(TypeError):
        BatchSummary(*batch[:-1])  # every field is required, as in the dataclass


def test_summarize_records_is_the_c_twin_unless_pure_python():
    assert records_module.summarize_records_python.__module__ == records_module.__name__
    if os.environ.get("KINSPECT_PURE_PYTHON") == "1":
        assert summarize_records is records_module.summarize_records_python
        return
    try:
        from kinspect.protocol.codec import _wire
    except ImportError:  # not built: tests/protocol/test_records_native.py fails for that
        assert summarize_records is records_module.summarize_records_python
    else:
        assert summarize_records is _wire.summarize_records


def test_payload_is_never_read():
    """Garbage after each header (compressed data, keys, values) changes nothing."""
    data = bytearray(mixed_record_set())
    summary = summarize_ok(data)
    for batch in summary.batches:
        header = {2: V2_HEADER, 1: 26, 0: 18}[batch.magic]
        start, end = batch.offset + header, batch.offset + batch.size
        data[start:end] = bytes((i * 131 + 7) & 0xFF for i in range(end - start))
    assert summarize_ok(bytes(data)) == summary


# --------------------------------------------------------------------------- truncation


def _absent(name: str, batch: BatchSummary):
    return {
        "record_count": 1 if batch.magic in (0, 1) else 0,
        "compression": "unknown",
        "timestamp_type": "none",
        "transactional": False,
        "control": False,
        "wrapper": False,
    }.get(name, -1)


def test_truncated_last_batch_at_every_length():
    data = mixed_record_set()
    full = summarize_ok(data)
    ends = [b.offset + b.size for b in full.batches]
    fields = [f.name for f in dataclasses.fields(BatchSummary)]
    for cut in range(len(data) + 1):
        part = data[:cut]
        summary = summarize_ok(part)
        complete = [b for b, end in zip(full.batches, ends) if end <= cut]
        assert summary.total_bytes == cut
        tail = cut - (ends[len(complete) - 1] if complete else 0)
        assert summary.truncated_bytes == tail
        assert summary.truncated_bytes == cut - MemoryRecords(part).valid_bytes()
        assert list(summary.batches[: len(complete)]) == complete
        extra = summary.batches[len(complete) :]
        if tail == 0:
            assert extra == ()
        elif tail < 17:
            assert extra == ()  # not even the magic byte: only counted in truncated_bytes
        else:
            (cut_batch,) = extra
            whole = full.batches[len(complete)]
            assert cut_batch.truncated is True
            assert not verify_crc(part, cut_batch)
            header = {2: V2_HEADER, 1: 26, 0: 18}[whole.magic]
            if tail >= header:
                assert cut_batch == dataclasses.replace(whole, truncated=True)
            else:
                for name in fields:
                    if name == "truncated":
                        continue
                    ours, theirs = getattr(cut_batch, name), getattr(whole, name)
                    assert ours == theirs or ours == _absent(name, whole), (cut, name, ours, theirs)
                for name in ("offset", "magic", "base_offset", "batch_length", "partition_leader_epoch"):
                    if name == "partition_leader_epoch" and whole.magic != 2:
                        continue
                    assert getattr(cut_batch, name) == getattr(whole, name)


def test_truncated_v2_fields_readable_so_far():
    data = bytes(v2_batch(GZIP, n=3, transactional=True, producer_id=77, producer_epoch=5, base_sequence=9))
    whole = summarize_ok(data).batches[0]
    (b,) = summarize_ok(data[:22]).batches  # up to the crc, attributes cut
    assert (b.compression, b.timestamp_type, b.transactional, b.record_count) == ("unknown", "none", False, 0)
    (b,) = summarize_ok(data[:23]).batches  # attributes readable
    assert (b.compression, b.timestamp_type, b.transactional) == ("gzip", "create", True)
    assert b.first_timestamp == -1 and b.producer_id == -1
    (b,) = summarize_ok(data[:51]).batches  # through producerId
    assert (b.first_timestamp, b.max_timestamp, b.producer_id, b.producer_epoch) == (
        whole.first_timestamp, whole.max_timestamp, 77, -1,
    )
    (b,) = summarize_ok(data[:61]).batches  # whole header, no records
    assert b == dataclasses.replace(whole, truncated=True)
    assert b.record_count == 3


def test_truncated_between_prefix_and_magic():
    data = bytes(v2_batch())
    for cut in range(12, 17):
        summary = summarize_ok(data[:cut])
        assert summary.batches == () and summary.truncated_bytes == cut


def test_huge_declared_length_allocates_nothing():
    header = bytearray(V2_HEADER)
    struct.pack_into(">qiibIhiqqqhii", header, 0, 5, 2**31 - 1, 1, 2, 0, 1, 9, TS, TS, -1, -1, -1, 2**31 - 1)
    data = bytes(header) + b"\x00" * 100
    tracemalloc.start()
    try:
        summary = summarize_ok(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    (batch,) = summary.batches
    assert batch.truncated and batch.batch_length == 2**31 - 1 and batch.record_count == 2**31 - 1
    assert summary.truncated_bytes == len(data)
    assert not verify_crc(data, batch)
    legacy = struct.pack(">qiIbbq", 0, 2**31 - 1, 0, 1, 0, TS)
    (batch,) = summarize_ok(legacy).batches
    assert batch.truncated and batch.magic == 1 and batch.first_timestamp == TS


# --------------------------------------------------------------------------- invalid input


def _error(data) -> RecordsError:
    with pytest.raises(RecordsError) as info:
        summarize_records(data)
    assert isinstance(info.value, ValueError)
    assert f"byte {info.value.offset}" in str(info.value)
    return info.value


def test_negative_length():
    err = _error(struct.pack(">qi", 0, -1) + bytes(20))
    assert err.offset == 8 and "negative" in str(err)
    err = _error(struct.pack(">qi", 0, -5))  # even when nothing follows
    assert err.offset == 8


def test_negative_length_in_second_batch_reports_its_offset():
    first = bytes(v2_batch())
    err = _error(first + struct.pack(">qi", 0, -2**31) + bytes(30))
    assert err.offset == len(first) + 8


def test_v2_length_below_header():
    buf = bytearray(bytes(v2_batch()))
    struct.pack_into(">i", buf, 8, 48)
    assert "48" in str(_error(buf))
    struct.pack_into(">i", buf, 8, 49)
    summarize_ok(buf[:61])


@pytest.mark.parametrize(("magic", "minimum"), [(0, 14), (1, 22)])
def test_legacy_length_below_minimum(magic, minimum):
    entry = bytearray(struct.pack(">qiIbbq", 0, minimum - 1, 0, magic, 0, 0) + bytes(40))
    err = _error(entry)
    assert err.offset == 8 and str(minimum) in str(err)


def test_length_too_small_for_anything_before_magic():
    err = _error(struct.pack(">qi", 0, 3) + b"\x00")
    assert err.offset == 8


@pytest.mark.parametrize("magic", [3, 4, 0x7F, 0x80, 0xFF])
def test_unknown_magic(magic):
    buf = bytearray(bytes(v2_batch()))
    buf[16] = magic
    err = _error(buf)
    assert err.offset == 16 and "magic" in str(err)
    err = _error(buf[:17])  # even in a truncated tail
    assert err.offset == 16


def test_negative_record_count():
    buf = bytearray(bytes(v2_batch()))
    struct.pack_into(">i", buf, V2_COUNT_POS, -1)
    err = _error(buf)
    assert err.offset == V2_COUNT_POS and "count" in str(err)
    err = _error(buf[:70])  # truncated, but the count is there
    assert err.offset == V2_COUNT_POS


def test_non_buffer_is_a_type_error():
    with pytest.raises(TypeError):
        summarize_records("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        summarize_records(12)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- hostile input


def _check_hostile(data) -> None:
    try:
        summary = summarize_records(data)
    except RecordsError as err:
        assert 0 <= err.offset < max(len(data), 1)
        return
    assert isinstance(summary, RecordsSummary)
    assert summary.total_bytes == len(data)
    position = 0
    for batch in summary.batches:
        assert batch.offset == position
        assert batch.magic in (0, 1, 2)
        assert batch.record_count >= 0
        if batch.truncated:
            assert batch is summary.batches[-1]
            assert summary.truncated_bytes == len(data) - position
            position = len(data)
        else:
            position += batch.size
        verify_crc(data, batch)  # must not raise either
    if not (summary.batches and summary.batches[-1].truncated):
        assert position + summary.truncated_bytes == len(data)
        assert summary.truncated_bytes < 17
    summary.to_dict()


@HYPOTHESIS
@given(st.binary(max_size=600))
def test_random_bytes(data):
    _check_hostile(data)


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
    flips = data.draw(st.lists(st.integers(0, len(buf) * 8 - 1), min_size=1, max_size=8))
    for bit in flips:
        buf[bit // 8] ^= 1 << (bit % 8)
    _check_hostile(bytes(buf))
    _check_hostile(bytes(buf[: data.draw(st.integers(0, len(buf)))]))


_interesting_lengths = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([-1, 0, 13, 14, 21, 22, 48, 49, 50, 60, 61, 2**31 - 1]),
    st.integers(0, 120),
)


@st.composite
def _entry(draw):
    magic = draw(st.one_of(st.integers(0, 3), st.integers(0, 255)))
    length = draw(_interesting_lengths)
    head = struct.pack(">qi", draw(st.integers(-(2**63), 2**63 - 1)), length)
    middle = draw(st.binary(min_size=4, max_size=4)) + bytes([magic])
    tail = draw(st.binary(max_size=90))
    if magic == 2 and len(tail) >= 44 and draw(st.booleans()):
        tail = tail[:40] + struct.pack(">i", draw(st.integers(-(2**31), 2**31 - 1))) + tail[44:]
    return head + middle + tail


@HYPOTHESIS
@given(st.lists(_entry(), max_size=6), st.booleans())
def test_structured_hostile_headers(entries, with_valid_prefix):
    data = (mixed_record_set() if with_valid_prefix else b"") + b"".join(entries)
    _check_hostile(data)
    for cut in (len(data) - 1, len(data) // 2, 17, 12, 11):
        if 0 <= cut <= len(data):
            _check_hostile(data[:cut])


@HYPOTHESIS
@given(st.data())
def test_random_valid_v2_batches_match_kafka(data):
    codec = data.draw(st.sampled_from(sorted(CODEC_NAMES)))
    n = data.draw(st.integers(1, 6))
    timestamps = data.draw(st.lists(st.integers(0, 2**50), min_size=n, max_size=n))
    pid = data.draw(st.one_of(st.just(-1), st.integers(0, 2**63 - 1)))
    state = {}
    if pid != -1:
        state = dict(
            producer_id=pid,
            producer_epoch=data.draw(st.integers(0, 2**15 - 1)),
            base_sequence=data.draw(st.integers(0, 2**31 - 1)),
            transactional=data.draw(st.booleans()),
        )
    buf = broker_stamp_v2(
        v2_batch(codec, n, timestamps=timestamps, **state),
        base_offset=data.draw(st.integers(0, 2**62)),
        leader_epoch=data.draw(st.integers(-1, 2**31 - 1)),
        extra_attributes=data.draw(st.sampled_from([0, 0x08])),
    )
    summary = summarize_ok(buf)
    assert_matches_kafka(buf, summary)
    (batch,) = summary.batches
    assert batch.first_timestamp == timestamps[0]
    assert batch.max_timestamp == max(timestamps)
    assert verify_crc(buf, batch)


# --------------------------------------------------------------------------- checksums


def test_verify_crc_detects_payload_change():
    data = mixed_record_set()
    summary = summarize_ok(data)
    for batch in summary.batches:
        assert verify_crc(data, batch)
        for pos in (batch.offset + batch.size - 1, batch.offset + {2: V2_HEADER, 1: 26, 0: 18}[batch.magic]):
            broken = bytearray(data)
            broken[pos] ^= 0x40
            assert not verify_crc(broken, batch)
            assert not verify_crc(bytes(broken), batch)
        # the attributes are covered too, for every magic
        broken = bytearray(data)
        broken[batch.offset + (V2_ATTRIBUTES_POS if batch.magic == 2 else LEGACY_ATTRIBUTES_POS)] ^= 0x10
        assert not verify_crc(broken, batch)


def test_verify_crc_ignores_fields_kafka_leaves_outside_the_crc():
    """v2: baseOffset and partitionLeaderEpoch are outside the CRC (brokers rewrite them)."""
    data = bytearray(v2_batch(GZIP))
    struct.pack_into(">q", data, 0, 999)
    struct.pack_into(">i", data, 12, 55)
    (batch,) = summarize_ok(data).batches
    assert verify_crc(data, batch)
    assert DefaultRecordBatch(data).validate_crc()


def test_verify_crc_agrees_with_kafka_python():
    data = mixed_record_set()
    summary = summarize_ok(data)
    for batch, theirs in zip(summary.batches, kafka_batches(data)):
        assert verify_crc(data, batch) is theirs.validate_crc() is True


def test_verify_crc_false_for_truncated_and_foreign_batches():
    data = mixed_record_set()
    summary = summarize_ok(data)
    last = summary.batches[-1]
    assert not verify_crc(data[:-1], last)  # does not fit any more
    (cut,) = summarize_ok(data[last.offset : last.offset + 70]).batches
    assert cut.truncated and not verify_crc(data[last.offset : last.offset + 70], cut)
    # a truncated summary is False even against bytes in which the whole batch is present
    assert not verify_crc(data[last.offset :], cut)
    assert verify_crc(data[last.offset :], dataclasses.replace(cut, truncated=False))
    moved = dataclasses.replace(summary.batches[1], offset=summary.batches[1].offset + 1)
    assert not verify_crc(data, moved)
    assert not verify_crc(data, dataclasses.replace(last, offset=-3))


def test_crc32c_known_vectors():
    assert crc32c_py(b"") == 0
    assert crc32c_py(b"123456789") == 0xE3069283
    assert crc32c_py(bytes(32)) == 0x8A9136AA
    assert crc32c_py(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_py(b"6789", crc32c_py(b"12345")) == 0xE3069283


@pytest.mark.skipif(crc32c_c is None, reason="crc32c package not installed")
@HYPOTHESIS
@given(st.binary(max_size=300))
def test_crc32c_fallback_matches_the_c_package(data):
    assert crc32c_py(data) == crc32c_c(data)
    assert crc32c_py(memoryview(data)) == crc32c_c(data)


def test_verify_crc_with_the_pure_python_fallback(monkeypatch):
    monkeypatch.setattr(records_module, "_crc32c_impl", crc32c_py)
    data = mixed_record_set()
    summary = summarize_ok(data)
    assert all(verify_crc(data, b) for b in summary.batches)
    broken = bytearray(data)
    broken[summary.batches[0].offset + summary.batches[0].size - 1] ^= 1
    assert not verify_crc(broken, summary.batches[0])


def test_summarize_does_not_verify_crcs():
    buf = bytearray(v2_batch())
    struct.pack_into(">I", buf, V2_CRC_POS, 0xDEADBEEF)
    (batch,) = summarize_ok(buf).batches
    assert not verify_crc(buf, batch)


# --------------------------------------------------------------------------- the module itself


def test_module_docstring_is_one_line():
    doc = ast.get_docstring(ast.parse(RECORDS_PY.read_text()))
    assert doc and "\n" not in doc.strip()


def test_module_imports_stdlib_only():
    """Stdlib only, besides the optional C twin (_wire), imported under `except ImportError`."""
    tree = ast.parse(RECORDS_PY.read_text())
    guarded = set()  # imports in the body of a `try: ... except ImportError:`
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers
        ):
            guarded.update(id(n) for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    imported, optional = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {node.module or ""}
        else:
            continue
        if id(node) in guarded:
            optional |= names
        else:
            imported |= {name.split(".")[0] for name in names}
    assert imported <= {"__future__", "struct", "zlib", "dataclasses", "operator", "os", "crc32c"}, imported
    assert optional <= {"kinspect.protocol.codec._wire", "crc32c"}, optional


@pytest.mark.integration
def test_module_alone_pulls_in_no_asyncio_or_logging():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('kinspect_records_alone', {str(RECORDS_PY)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
        "data = bytes.fromhex('0000000000000000' '0000000e' '00000000' '00' '00' 'ffffffff' 'ffffffff')\n"
        "summary = module.summarize_records(data)\n"
        "assert summary.batch_count == 1 and module.verify_crc(data, summary.batches[0]) is False\n"
        "bad = [m for m in ('asyncio', 'logging', 'prometheus_client') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
