"""Bad input: a DecodeError naming api, version, field path and offset; nothing else escapes."""

from __future__ import annotations

import struct
import tracemalloc
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError, UnknownApiError


def _metadata_response(codec: Codec) -> tuple[bytes, dict]:
    body = {
        "ThrottleTimeMs": 0, "Brokers": [{"NodeId": 1, "Host": "b1", "Port": 9092, "Rack": None}],
        "ClusterId": "c", "ControllerId": 1,
        "Topics": [{"ErrorCode": 0, "Name": f"t{i}", "TopicId": uuid.UUID(int=i), "IsInternal": False,
                    "Partitions": [{"ErrorCode": 0, "PartitionIndex": p, "LeaderId": 1, "LeaderEpoch": 0,
                                    "ReplicaNodes": [1], "IsrNodes": [1], "OfflineReplicas": []} for p in range(3)],
                    "TopicAuthorizedOperations": 0} for i in range(3)],
    }
    return bytes(codec.body(3, "response", 12).encode(body)), body


def test_truncation_names_path_and_offset(codec):
    data, _ = _metadata_response(codec)
    compiled = codec.body(3, "response", 12)
    with pytest.raises(DecodeError) as info:
        compiled.decode(data[:-12])
    err = info.value
    assert err.api == "Metadata" and err.version == 12 and err.direction == "response"
    assert err.path.startswith("Topics[2].Partitions[2].")
    assert len(data) - 40 < err.offset <= len(data) - 12
    # A cut before the elements: the array length itself is checked against what is left.
    with pytest.raises(DecodeError, match="array of 3 elements overruns") as info:
        compiled.decode(data[:60])
    assert info.value.path == "Topics"
    assert "Metadata response v12" in str(err) and f"byte {err.offset}" in str(err)


def test_every_truncation_is_a_decode_error(codec):
    data, _ = _metadata_response(codec)
    compiled = codec.body(3, "response", 12)
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            compiled.decode(data[:cut])
        with pytest.raises(DecodeError):
            compiled.scan(data[:cut])


def test_trailing_bytes_are_reported(codec):
    data, _ = _metadata_response(codec)
    with pytest.raises(DecodeError, match="2 trailing bytes") as info:
        codec.body(3, "response", 12).decode(data + b"\x00\x00")
    assert info.value.offset == len(data)


def test_huge_lengths_allocate_nothing(codec):
    compiled = codec.body(3, "request", 4)  # non-flexible: int32 array length, int16 string length
    hostile = struct.pack(">i", 2**31 - 1) + b"\x00" * 16
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="overruns"):
            compiled.decode(hostile)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024
    flexible = codec.body(3, "request", 12)
    with pytest.raises(DecodeError, match="overruns"):
        flexible.decode(b"\xff\xff\xff\xff\x07" + b"\x00" * 8)  # compact array of 2^31-2 topics


def test_overlong_varint_is_rejected(codec):
    with pytest.raises(DecodeError, match="longer than 5 bytes"):
        codec.body(3, "request", 12).decode(b"\x81\x80\x80\x80\x80\x00" + b"\x00" * 8)


def test_null_in_a_non_nullable_field(codec):
    compiled = codec.body(19, "request", 5)  # CreateTopics v5: Topics is not nullable
    with pytest.raises(DecodeError, match="null array in a field that is not nullable") as info:
        compiled.decode(b"\x00" + b"\x00" * 8)
    assert info.value.path == "Topics"


def test_negative_length(codec):
    with pytest.raises(DecodeError, match="negative string length -7"):
        codec.body(3, "request", 4).decode(struct.pack(">ih", 1, -7) + b"\x00" * 8)


def test_invalid_utf8(codec):
    with pytest.raises(DecodeError, match="UTF-8") as info:
        codec.body(3, "request", 4).decode(struct.pack(">ih", 1, 2) + b"\xff\xfe" + b"\x00")
    assert info.value.path == "Topics[0].Name"


def test_tags_out_of_order_and_duplicate(codec):
    compiled = codec.body(18, "request", 3)  # ApiVersions v3: two compact strings, then tags
    base = b"\x02a\x02b"
    assert compiled.decode(base + b"\x02\x01\x00\x05\x00")[0]["_unknown_tagged_fields"] == [(1, b""), (5, b"")]
    with pytest.raises(DecodeError, match="ascending"):
        compiled.decode(base + b"\x02\x05\x00\x01\x00")
    with pytest.raises(DecodeError, match="ascending"):
        compiled.decode(base + b"\x02\x05\x00\x05\x00")
    with pytest.raises(DecodeError, match="overruns"):
        compiled.decode(base + b"\x01\x05\x7f\x00")


def test_unknown_api_key_and_version(codec):
    frame = struct.pack(">hhih", 30000, 0, 7, -1)
    header = codec.decode_request_header(frame)
    assert (header.api_key, header.correlation_id, header.client_id) == (30000, 7, None)
    with pytest.raises(UnknownApiError, match="unknown api key 30000"):
        codec.decode_request(frame)
    with pytest.raises(UnknownApiError, match="unknown version 99 of Produce"):
        codec.decode_request(struct.pack(">hhih", 0, 99, 7, -1))


def test_short_frames(codec):
    with pytest.raises(DecodeError, match="shorter than the 8-byte header"):
        codec.decode_request(b"\x00\x03")
    with pytest.raises(DecodeError):
        codec.decode_request(struct.pack(">hhi", 3, 12, 1) + b"\x00\x10abc")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), key=st.sampled_from([0, 1, 3, 8, 11, 18, 19, 32, 60]),
       version=st.integers(0, 18), direction=st.sampled_from(["request", "response"]))
def test_random_bytes_give_a_value_or_a_decode_error(codec, data, key, version, direction):
    if version not in codec.registry.versions(key, direction):
        return
    compiled = codec.body(key, direction, version)
    for call in (compiled.decode, compiled.scan):
        try:
            call(data)
        except DecodeError:
            pass


@settings(max_examples=200, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=4))
def test_bit_flips_give_a_value_or_a_decode_error(codec, flips):
    data, _ = _metadata_response(codec)
    mutated = bytearray(data)
    for where, bit in flips:
        mutated[where % len(mutated)] ^= 1 << bit
    compiled = codec.body(3, "response", 12)
    for call in (compiled.decode, compiled.scan):
        try:
            call(bytes(mutated))
        except DecodeError:
            pass
