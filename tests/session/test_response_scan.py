"""A Response's scan starts the body where the session read the header to end, with the codec's outcome.

Response.scan() hands the codec the header's end when the session read a v0 header or a v1
header with an empty tag section; the codec's own reading of the header is the reference.
"""

from __future__ import annotations

import random

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from kinspect.session import ConnectionInfo, Plan, Response, Session, SessionConfig
from kinspect.session.replay import replay
from tests.support.paths import TRAFFIC

CONNECTIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


def _outcome(scan_of):
    try:
        result = scan_of()
    except DecodeError as exc:
        return ("DecodeError", str(exc))
    stats = result.int_stats.tobytes() if result.int_stats is not None else None
    return (result.to_dict(), result.int_slots, stats, result.topic_partitions, result.compact_delta)


def _responses(codec: Codec, requests, mutate=None) -> list[Response]:
    responses_bytes = requests.with_name(requests.name.replace("requests", "responses")).read_bytes()
    if mutate is not None:
        responses_bytes = mutate(responses_bytes)
    session = Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(), Plan(True))
    return [e for events in replay(session, requests.read_bytes(), responses_bytes) for e in events
            if type(e) is Response and e.complete]


@pytest.mark.parametrize("integers", [False, True])
@pytest.mark.parametrize("requests", CONNECTIONS[::2], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_scan_from_the_sessions_header_end_is_the_codecs(requests, integers):
    codec = Codec()
    codec.integer_facts = integers
    rng = random.Random(requests.stem)

    def flip(data: bytes) -> bytes:  # single bytes changed: malformed tag sections and bodies among them
        data = bytearray(data)
        for _ in range(len(data) // 50):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)

    compared = 0
    for mutate in (None, flip):
        for response in _responses(codec, requests, mutate):
            reference = _outcome(lambda: codec.scan_response(response.frame, response.api_key, response.api_version))
            assert _outcome(response.scan) == reference
            compared += 1
    assert compared


def test_a_malformed_header_tag_section_still_fails_the_scan():
    codec = Codec()
    session = Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(), Plan(True))
    request = codec.encode_request({"RequestApiKey": 3, "RequestApiVersion": 12, "CorrelationId": 7, "ClientId": "c"},
                                   {"Topics": None, "AllowAutoTopicCreation": False,
                                    "IncludeTopicAuthorizedOperations": False})
    session.client_data(len(request).to_bytes(4, "big") + request, 1.0)
    frame = b"\x00\x00\x00\x07" + b"\x05\x00"  # a tag section of 5 fields in 2 bytes
    (response, _) = session.broker_data(len(frame).to_bytes(4, "big") + frame, 2.0).events
    with pytest.raises(DecodeError) as raised:
        response.scan()
    with pytest.raises(DecodeError) as reference:
        codec.scan_response(frame, 3, 12)
    assert str(raised.value) == str(reference.value)
