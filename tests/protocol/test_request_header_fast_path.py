"""The request header read inline equals what the compiled RequestHeader decoder gives, on every input."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError

CODEC = Codec()


def compiled(frame: bytes):
    """The header as the generated decoder reads it (the reference)."""
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
    try:
        hv = CODEC.request_header_version(api_key, api_version)
    except Exception:
        hv = 1
    fields, end = CODEC.header("RequestHeader", hv).decode(frame, 0, whole=False)
    return (api_key, api_version, correlation_id, fields.get("ClientId"), hv, end, fields)


def outcome(read, frame: bytes):
    try:
        return read(frame)
    except DecodeError as exc:
        return ("error", str(exc))


def fast(frame: bytes):
    h = CODEC.decode_request_header(frame)
    return (h.api_key, h.api_version, h.correlation_id, h.client_id, h.version, h.size, h.fields)


@settings(max_examples=600, derandomize=True, deadline=None)
@given(api=st.sampled_from([(3, 12), (3, 1), (18, 3), (18, 2), (0, 9), (7, 0), (31000, 1), (3, 99)]),
       client_id=st.one_of(st.none(), st.binary(max_size=40)), tags=st.binary(max_size=6),
       declared=st.one_of(st.none(), st.integers(-3, 60)), tail=st.binary(max_size=8))
def test_inline_read_equals_the_compiled_header(api, client_id, tags, declared, tail):
    api_key, version = api
    prefix = struct.pack(">hhi", api_key, version, 77)
    if client_id is None:
        body = struct.pack(">h", -1 if declared is None else declared)
    else:
        body = struct.pack(">h", len(client_id) if declared is None else declared) + client_id
    frame = prefix + body + tags + tail
    assert outcome(fast, frame) == outcome(compiled, frame)
