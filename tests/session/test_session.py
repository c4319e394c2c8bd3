"""The per-connection session: pairing, chunking, and each special case of the protocol."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from kinspect.session import ConnectionInfo, Exchange, Problem, Request, Response, Session, SessionConfig
from tests.support.paths import TRAFFIC



def _framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def _session(codec: Codec, **config) -> Session:
    return Session(codec, ConnectionInfo(1, "127.0.0.1:50000", "127.0.0.1:9092"), SessionConfig(**config))


def _kinds(events) -> list[str]:
    return [e.kind if isinstance(e, Problem) else type(e).__name__ for e in events]


def _request(codec: Codec, api_key: int, version: int, correlation_id: int, body: dict, client_id="cid") -> bytes:
    header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id, "ClientId": client_id}
    return codec.encode_request(header, body)


def _response(codec: Codec, api_key: int, version: int, correlation_id: int, body: dict) -> bytes:
    return codec.encode_response(api_key, version, {"CorrelationId": correlation_id}, body)


METADATA_REQUEST = {"Topics": None, "AllowAutoTopicCreation": True, "IncludeTopicAuthorizedOperations": False}
METADATA_RESPONSE = {"ThrottleTimeMs": 0, "Brokers": [], "ClusterId": "c", "ControllerId": 1, "Topics": []}


@pytest.mark.parametrize("client", ["confluent_kafka", "kafka_python", "aiokafka"])
def test_recorded_connections_pair_every_request(codec, client):
    for path in sorted((TRAFFIC / client).glob("*.requests.bin")):
        session = _session(codec)
        events = session.client_data(path.read_bytes(), 1.0).events
        events += session.broker_data(path.with_name(path.name.replace("requests", "responses")).read_bytes(), 1.5).events
        requests = [e for e in events if isinstance(e, Request)]
        exchanges = [e for e in events if isinstance(e, Exchange)]
        assert len(exchanges) == len(requests) and session.inflight == 0
        for e in exchanges:
            if e.response is None:
                assert e.request.api_key == 0 and e.request.decode().body["Acks"] == 0
            else:
                assert e.response.correlation_id == e.request.correlation_id and e.latency == 0.5
                e.response.decode()
        # The only unpaired responses are the broker's (Tansu's) answers to acks=0 produces.
        for p in (e for e in events if isinstance(e, Problem)):
            assert p.kind == "unpaired_response" and "acks=0" in p.detail


def test_any_chunking_gives_the_same_events(codec):
    path = sorted((TRAFFIC / "kafka_python").glob("*.requests.bin"))[2]
    requests, responses = path.read_bytes(), path.with_name(path.name.replace("requests", "responses")).read_bytes()

    def run(chunker):
        session = _session(codec)
        out = []
        for direction, data in (("c", requests), ("b", responses)):
            feed = session.client_data if direction == "c" else session.broker_data
            for chunk in chunker(data):
                out += feed(chunk, 1.0).events
        return [(type(e).__name__, getattr(e, "correlation_id", None), getattr(e, "size", None)) for e in out]

    rng = random.Random(7)

    def random_chunks(data):
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 300)
            yield data[pos : pos + step]
            pos += step

    whole = run(lambda d: [d])
    assert whole == run(lambda d: [d[i : i + 1] for i in range(len(d))])
    assert whole == run(random_chunks)


def test_acks_zero_produce_expects_no_response(codec):
    session = _session(codec)
    body = {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1000, "TopicData": []}
    events = session.client_data(_framed(_request(codec, 0, 9, 5, body)), 1.0).events
    assert _kinds(events) == ["Request", "Exchange"]
    assert events[1].response is None and events[1].latency is None
    assert not events[0].expects_response and session.inflight == 0
    body["Acks"] = -1
    events = session.client_data(_framed(_request(codec, 0, 3, 6, body)), 1.0).events
    assert _kinds(events) == ["Request"] and session.inflight == 1


def test_api_versions_fallback_to_v0_body_kip511(codec):
    session = _session(codec)
    request = _request(codec, 18, 4, 1, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"})
    session.client_data(_framed(request), 1.0).events
    # The broker does not know v4: header v0, a v0 body with UNSUPPORTED_VERSION and what it supports.
    v0_body = {"ErrorCode": 35, "ApiKeys": [{"ApiKey": 18, "MinVersion": 0, "MaxVersion": 3}]}
    response = _response(codec, 18, 0, 1, v0_body)
    events = session.broker_data(_framed(response), 2.0).events
    assert _kinds(events) == ["Response", "Exchange"]
    assert events[0].api_version == 0 and events[0].request_version == 4 and events[0].header_version == 0
    assert events[0].decode().body == v0_body


@pytest.mark.parametrize("mechanism, rounds", [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("GSSAPI", 3)])
def test_raw_sasl_tokens_after_handshake_v0(codec, mechanism, rounds):
    session = _session(codec)
    session.client_data(_framed(_request(codec, 17, 0, 1, {"Mechanism": mechanism})), 1.0).events
    events = session.broker_data(_framed(_response(codec, 17, 0, 1, {"ErrorCode": 0, "Mechanisms": [mechanism]})), 1.1).events
    assert _kinds(events) == ["Response", "Exchange"]
    for i in range(rounds):
        # PLAIN's token starts with a zero byte: it would read as api key 0 if taken for a request.
        token = b"\x00user\x00secret-password" if i == 0 else bytes([i]) * 40
        assert _kinds(session.client_data(_framed(token), 1.2).events) == ["sasl_tokens"]
        assert _kinds(session.broker_data(_framed(b"server-token" if i < rounds - 1 else b""), 1.3).events) == ["sasl_tokens"]
    events = session.client_data(_framed(_request(codec, 3, 12, 2, METADATA_REQUEST)), 2.0).events
    assert _kinds(events) == ["Request"]
    events = session.broker_data(_framed(_response(codec, 3, 12, 2, METADATA_RESPONSE)), 2.1).events
    assert _kinds(events) == ["Response", "Exchange"]


def test_failed_handshake_stays_framed(codec):
    session = _session(codec)
    session.client_data(_framed(_request(codec, 17, 0, 1, {"Mechanism": "PLAIN"})), 1.0).events
    session.broker_data(_framed(_response(codec, 17, 0, 1, {"ErrorCode": 33, "Mechanisms": ["SCRAM-SHA-256"]})), 1.1).events
    assert _kinds(session.client_data(_framed(_request(codec, 3, 12, 2, METADATA_REQUEST)), 2.0).events) == ["Request"]


def test_unknown_api_is_forwarded_reported_and_paired(codec):
    session = _session(codec)
    frame = struct.pack(">hhih", 31000, 3, 9, 2) + b"id" + b"opaque"
    events = session.client_data(_framed(frame), 1.0).events
    assert _kinds(events) == ["unknown_api", "Request"]
    assert events[0].api_key == 31000
    with pytest.raises(DecodeError):
        events[1].decode()
    events = session.broker_data(_framed(struct.pack(">i", 9) + b"whatever"), 1.5).events
    assert _kinds(events) == ["Response", "Exchange"]


def test_frame_too_large_and_tls_client_hello(codec):
    session = _session(codec, max_frame_bytes=1000)
    events = session.client_data(struct.pack(">i", 5000) + b"x" * 10, 1.0).events
    assert _kinds(events) == ["frame_too_large"] and events[0].size == 5000
    assert session.client_data(b"more bytes", 1.0).events == []  # the direction is no longer inspected
    session = _session(codec)
    events = session.client_data(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 1.0).events
    assert _kinds(events) == ["tls_on_plaintext"] and "TLS ClientHello" in events[0].detail


def test_large_frames_keep_only_their_head(codec):
    session = _session(codec, inspect_max_bytes=1024)
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
            "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": b"r" * 5000}]}]}
    frame = _request(codec, 0, 8, 3, body)
    events = []
    for i in range(0, len(frame) + 4, 700):
        events += session.client_data(_framed(frame)[i : i + 700], 1.0).events
    assert _kinds(events) == ["Request"]
    request = events[0]
    assert not request.complete and request.size == len(frame) and len(request.frame) == 512
    assert request.header.correlation_id == 3 and request.expects_response
    with pytest.raises(DecodeError, match="larger than the inspection limit"):
        request.decode()


def test_inflight_is_bounded_and_swept(codec):
    session = _session(codec, max_inflight=3, request_timeout=10.0)
    events = []
    for cid in range(5):
        events += session.client_data(_framed(_request(codec, 3, 12, cid, METADATA_REQUEST)), float(cid)).events
    # The 2 oldest lose their facts; what their responses need (a rewrite) is still kept.
    assert _kinds(events).count("inflight_overflow") == 2 and session.inflight == 5
    assert _kinds(session.sweep(12.5)) == ["request_timeout"] * 1  # the request seen at t=2; t=0, 1 already told
    assert session.inflight == 2
    assert _kinds(session.close(13.0)) == ["unanswered", "unanswered"] and session.inflight == 0


def test_client_id_is_learned(codec):
    session = _session(codec)
    session.client_data(_framed(_request(codec, 3, 12, 1, METADATA_REQUEST, client_id="app-7")), 1.0).events
    assert session.connection.client_id == "app-7"
