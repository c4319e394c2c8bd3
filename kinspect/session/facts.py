"""The header facts of a frame, computed once by the session: tag-section sizes and tagged fields."""

from __future__ import annotations

from kinspect.protocol.codec import RequestHeader
from kinspect.protocol.codec.codec import Codec
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
    if len(frame) > 4 and frame[4] == 0:  # the common case: an empty tag section
        return 5, 1, ()
    try:
        fields, end = tag_section_fields(frame, 4)
    except (IndexError, Malformed):
        end = min(len(frame), 5)
        return end, end - 4, ()
    return end, end - 4, tuple(fields)


class RequestHeaders:
    """One connection's request headers with their tag facts, read once per distinct header.

    A client sends the same ClientId (and in header v2 the same tag section) in every request
    of a connection: the header's bytes after the correlation id repeat. A header whose bytes
    are those of the previous header of the same header version is built from it without
    reading them again; anything else is read by the codec. Same bytes, same header: the
    outcome is the codec's either way.
    """

    __slots__ = ("codec", "_v1", "_v2")

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._v1 = None  # (bytes after the correlation id, header size, ClientId, fields, tag bytes, tags)
        self._v2 = None

    def read(self, frame: bytes, api_key: int, version: int, correlation_id: int,
             header_version: int) -> tuple[RequestHeader, int, tuple]:
        """(header, bytes of its tag section, (tag, size) of its fields); raises DecodeError as the codec does."""
        last = self._v2 if header_version == 2 else self._v1 if header_version == 1 else None
        if last is not None:
            size = last[1]
            if frame[8:size] == last[0]:
                return (RequestHeader(api_key, version, correlation_id, last[2], header_version, size, base=last[3]),
                        last[4], last[5])
        header = self.codec.decode_request_header(frame)
        tag_bytes, tags = request_header_tags(frame, header)
        if header.version == header_version and header_version >= 1 and header.size <= 8 + 256:
            seen = (bytes(frame[8:header.size]), header.size, header.client_id, header.fields, tag_bytes, tags)
            if header_version == 2:
                self._v2 = seen
            else:
                self._v1 = seen
        return header, tag_bytes, tags
