"""Summaries of Kafka record sets (batch headers only: nothing is decompressed, no key or value is read)."""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import FrozenInstanceError, make_dataclass
from operator import itemgetter

__all__ = [
    "BatchSummary",
    "RecordsError",
    "RecordsSummary",
    "crc32c_py",
    "summarize_records",
    "summarize_records_python",
    "verify_crc",
]


class RecordsError(ValueError):
    """Bytes that cannot be a record set at all: says what is wrong and at which byte.

    `offset` is the byte position (from the start of the records bytes) of the field
    that is wrong; `reason` is the message without the position.
    """

    def __init__(self, reason: str, offset: int) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(f"{reason} (byte {offset})")


# --------------------------------------------------------------------------- layouts
#
# Every entry of a record set, whatever its magic, starts with
#   offset int64, length int32, (partitionLeaderEpoch | crc) 4 bytes, magic int8
# so the walk reads the length at +8 and the magic at +16 before it knows the layout.

_LOG_OVERHEAD = 12  # offset int64 + length int32: the part not counted by `length`
_MAGIC_POS = 16
_PREFIX = struct.Struct(">qi")  # offset, length

# v2 RecordBatch: everything up to and including recordsCount (61 bytes).
_V2_HEADER = struct.Struct(
    ">q"  # baseOffset
    "i"  # batchLength
    "i"  # partitionLeaderEpoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # lastOffsetDelta
    "q"  # baseTimestamp
    "q"  # maxTimestamp
    "q"  # producerId
    "h"  # producerEpoch
    "i"  # baseSequence
    "i"  # recordsCount
)
_V2_HEADER_SIZE = _V2_HEADER.size  # 61
_V2_MIN_LENGTH = _V2_HEADER_SIZE - _LOG_OVERHEAD  # 49
_V2_CRC_POS = 17
_V2_ATTRIBUTES_POS = 21  # the CRC-32C covers from here to the end of the batch

# For a v2 batch cut short inside its header: (end of field, struct, index in the
# tuple of header values) for each field after magic, in wire order.
_V2_FIELDS = (
    (21, struct.Struct(">I"), 4),  # crc
    (23, struct.Struct(">h"), 5),  # attributes
    (27, struct.Struct(">i"), 6),  # lastOffsetDelta
    (35, struct.Struct(">q"), 7),  # baseTimestamp
    (43, struct.Struct(">q"), 8),  # maxTimestamp
    (51, struct.Struct(">q"), 9),  # producerId
    (53, struct.Struct(">h"), 10),  # producerEpoch
    (57, struct.Struct(">i"), 11),  # baseSequence
    (61, struct.Struct(">i"), 12),  # recordsCount
)
_V2_EPOCH = struct.Struct(">i")
_V2_RECORDS_COUNT_POS = 57

# Legacy message set entry (magic 0 and 1): offset, messageSize, crc, magic,
# attributes, and for magic 1 a timestamp; then key and value, never read here.
_V0_HEADER = struct.Struct(">qiIbb")  # 18 bytes
_V1_HEADER = struct.Struct(">qiIbbq")  # 26 bytes
_LEGACY_CRC_POS = 12
_LEGACY_CRC_FROM = 16  # the CRC-32 covers from the magic byte to the end of the message
_LEGACY_ATTRIBUTES_POS = 17
_LEGACY_ATTRIBUTES_END = 18
# Smallest messageSize: crc(4) magic(1) attributes(1) [timestamp(8)] keyLength(4) valueLength(4).
_V0_MIN_LENGTH = 14
_V1_MIN_LENGTH = 22
_ANY_MIN_LENGTH = _V0_MIN_LENGTH
_ATTRIBUTES_BYTE = struct.Struct(">b")
_UINT32 = struct.Struct(">I")

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20

_CODECS = ("none", "gzip", "snappy", "lz4", "zstd", "unknown(5)", "unknown(6)", "unknown(7)")
_UNREADABLE = "unknown"  # compression of a truncated batch cut before its attributes


# --------------------------------------------------------------------------- results
#
# The summaries are tuples with named fields (one allocation each, so the C scanner in
# _wire builds them cheaply) that behave as the frozen dataclasses they used to be:
# attributes, immutability (FrozenInstanceError), == only between instances of the same
# class, hash, repr, no ordering, pickling, and dataclasses.fields / replace / asdict.


_tuple_new = tuple.__new__


class _FrozenTuple(tuple):
    """Base of the summary classes: a tuple whose fields are read by name, never assigned."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    # As a dataclass: equal only to an instance of the same class, and not ordered. (A
    # plain tuple compares by its items with any tuple: the answers for tuples are given
    # here, before the reflected tuple method could be tried.)
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return tuple.__eq__(self, other)
        return False if isinstance(other, tuple) else NotImplemented

    def __ne__(self, other):
        if other.__class__ is self.__class__:
            return tuple.__ne__(self, other)
        return True if isinstance(other, tuple) else NotImplemented

    __hash__ = tuple.__hash__

    def __lt__(self, other):
        if isinstance(other, tuple):
            raise TypeError(f"{type(self).__name__} instances are not ordered")
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
        return f"{type(self).__qualname__}({inner})"

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def _replace(self, **changes):
        """A copy with some fields changed (as dataclasses.replace, which works too)."""
        return type(self)(**{**dict(zip(self._fields, self)), **changes})

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self))


def _named_fields(cls):
    """Give a _FrozenTuple subclass its fields, from its annotations, in order.

    Each field becomes a read-only attribute; `__new__` must take the same names in the
    same order. `__dataclass_fields__` is that of a frozen dataclass with these fields,
    so dataclasses.fields(), replace() and asdict() accept the class and its instances.
    """
    fields = tuple(cls.__annotations__)
    code = cls.__new__.__code__
    if code.co_varnames[1 : code.co_argcount] != fields:
        raise TypeError(f"{cls.__name__}.__new__ must take the fields {fields} in order")
    for index, name in enumerate(fields):
        type.__setattr__(cls, name, property(itemgetter(index), doc=f"Field {index}: {name}."))
    shadow = make_dataclass(cls.__name__, [(name, cls.__annotations__[name]) for name in fields], frozen=True)
    type.__setattr__(cls, "_fields", fields)
    type.__setattr__(cls, "__match_args__", fields)
    type.__setattr__(cls, "__dataclass_fields__", shadow.__dataclass_fields__)
    type.__setattr__(cls, "__dataclass_params__", shadow.__dataclass_params__)
    return cls


@_named_fields
class BatchSummary(_FrozenTuple):
    """The header of one entry of a record set: a v2 RecordBatch or a v0/v1 message.

    For a truncated batch (the last one, cut short by the fetch size limit), fields
    whose bytes are missing hold their "absent" value: -1, False, compression
    "unknown", timestamp_type "none" and, for v2, record_count 0.
    """

    __slots__ = ()

    offset: int  # byte position of the entry within the records bytes
    magic: int
    base_offset: int
    batch_length: int  # the length field: bytes after the 12-byte offset+length prefix
    record_count: int  # v2: the recordsCount field; v0/v1: 1 (a wrapper counts as 1)
    compression: str  # none, gzip, snappy, lz4, zstd or unknown(N)
    timestamp_type: str  # create, log_append, or none (magic 0)
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool
    first_timestamp: int
    max_timestamp: int
    partition_leader_epoch: int
    wrapper: bool  # v0/v1 compressed wrapper message (its inner messages are not counted)
    truncated: bool

    def __new__(
        cls, offset, magic, base_offset, batch_length, record_count, compression, timestamp_type,
        producer_id, producer_epoch, base_sequence, transactional, control, first_timestamp,
        max_timestamp, partition_leader_epoch, wrapper, truncated,
    ):
        return _tuple_new(cls, (
            offset, magic, base_offset, batch_length, record_count, compression, timestamp_type,
            producer_id, producer_epoch, base_sequence, transactional, control, first_timestamp,
            max_timestamp, partition_leader_epoch, wrapper, truncated,
        ))

    @property
    def size(self) -> int:
        """Bytes the entry declares on the wire, prefix included."""
        return self[3] + _LOG_OVERHEAD

    def to_dict(self) -> dict:
        """The fields as a plain dict."""
        return dict(zip(_BATCH_FIELDS, self))


_BATCH_FIELDS = BatchSummary._fields


@_named_fields
class RecordsSummary(_FrozenTuple):
    """What a `records` field holds: its batches and any incomplete tail."""

    __slots__ = ()

    batches: tuple[BatchSummary, ...]
    total_bytes: int
    truncated_bytes: int  # length of the incomplete tail (0 if none)

    def __new__(cls, batches, total_bytes, truncated_bytes):
        return _tuple_new(cls, (batches, total_bytes, truncated_bytes))

    @property
    def record_count(self) -> int:
        """Sum of the batches' record counts (a truncated batch adds what its header declares)."""
        return sum([b[4] for b in self[0]])

    @property
    def batch_count(self) -> int:
        return len(self[0])

    def to_dict(self) -> dict:
        """A JSON-friendly form: plain values, lists and dicts."""
        batches = self[0]
        return {
            "total_bytes": self[1],
            "truncated_bytes": self[2],
            "batch_count": len(batches),
            "record_count": sum([b[4] for b in batches]),
            "batches": [dict(zip(_BATCH_FIELDS, b)) for b in batches],
        }


# --------------------------------------------------------------------------- the walk


def summarize_records_python(data: bytes | bytearray | memoryview | None) -> RecordsSummary | None:
    """Summarize a record set by walking its batch headers; None for a null `records`.

    Never decompresses and never reads keys or values. A last entry that runs past
    the end of the data is reported (truncated=True, and truncated_bytes counts the
    tail) rather than rejected, as brokers cut the last batch of a Fetch response at
    the size limit. Raises RecordsError, and nothing else, for bytes that cannot be a
    record set: a negative or too-small length, an unknown magic, a negative count.
    (A `data` that is not a bytes-like object at all is a TypeError.)

    This is the reference implementation; `summarize_records` is the C twin in _wire
    (same results, same errors) when that is built, and this function otherwise.
    """
    if data is None:
        return None
    if not isinstance(data, (bytes, bytearray)):
        data = _flat(memoryview(data))  # TypeError for what is not a buffer at all
    n = len(data)
    batches: list[BatchSummary] = []
    append = batches.append
    pos = 0
    truncated_bytes = 0
    prefix_unpack = _PREFIX.unpack_from
    v2_unpack = _V2_HEADER.unpack_from
    v1_unpack = _V1_HEADER.unpack_from
    v0_unpack = _V0_HEADER.unpack_from
    codecs = _CODECS

    while pos < n:
        remaining = n - pos
        if remaining < _LOG_OVERHEAD:
            truncated_bytes = remaining
            break
        base_offset, length = prefix_unpack(data, pos)
        if length < _ANY_MIN_LENGTH:
            # Too small for any magic (and negative lengths land here too).
            if length < 0:
                raise RecordsError(f"negative batch length {length}", pos + 8)
            if remaining <= _MAGIC_POS:
                raise RecordsError(
                    f"batch length {length} is smaller than any record batch or message "
                    f"({_ANY_MIN_LENGTH})",
                    pos + 8,
                )
        if remaining <= _MAGIC_POS:
            # Cut before the magic byte: nothing to report but the tail's size.
            truncated_bytes = remaining
            break
        magic = data[pos + _MAGIC_POS]
        end = pos + _LOG_OVERHEAD + length

        if magic == 2:
            if length < _V2_MIN_LENGTH:
                raise RecordsError(
                    f"batch length {length} is smaller than the v2 record batch header "
                    f"minimum {_V2_MIN_LENGTH}",
                    pos + 8,
                )
            if end > n:
                append(_truncated_v2(data, pos, n, base_offset, length))
                truncated_bytes = remaining
                break
            (
                _,
                _,
                epoch,
                _,
                _,
                attributes,
                _,
                first_ts,
                max_ts,
                producer_id,
                producer_epoch,
                base_sequence,
                count,
            ) = v2_unpack(data, pos)
            if count < 0:
                raise RecordsError(
                    f"negative record count {count}", pos + _V2_RECORDS_COUNT_POS
                )
            append(
                BatchSummary(
                    pos,
                    2,
                    base_offset,
                    length,
                    count,
                    codecs[attributes & _CODEC_MASK],
                    "log_append" if attributes & _TIMESTAMP_TYPE_MASK else "create",
                    producer_id,
                    producer_epoch,
                    base_sequence,
                    bool(attributes & _TRANSACTIONAL_MASK),
                    bool(attributes & _CONTROL_MASK),
                    first_ts,
                    max_ts,
                    epoch,
                    False,
                    False,
                )
            )
        elif magic == 1 or magic == 0:
            minimum = _V1_MIN_LENGTH if magic else _V0_MIN_LENGTH
            if length < minimum:
                raise RecordsError(
                    f"message size {length} is smaller than the magic {magic} message "
                    f"minimum {minimum}",
                    pos + 8,
                )
            if end > n:
                append(_truncated_legacy(data, pos, n, base_offset, length, magic))
                truncated_bytes = remaining
                break
            if magic:
                attributes, timestamp = v1_unpack(data, pos)[4:]
                ts_type = "log_append" if attributes & _TIMESTAMP_TYPE_MASK else "create"
            else:
                attributes = v0_unpack(data, pos)[4]
                timestamp = -1
                ts_type = "none"
            codec = attributes & _CODEC_MASK
            append(
                BatchSummary(
                    pos,
                    magic,
                    base_offset,
                    length,
                    1,
                    codecs[codec],
                    ts_type,
                    -1,
                    -1,
                    -1,
                    False,
                    False,
                    timestamp,
                    timestamp,
                    -1,
                    codec != 0,
                    False,
                )
            )
        else:
            raise RecordsError(f"unknown magic {magic}", pos + _MAGIC_POS)
        pos = end

    return RecordsSummary(tuple(batches), n, truncated_bytes)


def _flat(view: memoryview) -> memoryview | bytes:
    """A memoryview as a flat byte buffer that struct and indexing agree on."""
    if view.ndim == 1 and view.itemsize == 1 and view.format in ("B", "b", "c"):
        if view.format == "B" and view.c_contiguous:
            return view
        if view.c_contiguous:
            return view.cast("B")
    elif view.c_contiguous:
        return view.cast("B")
    return view.tobytes()  # strided views: copies the actual bytes, never a declared size


def _truncated_v2(data, pos: int, n: int, base_offset: int, length: int) -> BatchSummary:
    """A v2 batch that runs past the end: the header fields that are present."""
    values = [base_offset, length, _V2_EPOCH.unpack_from(data, pos + 12)[0], 2,
              -1, None, -1, -1, -1, -1, -1, -1, None]
    available = n - pos
    for field_end, field, index in _V2_FIELDS:
        if field_end > available:
            break
        values[index] = field.unpack_from(data, pos + field_end - field.size)[0]
    count = values[12]
    if count is not None and count < 0:
        raise RecordsError(f"negative record count {count}", pos + _V2_RECORDS_COUNT_POS)
    attributes = values[5]
    if attributes is None:
        compression, ts_type, transactional, control = _UNREADABLE, "none", False, False
    else:
        compression = _CODECS[attributes & _CODEC_MASK]
        ts_type = "log_append" if attributes & _TIMESTAMP_TYPE_MASK else "create"
        transactional = bool(attributes & _TRANSACTIONAL_MASK)
        control = bool(attributes & _CONTROL_MASK)
    return BatchSummary(
        pos,
        2,
        base_offset,
        length,
        count if count is not None else 0,
        compression,
        ts_type,
        values[9],
        values[10],
        values[11],
        transactional,
        control,
        values[7],
        values[8],
        values[2],
        False,
        True,
    )


def _truncated_legacy(
    data, pos: int, n: int, base_offset: int, length: int, magic: int
) -> BatchSummary:
    """A v0/v1 message that runs past the end: the header fields that are present."""
    available = n - pos
    compression, ts_type, wrapper, timestamp = _UNREADABLE, "none", False, -1
    if available >= _LEGACY_ATTRIBUTES_END:
        attributes = _ATTRIBUTES_BYTE.unpack_from(data, pos + _LEGACY_ATTRIBUTES_POS)[0]
        codec = attributes & _CODEC_MASK
        compression = _CODECS[codec]
        wrapper = codec != 0
        if magic == 1:
            ts_type = "log_append" if attributes & _TIMESTAMP_TYPE_MASK else "create"
            if available >= _V1_HEADER.size:
                timestamp = _V1_HEADER.unpack_from(data, pos)[5]
    return BatchSummary(
        pos, magic, base_offset, length, 1, compression, ts_type,
        -1, -1, -1, False, False, timestamp, timestamp, -1, wrapper, True,
    )


# --------------------------------------------------------------------------- checksums


def _make_crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _make_crc32c_table()


def crc32c_py(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), table-driven, in pure Python: the fallback for verify_crc.

    `crc` continues a previous value, as in zlib.crc32.
    """
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for byte in memoryview(data).cast("B"):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_crc32c_impl = None


def _crc32c(data) -> int:
    global _crc32c_impl
    if _crc32c_impl is None:
        try:
            from crc32c import crc32c as impl  # the optional C implementation
        except Exception:  # not installed, or unusable on this platform
            impl = crc32c_py
        _crc32c_impl = impl
    return _crc32c_impl(data)


def verify_crc(data: bytes | bytearray | memoryview, batch: BatchSummary) -> bool:
    """Whether the batch's stored checksum matches its bytes in `data`.

    Magic 2: CRC-32C from the attributes to the end of the batch; magic 0/1: CRC-32
    from the magic byte to the end of the message. False for a truncated batch, or a
    batch that does not lie within `data`. summarize_records never calls this.
    """
    if batch.truncated:
        return False
    view = memoryview(_flat(memoryview(data)))
    start = batch.offset
    end = start + _LOG_OVERHEAD + batch.batch_length
    if start < 0 or end > len(view) or batch.batch_length < _ANY_MIN_LENGTH:
        return False
    if view[start + _MAGIC_POS] != batch.magic:
        return False
    if batch.magic == 2:
        if batch.batch_length < _V2_MIN_LENGTH:
            return False
        stored = _UINT32.unpack_from(view, start + _V2_CRC_POS)[0]
        return _crc32c(view[start + _V2_ATTRIBUTES_POS : end]) == stored
    if batch.magic in (0, 1):
        stored = _UINT32.unpack_from(view, start + _LEGACY_CRC_POS)[0]
        return zlib.crc32(view[start + _LEGACY_CRC_FROM : end]) & 0xFFFFFFFF == stored
    return False


# --------------------------------------------------------------------------- the C twin

_PURE_PYTHON_ENV = "KINSPECT_PURE_PYTHON"  # as kinspect.protocol.codec.wire_program.PURE_PYTHON_ENV


def _native_summarize():
    """_wire.summarize_records, or None when it is not built or KINSPECT_PURE_PYTHON=1.

    Also None when this file is loaded on its own rather than as kinspect.protocol.records:
    the C twin builds that module's BatchSummary and RecordsSummary.
    """
    if __name__ != "kinspect.protocol.records" or os.environ.get(_PURE_PYTHON_ENV) == "1":
        return None
    try:
        from kinspect.protocol.codec._wire import summarize_records as native
    except ImportError:
        return None
    return native


# summarize_records(data) -> RecordsSummary | None: the C twin of summarize_records_python
# (same results, same RecordsError and TypeError cases) when _wire is built, else the
# reference itself. Read summarize_records_python for the semantics.
summarize_records = _native_summarize() or summarize_records_python
