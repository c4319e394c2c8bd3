"""An event's scan is the codec's scan of its frame, asked once: its short cuts give the codec's outcome.

Response.scan() hands the codec the header's end when the session read a v0 header or a v1
header with an empty tag section; Request.scan() scans on first ask without _Lazy._once. Once the
codec scanned a body in C, both call that C scan directly (Codec.fast_scans) and leave a failure to
the codec, which says where it failed. The codec's own scan of the frame is the reference (asked
first below, so the events take the direct call), and the outcome (scan or DecodeError) is cached
either way.
"""

from __future__ import annotations

import random

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import native_available
from kinspect.protocol.errors import DecodeError
from kinspect.session import ConnectionInfo, Plan, Request, Response, Session, SessionConfig
from kinspect.session.replay import replay
from tests.support.paths import TRAFFIC

CONNECTIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


def _flipper(rng: random.Random, every: int):
    """A mutation changing one byte in `every` (at random places) of the bytes it is given."""
    def flip(data: bytes) -> bytes:
        data = bytearray(data)
        for _ in range(len(data) // every):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    return flip


def _outcome(scan_of):
    try:
        result = scan_of()
    except DecodeError as exc:
        return ("DecodeError", str(exc))
    stats = bytes(result.int_stats) if result.int_stats is not None else None
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
    flip = _flipper(random.Random(requests.stem), 50)  # malformed tag sections and bodies among them
    compared = 0
    for mutate in (None, flip):
        for response in _responses(codec, requests, mutate):
            reference = _outcome(lambda: codec.scan_response(response.frame, response.api_key, response.api_version))
            assert _outcome(response.scan) == reference
            compared += 1
    assert compared
    if native_available():  # the direct calls were there to take
        assert any(not is_request for _, _, is_request in codec.fast_scans)


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


def _requests(codec: Codec, requests, mutate, inspect_max_bytes=1024 * 1024) -> list[Request]:
    data = requests.read_bytes()
    if mutate is not None:
        data = mutate(data)
    session = Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(inspect_max_bytes=inspect_max_bytes),
                      Plan(True))
    return [e for events in replay(session, data) for e in events if type(e) is Request]


def _cached(event):
    """The outcome of asking twice: the same scan object, or the same DecodeError object."""
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(event.scan())
        except DecodeError as exc:
            outcomes.append(exc)
    assert outcomes[0] is outcomes[1]
    return outcomes[0]


@pytest.mark.parametrize("requests", CONNECTIONS[::2], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_request_scan_is_the_codecs_and_cached(requests):
    codec = Codec()
    flip = _flipper(random.Random(requests.stem), 40)  # bodies that fail to scan among them
    failures = 0
    for mutate in (None, flip):
        for request in _requests(codec, requests, mutate):
            if request.complete:
                reference = _outcome(lambda: codec.scan_request(request.frame, request.header))
            else:
                reference = ("DecodeError", f"the {request.size}-byte frame was larger than the inspection limit; "
                                            "only its header was kept")
            assert _outcome(request.scan) == reference
            if native_available() and reference[0] != "DecodeError":  # scanned in C: called directly next time
                assert (request.api_key, request.api_version, True) in codec.fast_scans
            outcome = _cached(request)
            failures += isinstance(outcome, DecodeError)
    heads = [r for r in _requests(codec, requests, None, inspect_max_bytes=64) if not r.complete]
    for request in heads:
        assert isinstance(_cached(request), DecodeError)
