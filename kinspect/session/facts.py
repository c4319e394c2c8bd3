"""The header facts of a frame, computed once by the session: tag-section sizes and tagged fields."""

from __future__ import annotations

from kinspect.protocol.codec import RequestHeader
from kinspect.protocol.wire.peek import tag_section_fields
from kinspect.protocol.wire.primitives import Malformed


def request_header_tags(frame: bytes, header: RequestHeader) -> tuple[int, tuple]:
    """(bytes of the header's tag section, (tag, size) of its fields); (0, ()) below header v2."""
    if header.version < 2:
        return 0, ()
    # Header v2: the fixed prefix, ClientId (a nullable int16-length string), then the tag section.
    client_id_length = int.from_bytes(frame[8:10], "big", signed=True)
    unknown = header.fields.get("_unknown_tagged_fields")
    tags = tuple((tag, len(data)) for tag, data in unknown) if unknown else ()
    return header.size - 10 - max(0, client_id_length), tags


def response_header_facts(frame: bytes, header_version: int) -> tuple[int, int, tuple]:
    """(header size, bytes of its tag section, (tag, size) of its fields) of a response header v0 or v1."""
    if header_version < 1:
        return 4, 0, ()
    try:
        fields, end = tag_section_fields(frame, 4)
    except (IndexError, Malformed):
        end = min(len(frame), 5)
        return end, end - 4, ()
    return end, end - 4, tuple(fields)
