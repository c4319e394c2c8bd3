"""Small reads of single facts from a frame without decoding it: a Produce's acks, an error code."""

from __future__ import annotations

import struct

from kinspect.protocol.error_codes import UNSUPPORTED_VERSION
from kinspect.protocol.wire.primitives import Malformed, read_uvarint

_INT16 = struct.Struct(">h")


def produce_acks(frame: bytes, body_offset: int, version: int, flexible: bool) -> int | None:
    """The Acks of a Produce request (None if the frame is too short to say).

    v0-2 start with Acks; v3+ put the nullable TransactionalId before it.
    """
    pos = body_offset
    try:
        if version >= 3:
            if flexible:
                length = frame[pos]
                if length < 0x80:  # a one-byte varint: any TransactionalId under 127 bytes, or null
                    length, pos = length - 1, pos + 1
                else:
                    length, pos = read_uvarint(frame, pos)
                    length -= 1
            else:
                length = _INT16.unpack_from(frame, pos)[0]
                pos += 2
            if length > 0:
                pos += length
        return _INT16.unpack_from(frame, pos)[0]
    except (struct.error, IndexError, Malformed):
        return None


def leading_error_code(frame: bytes, body_offset: int) -> int | None:
    """The int16 at the start of a body (ApiVersions responses start with their ErrorCode)."""
    try:
        return _INT16.unpack_from(frame, body_offset)[0]
    except struct.error:
        return None


def api_versions_body_version(frame: bytes, version: int, body_offset: int) -> int:
    """The version an ApiVersions response's body is read at: its request's, or 0 where the broker
    did not know that version and answered UNSUPPORTED_VERSION with a v0 body (KIP-511)."""
    return 0 if version > 0 and leading_error_code(frame, body_offset) == UNSUPPORTED_VERSION else version


def tag_section_fields(frame: bytes, pos: int) -> tuple[list[tuple[int, int]], int]:
    """The (tag, size) of each field of the tag section at pos, and where the section ends.

    Raises Malformed (or IndexError) when the section is not whole within the frame.
    """
    count, pos = read_uvarint(frame, pos)
    fields = []
    for _ in range(count):  # each field takes at least 2 bytes: a hostile count ends at the frame's end
        tag, pos = read_uvarint(frame, pos)
        size, pos = read_uvarint(frame, pos)
        pos += size
        fields.append((tag, size))
    if pos > len(frame):
        raise Malformed("tag section runs past the frame")
    return fields, pos
