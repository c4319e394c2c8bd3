"""Header versions: v2/v1 requests, v1/v0 responses, and the two exceptions; ClientId keeps int16 length."""

from __future__ import annotations

import struct

import pytest

from kinspect.protocol.codec import Codec, request_header_version, response_header_version


@pytest.mark.parametrize(
    "api_key, version, expected",
    [(0, 8, 1), (0, 9, 2), (3, 8, 1), (3, 9, 2), (18, 2, 1), (18, 3, 2), (7, 0, 0), (7, 1, 1), (7, 3, 2)],
)
def test_request_header_versions(codec: Codec, api_key, version, expected):
    assert codec.request_header_version(api_key, version) == expected


@pytest.mark.parametrize("api_key, version, expected", [(0, 8, 0), (0, 9, 1), (18, 0, 0), (18, 3, 0), (18, 4, 0), (1, 12, 1)])
def test_response_header_versions(codec: Codec, api_key, version, expected):
    assert codec.response_header_version(api_key, version) == expected


def test_the_exceptions_hold_without_a_codec():
    assert request_header_version(7, 0, flexible=False) == 0
    assert response_header_version(18, flexible=True) == 0


def test_client_id_keeps_its_two_byte_length_in_header_v2(codec: Codec):
    header = {"RequestApiKey": 18, "RequestApiVersion": 3, "CorrelationId": 42, "ClientId": "kin"}
    body = {"ClientSoftwareName": "kinspect", "ClientSoftwareVersion": "0.1"}
    frame = codec.encode_request(header, body)
    assert frame[:13] == struct.pack(">hhih", 18, 3, 42, 3) + b"kin"
    assert frame[13] == 0  # the header's empty tag section
    decoded = codec.decode_request(frame)
    assert decoded.header.version == 2 and decoded.header.client_id == "kin" and decoded.header.size == 14
    assert decoded.body == body


def test_header_tagged_fields_are_kept(codec: Codec):
    frame = struct.pack(">hhih", 18, 3, 1, -1) + b"\x01\x03\x02hi" + b"\x02a\x02b\x00"
    decoded = codec.decode_request(frame)
    assert decoded.header.fields["_unknown_tagged_fields"] == [(3, b"hi")]
    assert decoded.header.client_id is None
    assert codec.encode_request(decoded.header.fields, decoded.body) == frame
    # Response header v1 with a tag (Produce v9 is flexible).
    response = struct.pack(">i", 5) + b"\x01\x00\x01\x07"
    fields, hv, size = codec.decode_response_header(response, 0, 9)
    assert (hv, size, fields["_unknown_tagged_fields"]) == (1, len(response), [(0, b"\x07")])


def test_controlled_shutdown_v0_has_no_client_id(codec: Codec):
    frame = struct.pack(">hhi", 7, 0, 3) + struct.pack(">i", 1001)
    decoded = codec.decode_request(frame)
    assert decoded.header.version == 0 and decoded.header.client_id is None
    assert decoded.body == {"BrokerId": 1001}
    assert codec.encode_request(decoded.header.fields, decoded.body) == frame


def test_api_versions_response_uses_header_v0_even_when_flexible(codec: Codec):
    body = {"ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 0, "MaxVersion": 13}], "ThrottleTimeMs": 0}
    frame = codec.encode_response(18, 3, {"CorrelationId": 9}, body)
    assert frame[:4] == struct.pack(">i", 9) and frame[4] == 0  # ErrorCode follows at once: no tag section
    decoded = codec.decode_response(frame, 18, 3)
    assert decoded.header_version == 0 and decoded.body == body
