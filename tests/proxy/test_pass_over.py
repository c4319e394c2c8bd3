"""Large reads inside a frame kept by its head are passed over by the relay, not inspected, and change nothing.

A response over inspect.inspect_max_bytes is read by its head; the reads that carry the rest of
it need no inspection. The relay asks the session to pass over such a read (FrameStream.pass_over:
the stream's position moves as feed() would move it) instead of queueing it. These tests give
relays large Fetch responses and Produce requests cut into reads, with small exchanges between,
and check that reads were passed over, and that the events, the bytes forwarded and /metrics are
those of relays that hand every read to the session.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import generate_latest

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.protocol.framing.stream import KEEP_HEAD, KEEP_WHOLE, FrameStream
from kinspect.proxy import relay as relay_module
from kinspect.proxy.relay import Relay
from kinspect.session import ConnectionInfo, Session
from tests.support.event_log import EventLog
from tests.support.proxy_harness import api_versions, fetch, fetch_response, produce, record_batch
from tests.support.relay_stubs import RecordingTransport, event_fact, traffic_lines

CODEC = Codec()
LIMIT = 100_000  # inspect.inspect_max_bytes: frames above it are read by their head


def _conversation() -> tuple[list[bytes], list[bytes]]:
    """(requests, responses), one frame each, paired: large and small of both directions (built once: the
    record batches carry the time they were built)."""
    big_records = [record_batch([bytes([i]) * 1000] * 400) for i in range(3)]  # about 1.2 MB a response
    requests, responses = [], []
    for cid in range(1, 7):
        if cid % 3 == 0:
            requests.append(api_versions(CODEC, cid))
            responses.append(CODEC.encode_response(18, 3, {"CorrelationId": cid}, {
                "ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 0, "MaxVersion": 9}], "ThrottleTimeMs": 0}))
            responses[-1] = len(responses[-1]).to_bytes(4, "big") + responses[-1]
        elif cid % 3 == 1:
            requests.append(fetch(CODEC, cid, "t"))
            responses.append(fetch_response(CODEC, cid, "t", big_records))
        else:
            requests.append(produce(CODEC, cid, "t", [b"v" * 1000] * 600, acks=1))  # about 600 KB
            responses.append(CODEC.encode_response(0, 9, {"CorrelationId": cid}, {"Responses": [], "ThrottleTimeMs": 0}))
            responses[-1] = len(responses[-1]).to_bytes(4, "big") + responses[-1]
    return requests, responses


CONVERSATION = _conversation()


def _reads(frame: bytes, size: int) -> list[bytes]:
    return [frame[i:i + size] for i in range(0, len(frame), size)]


def _cut(stream: bytes, rng: random.Random) -> list[bytes]:
    """A stream in reads of 16 KiB to 400 KB, across frame ends: a read may end a frame and begin the next."""
    reads, at = [], 0
    while at < len(stream):
        size = rng.randint(16 * 1024, 400_000)
        reads.append(stream[at:at + size])
        at += size
    return reads


async def _run(batch_delay_ms: float, read_size: int | random.Random, native: bool = True) -> tuple[list, list, str, int]:
    """One relay given the conversation, each frame in reads of read_size; (events, bytes forwarded each way,
    /metrics, reads passed over). native: its reads through the C Reader where built (else the Python methods)."""
    config = load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": batch_delay_ms,
                                "inspect.inspect_max_bytes": LIMIT})
    log = EventLog()
    app = build_app(config, extra_observers=[log])
    server = app.server
    session = Session(server.codec, ConnectionInfo(1, "c:1", "b:1"), server.session_config, server.plan)
    passed = [0]
    for name in ("pass_client", "pass_broker"):
        original = getattr(session, name)

        def counting(n, original=original):
            done = original(n)
            passed[0] += done
            return done

        setattr(session, name, counting)
    relay = Relay(server, session, server.dispatcher, [], native=native)
    relay.client.transport, relay.broker.transport = RecordingTransport(), RecordingTransport()
    # A read's time is the bytes read so far: the same in both runs, however often the clock is asked.
    relay._early, relay._clock = None, lambda: float(relay.client_bytes + relay.broker_bytes)
    if isinstance(read_size, random.Random):  # the requests pipelined, then the responses, cut anywhere
        for read in _cut(b"".join(CONVERSATION[0]), read_size):
            relay.client.data_received(read)
        for read in _cut(b"".join(CONVERSATION[1]), read_size):
            relay.broker.data_received(read)
    else:
        for request, response in zip(*CONVERSATION):
            for read in _reads(request, read_size):
                relay.client.data_received(read)
            for read in _reads(response, read_size):
                relay.broker.data_received(read)
    relay.close()
    metrics = [line for line in traffic_lines(generate_latest(app.metrics.registry).decode())
               if line.startswith("kinspect_")]
    return ([event_fact(e) for e in log.events], [relay.broker.transport.sent, relay.client.transport.sent],
            "\n".join(metrics), passed[0])


@pytest.fixture
def every_read_to_the_session(monkeypatch):
    """A function that makes the relays hand every read to the session, the C Reader's too (PASS_MIN_BYTES
    is read by it when configured); set back after the test."""
    forward = relay_module._FORWARD
    classes = (Relay, relay_module._Side, relay_module.InspectionQueue, relay_module.Session)
    configured = relay_module.PASS_MIN_BYTES  # monkeypatch sets it back only after this fixture's end

    def never_pass() -> None:
        monkeypatch.setattr(relay_module, "PASS_MIN_BYTES", 1 << 62)
        if forward and forward[0] is not None:
            forward[0].configure(*classes, 1 << 62)

    yield never_pass
    if forward and forward[0] is not None:
        forward[0].configure(*classes, configured)


@pytest.mark.parametrize("batch_delay_ms", [0, 2.0])
@pytest.mark.parametrize("read_size", [65536, 300_000, 1 << 20])
def test_reads_passed_over_change_no_event_byte_or_metric(every_read_to_the_session, batch_delay_ms, read_size):
    passing = asyncio.run(_run(batch_delay_ms, read_size))
    passing_python = asyncio.run(_run(batch_delay_ms, read_size, native=False))  # the C Reader's reference
    every_read_to_the_session()
    reading = asyncio.run(_run(batch_delay_ms, read_size))
    assert reading[3] == 0
    if read_size < 1 << 20:  # reads inside the large frames, after their first
        assert passing[3] > 0
    assert passing == passing_python
    assert passing[0] == reading[0]
    assert [e[0] for e in passing[0]].count("Exchange") == 6
    assert passing[1] == reading[1]
    assert passing[2] == reading[2] and "kinspect_requests_total" in passing[2]


@pytest.mark.parametrize("seed", range(6))
def test_reads_cut_across_frames_are_passed_over_alike_in_c_and_python(every_read_to_the_session, seed):
    """Reads that end one frame and begin the next wait in the queue: a read after them is not passed over
    (the stream is not there yet), by the C Reader as by the Python."""
    passing = asyncio.run(_run(2.0, random.Random(seed)))
    passing_python = asyncio.run(_run(2.0, random.Random(seed), native=False))
    every_read_to_the_session()
    reading = asyncio.run(_run(2.0, random.Random(seed)))
    assert passing[3] > 0 and reading[3] == 0
    assert passing == passing_python
    assert passing[:3] == reading[:3] and [e[0] for e in passing[0]].count("Exchange") == 6


def test_pass_over_moves_the_stream_as_feed_does_and_only_inside_a_frame_read_by_its_head():
    def stream(forwarding=False):
        return FrameStream(lambda first, size: (KEEP_HEAD if size > 1000 else KEEP_WHOLE, size), 1 << 30, 1 << 20,
                           head_bytes=16, forwarding=forwarding)

    big, small = (5000).to_bytes(4, "big") + bytes(range(250)) * 20, (8).to_bytes(4, "big") + b"abcdefgh"
    fed, passed = stream(), stream()
    assert not passed.pass_over(1)  # nothing under way
    for s in (fed, passed):
        _, frames = s.feed(big[:1000])
        assert [(f[0], f[1], f[3]) for f in frames] == [(0, 5000, False)]
    assert not passed.pass_over(5000)  # more than the frame's rest: nothing done
    fed.feed(big[1000:3000])
    assert passed.pass_over(2000)
    for s in (fed, passed):  # the rest of the frame, then a frame after it: at the same offset
        _, frames = s.feed(big[3000:] + small)
        assert [(f[0], f[1], f[2]) for f in frames] == [(5004, 8, b"abcdefgh")]
    assert fed.in_progress is passed.in_progress is None

    forwarding = stream(forwarding=True)  # its caller sends what feed says: never passed over
    forwarding.feed(big[:1000])
    assert not forwarding.pass_over(10)
