"""A connection's request headers read through RequestHeaders' memo equal what the codec reads, frame by frame."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.errors import DecodeError, UnknownApiError
from kinspect.session.facts import RequestHeaders, request_header_tags

CODEC = Codec()
APIS = [(3, 12), (3, 1), (18, 3), (18, 2), (0, 9), (7, 0), (31000, 1), (3, 99)]


def header_version(api_key: int, version: int) -> int:
    try:
        return CODEC.request_header_version(api_key, version)
    except UnknownApiError:
        return 1


def codec_read(frame: bytes):
    try:
        header = CODEC.decode_request_header(frame)
    except DecodeError as exc:
        return ("error", str(exc))
    tag_bytes, tags = request_header_tags(frame, header)
    return header, tag_bytes, tags


def memo_read(reader: RequestHeaders, frame: bytes):
    api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
    try:
        return reader.read(frame, api_key, version, correlation_id, header_version(api_key, version))
    except DecodeError as exc:
        return ("error", str(exc))


# A header's parts: a few client ids and tag sections, so that consecutive frames often repeat them.
client_ids = st.sampled_from([None, b"", b"rdkafka", b"consumer-1", b"\xff\xfe", b"x" * 300])
tag_sections = st.sampled_from([b"", b"\x00", b"\x01\x05\x02ab", b"\x02\x00\x00\x01\x00", b"\x05"])
frames = st.builds(
    lambda api, correlation_id, client_id, declared, tags, tail: (
        struct.pack(">hhi", *api, correlation_id)
        + (struct.pack(">h", -1 if declared is None else declared) if client_id is None
           else struct.pack(">h", len(client_id) if declared is None else declared) + client_id)
        + tags + tail),
    st.sampled_from(APIS), st.integers(0, 2**31 - 1), client_ids,
    st.one_of(st.none(), st.none(), st.integers(-3, 12)), tag_sections, st.binary(max_size=6))


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.lists(frames, min_size=1, max_size=12))
def test_memo_reads_what_the_codec_reads(sequence):
    reader = RequestHeaders(CODEC)
    for frame in sequence + sequence:  # every header again: the second time from the memo
        assert memo_read(reader, frame) == codec_read(frame)


def test_a_repeated_header_is_not_read_again():
    reader = RequestHeaders(CODEC)
    first = struct.pack(">hhi", 3, 12, 1) + struct.pack(">h", 7) + b"rdkafka" + b"\x00" + b"body"
    again = struct.pack(">hhi", 3, 12, 2) + struct.pack(">h", 7) + b"rdkafka" + b"\x00" + b"other body"
    header, _, _ = memo_read(reader, first)
    reader.codec = None  # a read by the codec would fail now
    repeated, tag_bytes, tags = memo_read(reader, again)
    assert (repeated.correlation_id, repeated.client_id, repeated.size, tag_bytes, tags) == (2, "rdkafka", 18, 1, ())
    assert repeated.fields == {**header.fields, "CorrelationId": 2}


def test_a_header_made_from_a_base_reads_as_one_made_with_its_fields():
    tags = [(3, b"hi")]
    base = {"RequestApiKey": 18, "RequestApiVersion": 3, "CorrelationId": 1, "ClientId": "c",
            "_unknown_tagged_fields": tags}
    made = RequestHeader(0, 9, 7, "c", 2, 14, base=base)
    whole = RequestHeader(0, 9, 7, "c", 2, 14, {**base, "RequestApiKey": 0, "RequestApiVersion": 9,
                                                 "CorrelationId": 7})
    assert made == whole and whole == made
    assert list(made.fields.items()) == list(whole.fields.items())  # the base's order: what renders it
    assert made.fields is made.fields  # built once
    assert base["CorrelationId"] == 1  # the base is the previous header's, unchanged
    assert made != RequestHeader(0, 9, 8, "c", 2, 14, base=base)
    assert "CorrelationId': 7" in repr(made)


def test_a_header_takes_fields_or_a_base():
    with pytest.raises(TypeError, match="one of the two"):
        RequestHeader(0, 9, 7, "c", 2, 14)
    with pytest.raises(TypeError, match="one of the two"):
        RequestHeader(0, 9, 7, "c", 2, 14, {}, base={})
