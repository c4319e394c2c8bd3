"""Helpers the generated codecs call: tag sections, uuids, varint writing, records summaries.

Kept apart from codegen so that the namespace handed to generated code is small and
explicit: these functions and a few builtins are all that code can reach.
"""

from __future__ import annotations

import struct
from uuid import UUID

from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.errors import EncodeError
from kinspect.protocol.wire.primitives import Malformed, read_uvarint, uvarint_size, write_uvarint


def read_tags(buf: bytes, pos: int, target: dict, table: dict, trace: list | None, offset: list | None = None) -> int:
    """Decode a non-empty tag section into target; unknown tags are kept as raw bytes.

    A traced decoder passes its path list and offset cell (trace, offset) on to the
    tagged fields' functions.
    """
    count, pos = read_uvarint(buf, pos)
    end_all = len(buf)
    if count > end_all - pos:
        raise Malformed(f"tag section of {count} fields overruns the {end_all - pos} bytes left")
    previous = -1
    unknown = None
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if tag <= previous:
            raise Malformed(f"tag {tag} after tag {previous}: tags must be unique and ascending")
        previous = tag
        end = pos + size
        if end > end_all:
            raise Malformed(f"tagged field {tag} of {size} bytes overruns the {end_all - pos} bytes left")
        entry = table.get(tag)
        if entry is None:
            if unknown is None:
                unknown = []
            unknown.append((tag, buf[pos:end]))
        else:
            name, decode = entry
            if trace is not None:
                trace.append(name)
            value, used = decode(buf, pos, end) if trace is None else decode(buf, pos, end, trace, offset)
            if used != end:
                raise Malformed(f"tagged field {name} declares {size} bytes but its value takes {used - pos}")
            if trace is not None:
                trace.pop()
            target[name] = value
        pos = end
    if unknown:
        target[UNKNOWN_TAGS] = unknown
    return pos


def scan_tags(buf: bytes, pos: int, result, table: dict, path: str | None) -> int:
    """Walk a non-empty tag section, recording each field's tag, name and size, and walking known fields.

    A known field's value is scanned for capture facts (integers, topics) within its
    declared bytes, which it must fill exactly, as read_tags checks. With path None (a tag
    section inside a tagged field) nothing is recorded: the metrics' facts are those of
    the tag sections of inline structs.
    """
    start = pos
    count, pos = read_uvarint(buf, pos)
    end_all = len(buf)
    if count > end_all - pos:
        raise Malformed(f"tag section of {count} fields overruns the {end_all - pos} bytes left")
    previous = -1
    seen = result.tagged_fields
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if tag <= previous:
            raise Malformed(f"tag {tag} after tag {previous}: tags must be unique and ascending")
        previous = tag
        if pos + size > end_all:
            raise Malformed(f"tagged field {tag} of {size} bytes overruns the {end_all - pos} bytes left")
        entry = table.get(tag)
        if path is not None:
            seen.append((path, tag, entry[0] if entry else None, size))
        end = pos + size
        if entry is not None:
            used = entry[1](buf, pos, end, result)
            if used != end:
                raise Malformed(f"tagged field {entry[0]} declares {size} bytes but its value takes {used - pos}")
        pos = end
    if path is not None:
        result.tag_sections += 1
        result.tag_section_bytes += pos - start
    return pos


# _LN[n]: bytes of a varint whose value has bit length n (7 bits a byte; 0 still takes one byte).
_LN = tuple(max(1, (n + 6) // 7) for n in range(129))


def count_int(stats, base: int, v: int, negative: int, today: int, today_negative: int) -> None:
    """Add one integer value to its slot in a scan's int_stats (layout: codegen.SLOT_STRIDE).

    negative: unsigned-varint bytes of a negative value (3, 5 or 10 by the field's type);
    today: bytes on the wire now, > 0 fixed, 0 zig-zag varint, -1 unsigned varint whose
    negative values take today_negative bytes. A result without counters (stats None, see
    ScanResult) gathers no integer facts.
    """
    if stats is None:
        return
    if v >= 0:
        u = _LN[v.bit_length()]
        z = _LN[(v << 1).bit_length()]
    else:
        u = negative
        z = _LN[((-v << 1) - 1).bit_length()]
    stats[base] += 1
    stats[base + 1] += 1
    stats[base + 2] += today if today > 0 else (z if today == 0 else (u if v >= 0 else today_negative))
    stats[base + 3] += u
    stats[base + 4] += z
    stats[base + 4 + u] += 1
    stats[base + 14 + z] += 1


def count_ints(stats, base: int, values, negative: int, today: int, today_negative: int) -> None:
    """count_int for each value of an integer array (today > 0 always: arrays have no encodings)."""
    if stats is None:
        return
    stats[base] += 1  # the field was there, even empty
    n = 0
    for v in values:
        if v >= 0:
            u = _LN[v.bit_length()]
            z = _LN[(v << 1).bit_length()]
        else:
            u = negative
            z = _LN[((-v << 1) - 1).bit_length()]
        n += 1
        stats[base + 3] += u
        stats[base + 4] += z
        stats[base + 4 + u] += 1
        stats[base + 14 + z] += 1
    stats[base + 1] += n
    stats[base + 2] += n * today


def write_tags(out: bytearray, known: list, unknown: list | None) -> None:
    """Write a tag section from known (tag, bytes) and unknown (tag, bytes), in tag order."""
    fields = list(known)
    if unknown:
        fields.extend(unknown)
        fields.sort(key=lambda item: item[0])
    previous = -1
    write_uvarint(len(fields), out)
    for tag, data in fields:
        if not isinstance(tag, int) or tag <= previous:
            raise EncodeError(f"tag {tag!r} is repeated or out of order in the tag section")
        previous = tag
        write_uvarint(tag, out)
        write_uvarint(len(data), out)
        out += data


def uuid_bytes(value) -> bytes:
    """The 16 bytes of a uuid given as UUID, canonical string or bytes."""
    if isinstance(value, UUID):
        return value.bytes
    if isinstance(value, str):
        return UUID(value).bytes
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return bytes(value)
    raise EncodeError(f"{value!r} is not a uuid")


def summarize_spans_python(source: bytes, spans: list, into: list, first: int = 0) -> None:
    """For each `start << 32 | length` of spans[first:] (ScanResult.record_spans), append to
    into the summary of source[start:start + length], None where RecordsError.

    The reference; _wire.summarize_spans is its C twin (see spans_summarizer).
    """
    # Imported here: records.py is optional for decoding but needed for summaries.
    from kinspect.protocol.records import RecordsError, summarize_records_python

    if isinstance(source, tuple):  # a FramePieces: the reference reads it joined
        source = b"".join(source)
    view = memoryview(source)
    size = len(view)
    append = into.append
    for s in spans[first:]:
        start, n = s >> 32, s & 0xFFFFFFFF
        if s < 0 or start + n > size:
            raise ValueError(f"records span of {n} bytes at {start} does not fit the {size} bytes")
        try:
            append(summarize_records_python(view[start:start + n]))
        except RecordsError:
            append(None)


def spans_summarizer():
    """summarize_spans(source, spans, into, first=0): the C twin when records.summarize_records
    is (the extension is built and KINSPECT_PURE_PYTHON is not 1), else the reference."""
    from kinspect.protocol import records

    if records.summarize_records is records.summarize_records_python:
        return summarize_spans_python
    from kinspect.protocol.codec._wire import summarize_spans

    return summarize_spans


def namespace() -> dict:
    """The names generated code may use (builtins included): nothing else is reachable."""
    return {
        "__builtins__": {"len": len, "range": range, "str": str, "list": list, "memoryview": memoryview,
                         "bytearray": bytearray},
        "_uv": read_uvarint,
        "_wuv": write_uvarint,
        "_uvsize": uvarint_size,
        "_Bad": Malformed,
        "_UUID": UUID,
        "_unpack_from": struct.unpack_from,
        "_pack": struct.pack,
        "_h": struct.Struct(">h"),
        "_i": struct.Struct(">i"),
        "_read_tags": read_tags,
        "_scan_tags": scan_tags,
        "_ci1": count_int,
        "_ci": count_ints,
        "_LN": _LN,
        "_write_tags": write_tags,
        "_uuid_bytes": uuid_bytes,
        "_EncodeError": EncodeError,
    }
