"""Hostile frames through the real proxy: forwarded byte for byte both ways, counted as decode failures, and the proxy lives on.

(a) Raw sockets send garbage, short frames, a huge and a negative size prefix, unknown api
keys, bit-flipped valid requests and a truncated frame through kinspect (passthrough) to a
real Tansu broker, with a RecordingRelay between kinspect and Tansu recording what kinspect
sent and what came back; a confluent-kafka client is then served normally.
(b) A fake upstream written here records what kinspect forwards and answers with hostile
responses (garbage bodies, truncated bodies, unpaired ids, a frame without a correlation id,
negative and huge size prefixes); a well-formed exchange afterwards still decodes.
"""

from __future__ import annotations

import gc
import queue
import random
import socket
import struct
import threading

import pytest

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from kinspect.session import Problem, Response
from tests.support.proxy_harness import (
    ProxyHarness,
    api_versions,
    create_topic,
    metadata,
    poll_until,
    produce,
)
from tests.support.recording_relay import RecordingRelay
from tests.support.tansu import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TIMEOUT = 15


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def converse(port: int, chunks: list[bytes], *, half_close: bool = True, answer_first: bool = False) -> bytes:
    """Send the chunks through kinspect, end our side, and return everything sent back until the close.

    answer_first: wait for the response to the first chunk (one whole frame) before sending the
    rest, so that a broker closing on a later bad frame cannot do so before it has answered."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        for n, chunk in enumerate(chunks):
            sock.sendall(chunk)
            if n == 0 and answer_first:
                received = _one_frame(sock)
        if not half_close:
            return b""  # the truncated-frame case: just go away
        sock.shutdown(socket.SHUT_WR)
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass
        return received


def _one_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame read whole (less if the peer closes first)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def flipped(frame_with_size: bytes, seed: int, header_bytes: int = 12) -> bytes:
    """A valid request with a few bits flipped after its size, api key, version and correlation id."""
    rng = random.Random(seed)
    out = bytearray(frame_with_size)
    for _ in range(3):
        at = rng.randrange(header_bytes, len(out))
        out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def rejected_at(codec: Codec, frame_with_size: bytes) -> str | None:
    """Where kinspect's codec rejects this request: "header", "body", or None (what the proxy should count)."""
    try:
        header = codec.decode_request_header(frame_with_size[4:])
    except DecodeError:
        return "header"
    try:
        codec.scan_request(frame_with_size[4:], header)
    except DecodeError:
        return "body"
    return None


def problems(proxy: ProxyHarness, kind: str, direction: str) -> list[Problem]:
    return [p for p in proxy.events_of(Problem) if p.kind == kind and p.direction == direction]


def sample(observer: MetricsObserver, name: str, **labels) -> float:
    return observer.registry.get_sample_value(name, labels) or 0.0


# ----------------------------------------------------------------------------- (a) a real broker


@pytest.fixture
def broker_rig(tmp_path):
    """Tansu advertising kinspect's listener; kinspect -> recording relay -> Tansu."""
    listen_port = free_port()
    observer = MetricsObserver()
    with TansuBroker(advertised_port=listen_port) as tansu:
        with RecordingRelay("127.0.0.1", tansu.port, tmp_path / "back") as relay:
            proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                                  "proxy.upstream": relay.address}, observers=(observer,))
            observer.server = proxy.server
            with proxy:
                yield proxy, relay, observer, listen_port


def test_hostile_requests_to_a_real_broker(broker_rig, codec: Codec):
    proxy, relay, observer, port = broker_rig
    ok = api_versions(codec, 1)
    flips = [flipped(produce(codec, 10 + i, "hostile.topic", [b"v%d" % i]), seed=i) for i in range(6)]
    flips += [flipped(create_topic(codec, 20 + i, "hostile.topic"), seed=100 + i) for i in range(6)]
    null_topics = struct.pack(">hhih", 19, 4, 30, -1) + b"\xff" * 10  # CreateTopics v4, Topics = null
    scenarios = [
        # garbage: a valid request, a frame too short for a header, a known api with a garbage body
        [ok, sized(b"\x01\x02\x03"), sized(null_topics), sized(bytes(range(256)) * 2)],
        # unknown api keys and versions, with bodies
        [ok, sized(struct.pack(">hhih", 30000, 0, 2, -1) + b"\x00" * 16),
         sized(struct.pack(">hhih", 3, 99, 3, -1) + b"\xff" * 9)],
        # bit-flipped valid requests, all in one write
        [ok, b"".join(flips)],
        # a size prefix above kinspect's limit (and Tansu's), then bytes that never make a frame
        [ok, struct.pack(">i", 2**31 - 1) + b"\x00\x12\x00\x03" + b"\x00" * 60],
        # a negative size prefix, then more bytes
        [ok, struct.pack(">i", -5) + b"garbage after a negative size"],
    ]
    for i, chunks in enumerate(scenarios):
        # Tansu closes on a bad frame, and with every chunk sent at once it sometimes did so before
        # answering the valid ApiVersions (seen once under load): the rest waits for that answer.
        received = converse(port, chunks, answer_first=True)
        proxy.wait_idle(TIMEOUT)
        assert relay.drain(TIMEOUT)
        recorded = relay.connections[i]
        sent_path = relay.out_dir / f"{recorded.number:03d}.requests.bin"
        back_path = relay.out_dir / f"{recorded.number:03d}.responses.bin"
        # Every byte kinspect sent is the client's, in order. Tansu may close on a bad frame before the
        # rest arrives (a race the machine's load decides), so what reached it is a prefix of what was
        # sent, and always holds the valid ApiVersions whole.
        forwarded = sent_path.read_bytes()
        assert b"".join(chunks).startswith(forwarded), f"scenario {i}: requests changed on the way"
        assert len(forwarded) >= len(ok), f"scenario {i}: the valid ApiVersions was not forwarded"
        answered = back_path.read_bytes() if back_path.exists() else b""
        assert received == answered, f"scenario {i}: responses changed on the way"
        assert len(received) >= 8, f"scenario {i}: the valid ApiVersions was not answered"
    # A truncated frame and then the client is gone.
    converse(port, [ok[:-7]], half_close=False)
    proxy.wait_idle(TIMEOUT)
    assert relay.drain(TIMEOUT)
    assert (relay.out_dir / f"{relay.connections[-1].number:03d}.requests.bin").read_bytes() == ok[:-7]

    # Counted: each hostile thing once, where kinspect can tell.
    flip_headers = sum(rejected_at(codec, f) == "header" for f in flips)
    flip_bodies = sum(rejected_at(codec, f) == "body" for f in flips)
    assert flip_headers >= 1 and flip_bodies >= 1  # the flips do hit both checks (fixed seeds)
    # The 512 garbage bytes read as api 1 "version 515", unknown, so as header v1, whose ClientId overruns.
    assert rejected_at(codec, sized(bytes(range(256)) * 2)) == "header"
    # Problems: the 3-byte frame, the garbage, the negative size, and flips that broke a header.
    details = [p.detail for p in problems(proxy, "decode_error", "request")]
    assert len(details) == 3 + flip_headers, details
    assert len(problems(proxy, "frame_too_large", "request")) == 1
    assert len(problems(proxy, "unknown_api", "request")) == 2  # api 30000, Metadata v99
    assert sample(observer, "kinspect_unknown_api_requests_total") == 2
    counted = lambda api, reason="decode_error": sample(
        observer, "kinspect_decode_failures_total", api=api, direction="request", reason=reason)
    assert counted("unknown") == 3 + flip_headers
    assert counted("Produce") + counted("CreateTopics") == flip_bodies + 1  # + the null Topics
    assert counted("unknown", "frame_too_large") == 1

    # The same proxy serves a well-behaved client afterwards.
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    before = sum(sample(observer, "kinspect_decode_failures_total", api=a, direction=d, reason="decode_error")
                 for a in ("Produce", "Metadata", "CreateTopics", "ApiVersions", "unknown")
                 for d in ("request", "response"))
    base = {"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "after-hostile"}
    admin = AdminClient(dict(base))
    admin.create_topics([NewTopic("after.hostile", num_partitions=1, replication_factor=1)])["after.hostile"].result(
        TIMEOUT)
    producer = Producer({**base, "acks": "all", "linger.ms": 1})
    delivered = []
    for i in range(5):
        producer.produce("after.hostile", value=b"fine %d" % i, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(TIMEOUT) == 0 and delivered == [None] * 5
    assert "after.hostile" in admin.list_topics(timeout=TIMEOUT).topics
    del admin, producer
    gc.collect()
    proxy.wait_idle(TIMEOUT)
    assert sample(observer, "kinspect_requests_total", api="Produce", version="9") + sum(
        sample(observer, "kinspect_requests_total", api="Produce", version=str(v)) for v in range(10, 14)) >= 1
    after = sum(sample(observer, "kinspect_decode_failures_total", api=a, direction=d, reason="decode_error")
                for a in ("Produce", "Metadata", "CreateTopics", "ApiVersions", "unknown")
                for d in ("request", "response"))
    assert after == before  # the good client's traffic decodes


# ----------------------------------------------------------------------------- (b) a hostile upstream


class FakeUpstream:
    """A TCP server that records what each connection sends and answers with scripted bytes.

    Each accepted connection takes the next plan (expect, reply): it reads until `expect`
    bytes have come (or the peer's EOF), sends `reply`, half-closes, and reads on to EOF.
    `reply` may be a list of (bytes, gate): each piece is sent after its gate() returns.
    """

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.plans: queue.Queue = queue.Queue()
        self.received: list[bytes] = []
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _handle(self, conn: socket.socket) -> None:
        expect, reply = self.plans.get(timeout=TIMEOUT)
        conn.settimeout(TIMEOUT)
        data = b""
        with conn:
            try:
                while len(data) < expect and (chunk := conn.recv(65536)):
                    data += chunk
                for piece, gate in (reply if isinstance(reply, list) else [(reply, None)]):
                    if gate is not None:
                        poll_until(gate, TIMEOUT)
                    conn.sendall(piece)
                conn.shutdown(socket.SHUT_WR)
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
        self.received.append(data)

    def close(self) -> None:
        self.sock.close()
        for t in self._threads:
            t.join(TIMEOUT)


def answered(proxy: ProxyHarness, *correlation_ids: int) -> bool:
    """Whether kinspect has reported the responses to these correlation ids."""
    seen = {e.correlation_id for e in proxy.events_of(Response)}
    return all(c in seen for c in correlation_ids)


@pytest.fixture
def fake_rig():
    upstream = FakeUpstream()
    observer = MetricsObserver()
    proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                          "proxy.upstream": f"127.0.0.1:{upstream.port}"}, observers=(observer,))
    observer.server = proxy.server
    try:
        with proxy:
            yield proxy, upstream, observer, proxy.server.bootstrap_port
    finally:
        upstream.close()


def test_hostile_responses_from_an_upstream(fake_rig, codec: Codec):
    proxy, upstream, observer, port = fake_rig
    md_body = {"ThrottleTimeMs": 0, "Brokers": [{"NodeId": 1, "Host": "h", "Port": 1, "Rack": None}],
               "ClusterId": "c", "ControllerId": 1, "Topics": []}
    md_response = codec.encode_response(3, 12, {"CorrelationId": 2}, md_body)
    requests = api_versions(codec, 1) + metadata(codec, 2) + api_versions(codec, 3)
    script = [
        sized(struct.pack(">i", 1) + b"\xff" * 7),  # ApiVersions v3 answered with a garbage body
        sized(md_response[:-6]),  # Metadata v12 cut short inside its body
        sized(struct.pack(">i", 999) + b"\x00\x00"),  # a correlation id nobody asked for
        sized(b"\x00\x01"),  # too short for a correlation id
        struct.pack(">i", -2) + b"and then anything at all",  # a negative size: no more inspection
        sized(b"\x00" * 40),  # forwarded, not inspected
    ]
    reply = b"".join(script)
    # The bad size goes in a later segment than the frames before it (the same segment: the test below).
    upstream.plans.put((len(requests), [(b"".join(script[:4]), None),
                                        (b"".join(script[4:]), lambda: answered(proxy, 1, 2))]))
    received = converse(port, [requests])
    proxy.wait_idle(TIMEOUT)
    poll_until(lambda: len(upstream.received) == 1, TIMEOUT)
    assert upstream.received[0] == requests and received == reply

    # A huge size prefix from the upstream, after a valid response.
    valid = sized(codec.encode_response(18, 3, {"CorrelationId": 7},
                                        {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}))
    huge = valid + struct.pack(">i", 2**31 - 1) + bytes(range(256)) * 4
    upstream.plans.put((len(api_versions(codec, 7)), [(valid, None), (huge[len(valid):], lambda: answered(proxy, 7))]))
    assert converse(port, [api_versions(codec, 7)]) == huge
    proxy.wait_idle(TIMEOUT)
    # the upstream records a connection when the proxy has closed it: this one before the next
    poll_until(lambda: len(upstream.received) == 2, TIMEOUT)
    assert upstream.received[1] == api_versions(codec, 7)

    # A client that sends half a frame and goes away; the upstream sees exactly that half.
    half = metadata(codec, 8)[:9]
    upstream.plans.put((len(half), b""))
    converse(port, [half], half_close=False)
    proxy.wait_idle(TIMEOUT)
    poll_until(lambda: len(upstream.received) == 3, TIMEOUT)
    assert upstream.received[2] == half

    failures = lambda api: sample(observer, "kinspect_decode_failures_total", api=api, direction="response",
                                  reason="decode_error")
    assert failures("ApiVersions") == 1 and failures("Metadata") == 1
    assert len(problems(proxy, "unpaired_response", "response")) == 1
    assert len(problems(proxy, "decode_error", "response")) == 2  # no correlation id; the negative size
    assert len(problems(proxy, "frame_too_large", "response")) == 1
    assert sample(observer, "kinspect_decode_failures_total", api="unknown", direction="response",
                  reason="frame_too_large") == 1

    # The proxy lives on: a well-formed exchange is forwarded and decoded without a new failure.
    before = failures("ApiVersions") + failures("Metadata")
    good = sized(codec.encode_response(3, 12, {"CorrelationId": 9}, md_body))
    upstream.plans.put((len(metadata(codec, 9)), good))
    assert converse(port, [metadata(codec, 9)]) == good
    proxy.wait_idle(TIMEOUT)
    assert failures("ApiVersions") + failures("Metadata") == before
    assert sample(observer, "kinspect_responses_total", api="Metadata", version="12") >= 2


def test_a_response_in_the_same_segment_as_a_bad_size_is_still_seen(fake_rig, codec: Codec):
    proxy, upstream, _, port = fake_rig
    valid = sized(codec.encode_response(18, 3, {"CorrelationId": 7},
                                        {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}))
    reply = valid + struct.pack(">i", -1) + b"rest"
    upstream.plans.put((len(api_versions(codec, 7)), reply))  # one sendall: one segment on loopback
    assert converse(port, [api_versions(codec, 7)]) == reply
    proxy.wait_idle(TIMEOUT)
    assert answered(proxy, 7), [e for e in proxy.events.events]
