"""The pipeline gives the same events and sends the same bytes however the reads cut the streams.

Every recorded conversation goes through a rewrite-mode session (the transform holds and
rewrites Metadata and FindCoordinator responses), fed whole, frame by frame, one byte at a
time and in random chunks; and `kinspect decode` pairs it as the live pipeline does.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from kinspect.offline_decode import decode_conversation
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Plan, Problem, Request, Response, Session, SessionConfig
from kinspect.session.address_rewrite import AddressRewrite, NodeMap
from kinspect.session.events import frame_bytes
from kinspect.session.replay import frame_ends, replay
from tests.support.paths import TRAFFIC

CONNECTIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


def _responses_of(requests: Path) -> Path:
    return requests.with_name(requests.name.replace("requests", "responses"))


def _rewriting_session(codec: Codec, inspect_max_bytes: int = 1024 * 1024) -> Session:
    transform = AddressRewrite(codec, NodeMap("kinspect.local", port_base=30000))
    return Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(inspect_max_bytes=inspect_max_bytes),
                   Plan(True, transform))


def _fact(event) -> tuple:
    if isinstance(event, Request):
        return ("Request", event.offset, event.api_key, event.api_version, event.correlation_id, event.size,
                event.header_size, event.header_tag_bytes, event.header_tags, event.complete, frame_bytes(event.frame),
                event.expects_response)
    if isinstance(event, Response):
        return ("Response", event.offset, event.api_key, event.api_version, event.correlation_id, event.size,
                event.header_version, event.header_size, event.header_tags, event.complete, frame_bytes(event.frame))
    if isinstance(event, Exchange):
        return ("Exchange", event.request.correlation_id, event.response and event.response.correlation_id)
    return ("Problem", event.kind, event.direction, event.size, event.offset)


def _run(codec: Codec, requests: bytes, responses: bytes, cut, **session) -> tuple[list, bytes]:
    """Client bytes first, then broker bytes, each cut into reads by `cut`; the facts and the bytes sent."""
    s = _rewriting_session(codec, **session)
    facts, sent = [], []
    for data in cut(requests):
        forward, events = s.client_data(data, 1.0)
        assert forward is None  # client bytes always pass as read
        facts += [_fact(e) for e in events]
    for data in cut(responses):
        forward, events = s.broker_data(data, 2.0)
        sent += forward
        facts += [_fact(e) for e in events]
    return facts, b"".join(sent)


def _frames(data: bytes) -> list[bytes]:
    start, out = 0, []
    for end in frame_ends(data):
        out.append(data[start:end])
        start = end
    return out + ([data[start:]] if start < len(data) else [])


def _random(seed: int):
    def cut(data: bytes) -> list[bytes]:
        rng, pos, out = random.Random(seed), 0, []
        while pos < len(data):
            step = rng.choice((1, 2, 3, 7, 64, 500, 4096))
            out.append(data[pos : pos + step])
            pos += step
        return out

    return cut


@pytest.mark.parametrize("requests", CONNECTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_any_chunking_gives_the_same_events_and_bytes(codec: Codec, requests: Path):
    responses = _responses_of(requests).read_bytes()
    requests_bytes = requests.read_bytes()
    whole_facts, whole_sent = _run(codec, requests_bytes, responses, lambda d: [d])
    assert [f for f in whole_facts if f[0] == "Problem" and f[1] != "unpaired_response"] == []
    for cut in (_frames, lambda d: [d[i : i + 1] for i in range(len(d))], _random(1), _random(2)):
        assert _run(codec, requests_bytes, responses, cut) == (whole_facts, whole_sent)
    # Frames over the inspection limit are kept by their head, the same in any chunking.
    heads = _run(codec, requests_bytes, responses, lambda d: [d], inspect_max_bytes=600)
    assert _run(codec, requests_bytes, responses, _random(3), inspect_max_bytes=600) == heads


@pytest.mark.parametrize("requests", CONNECTIONS[::3], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_only_address_responses_change(codec: Codec, requests: Path):
    """What the pipeline sends differs from what the broker sent only in the rewritten frames."""
    responses = _responses_of(requests).read_bytes()
    _, sent = _run(codec, requests.read_bytes(), responses, lambda d: [d])
    original, rewritten = _frames(responses), _frames(sent)
    assert len(original) == len(rewritten)
    for before, after in zip(original, rewritten):
        if before != after:
            correlation_id = struct.unpack_from(">i", before, 4)[0]
            assert correlation_id == struct.unpack_from(">i", after, 4)[0]
            assert b"kinspect.local" in after


@pytest.mark.parametrize("requests", CONNECTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_decode_pairs_as_the_live_pipeline_does(codec: Codec, requests: Path):
    """`kinspect decode` and a live session see the same pairs, with the same facts."""
    responses = _responses_of(requests).read_bytes()
    live = Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(), Plan(True))
    live_pairs = []
    for events in replay(live, requests.read_bytes(), responses):
        for e in events:
            if isinstance(e, Exchange) and e.response is not None:
                live_pairs.append((e.request.offset, e.request.correlation_id, e.request.api_key,
                                   e.response.offset, e.response.api_version, e.response.header_size))
    records = list(decode_conversation(codec, requests.read_bytes(), responses))
    decoded_pairs = []
    for request, response in zip(records, records[1:]):
        if (request["direction"] == "request" and response["direction"] == "response"
                and "warning" not in response and response.get("correlation_id") == request.get("correlation_id")):
            decoded_pairs.append((request["offset"], request["correlation_id"], request["api_key"],
                                  response["offset"], response["api_version"], response["header_size"]))
    assert decoded_pairs == live_pairs and live_pairs


def _framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def test_decode_follows_sasl_raw_tokens_and_the_kip511_fallback(codec: Codec):
    """A recorded SASL v0 handshake with raw tokens, and an ApiVersions answered with a v0 body."""
    header = {"RequestApiVersion": 0, "ClientId": "c"}
    handshake = codec.encode_request({**header, "RequestApiKey": 17, "CorrelationId": 1}, {"Mechanism": "PLAIN"})
    versions = codec.encode_request({**header, "RequestApiKey": 18, "RequestApiVersion": 4, "CorrelationId": 2},
                                    {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"})
    token = b"\x00user\x00secret"
    requests = _framed(handshake) + _framed(token) + _framed(versions)
    responses = (_framed(codec.encode_response(17, 0, {"CorrelationId": 1}, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]}))
                 + _framed(b"")  # the server's empty raw token
                 + _framed(codec.encode_response(18, 0, {"CorrelationId": 2}, {
                     "ErrorCode": 35, "ApiKeys": [{"ApiKey": 18, "MinVersion": 0, "MaxVersion": 3}]})))
    records = list(decode_conversation(codec, requests, responses))
    assert [(r["direction"], r.get("api_key"), r.get("api_version"), r.get("raw_sasl_token")) for r in records] == [
        ("request", 17, 0, None), ("response", 17, 0, None), ("request", None, None, True),
        ("response", None, None, True), ("request", 18, 4, None), ("response", 18, 0, None)]
    assert b"secret" not in repr(records).encode()
    assert all(r["error"] is None for r in records)
    live = Session(codec, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(), Plan(True))
    kinds = [e.kind if isinstance(e, Problem) else type(e).__name__ for events in replay(live, requests, responses)
             for e in events]
    assert kinds == ["Request", "Response", "Exchange", "sasl_tokens", "sasl_tokens", "Request", "Response", "Exchange"]
