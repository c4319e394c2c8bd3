"""A relay's small reads in C (kinspect.proxy._forward.Reader) against Relay.client_read/broker_read, the reference.

Two apps (on a running loop, as relays need), one whose relays hand their reads to the C Reader and one
whose relays call the Python methods, are fed the same reads: every recorded conversation cut into
reads of many sizes, with batches bounded by reads and by bytes, transports that close or fail, a
direction whose framing was lost, and the reads the Reader leaves to Python (early bytes, large reads,
bytes-like objects, reads inspected at once). The bytes written, the counts, each batch's reads, the
events and the /metrics text must be the same. Then a leak test.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import NamedTuple

import pytest
from prometheus_client import generate_latest

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.proxy.relay import PASS_MIN_BYTES, Relay, native_reader
from kinspect.session import ConnectionInfo, Session
from tests.support.event_log import EventLog
from tests.support.native import bytes_grown, native_module
from tests.support.proxy_harness import stream_frames
from tests.support.relay_stubs import (CONVERSATIONS, RecordingTransport, conversation, event_fact, longest, play,
                                       traffic_lines)

_forward, _MISSING = native_module("kinspect.proxy._forward")


@pytest.fixture(autouse=True)
def built():
    if _forward is None:
        pytest.fail(_MISSING)


class Outcome(NamedTuple):
    """What one harness's run left."""

    sent: list  # per relay: (bytes written to the broker, bytes written to the client)
    counted: list  # per relay: (client_bytes, broker_bytes)
    batches: list  # each batch inspected: its reads as (relay number, from_client, data, time)
    facts: list  # every event, as tests.support.relay_stubs.event_fact
    metrics: list  # the /metrics lines of the traffic
    timer_started: bool  # whether a batch's first read left a timer pending


class _Closing(RecordingTransport):
    """A transport that is closing once `after` writes were made (then nothing more is written)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def is_closing(self) -> bool:
        return len(self.sent) >= self.after


class _Failing(RecordingTransport):
    """A transport whose write raises (as a transport given something it cannot send does)."""

    def write(self, data) -> None:
        raise TypeError("data argument must be a bytes-like object")


class _Pausable(RecordingTransport):
    """A client transport whose reading can be paused (while the broker connection is not up)."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = 0

    def pause_reading(self) -> None:
        self.paused += 1


class _Harness:
    """One app (metrics on, an event log) whose relays read in C (`native`) or in Python."""

    def __init__(self, native: bool, max_reads: int = 5, max_bytes: int = 4096, delay_ms: int = 3_600_000) -> None:
        config = load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": delay_ms})
        self.native = native
        self.log = EventLog()
        self.app = build_app(config, extra_observers=[self.log])
        self.server = self.app.server
        self.queue = self.server.inspection_queue
        self.batches: list = []
        if self.queue is not None:
            self.queue.max_reads, self.queue.max_bytes = max_reads, max_bytes
            inspect_reads = self.queue._inspect_reads

            def recorded(reads, inspect_reads=inspect_reads):
                self.batches.append([(self.relays.index(r) + 1, c, bytes(d), t) for r, c, d, t in reads])
                inspect_reads(reads)

            self.queue._inspect_reads = recorded
        self.clock = itertools.count(1)
        self.relays: list[Relay] = []

    def relay(self, client_transport=None, broker_transport=None) -> Relay:
        number = len(self.relays) + 1
        session = Session(self.server.codec, ConnectionInfo(number, "c:1", "b:1"), self.server.session_config,
                          self.server.plan)
        relay = Relay(self.server, session, self.server.dispatcher, [], native=self.native)
        assert (type(relay.client.data_received) is _forward.Reader) == self.native
        relay.client.transport = client_transport or RecordingTransport()
        relay.broker.transport = broker_transport or RecordingTransport()
        relay._early, relay._clock = None, lambda: float(next(self.clock))
        self.relays.append(relay)
        return relay

    def outcome(self) -> Outcome:
        timer = self.queue is not None and self.queue._handle is not None
        if self.queue is not None:
            self.queue.flush()
        metrics = traffic_lines(generate_latest(self.app.metrics.registry).decode())
        return Outcome([(getattr(r.broker.transport, "sent", None), getattr(r.client.transport, "sent", None))
                        for r in self.relays],
                       [(r.client_bytes, r.broker_bytes) for r in self.relays], self.batches,
                       [event_fact(e) for e in self.log.events], metrics, timer)


def _both(run, **harness) -> tuple[Outcome, Outcome]:
    outcomes = []
    for native in (True, False):
        h = _Harness(native, **harness)
        run(h)
        outcomes.append(h.outcome())
    return tuple(outcomes)


@pytest.mark.parametrize("how", ["streams", "frames", "300", "17"])
async def test_recorded_conversations_give_the_same_writes_batches_and_events(how):
    def run(h: _Harness) -> None:
        rng = random.Random(how)
        for path in CONVERSATIONS:
            play(h.relay(), *conversation(path), how, rng)

    native, python = _both(run)
    assert len(native.facts) > 700 and len(native.batches) > (10 if how == "streams" else 100)
    assert any(len(b) == 5 for b in native.batches)  # batches ended by their count
    if how in ("streams", "frames"):  # large reads
        assert any(len(b) < 5 for b in native.batches[:-1])  # and by their bytes
    assert native == python


async def test_a_batch_s_first_read_starts_its_timer_and_a_full_one_is_inspected():
    def run(h: _Harness) -> None:
        relay = h.relay()
        frames = stream_frames(longest()[0])
        assert len(frames) > 5
        relay.client.data_received(frames[0])
        assert h.queue._handle is not None and len(h.queue) == 1  # the timer of the batch, started once
        handle = h.queue._handle
        for frame in frames[1:4]:
            relay.client.data_received(frame)
        assert h.queue._handle is handle and h.batches == []
        relay.client.data_received(frames[4])  # the fifth read fills the batch
        assert len(h.queue) == 0 and len(h.batches) == 1

    native, python = _both(run)
    assert native == python and native.timer_started


async def test_closing_and_missing_transports_are_not_written_to_and_the_reads_still_inspected():
    requests, responses = conversation(CONVERSATIONS[-1])

    def run(h: _Harness) -> None:
        play(h.relay(broker_transport=_Closing(2)), requests, responses, "frames", random.Random(1))
        relay = h.relay()
        relay.client.transport = relay.broker.transport = None
        play(relay, requests, responses, "frames", random.Random(1))

    native, python = _both(run)
    assert len(native.sent[0][0]) == 2 and native.sent[1] == (None, None)
    assert native.counted[0] == native.counted[1] == (len(requests), len(responses))
    assert sum(len(b) for b in native.batches) == 2 * len(stream_frames(requests) + stream_frames(responses))
    assert native == python


async def test_a_direction_whose_framing_was_lost_is_forwarded_and_counted_but_not_queued():
    requests, responses = conversation(CONVERSATIONS[-1])

    def run(h: _Harness) -> None:
        relay = h.relay()
        relay.session.client_framed = False
        play(relay, requests, responses, "frames", random.Random(1))

    native, python = _both(run)
    assert b"".join(native.sent[0][0]) == requests and native.counted[0] == (len(requests), len(responses))
    assert all(not from_client for batch in native.batches for _, from_client, _, _ in batch)
    assert native == python


async def test_reads_left_to_python_are_alike():
    """Early bytes, a large read, bytes-like reads: the Reader calls the Python method for them."""
    requests, responses = conversation(CONVERSATIONS[-1])
    large = bytes(PASS_MIN_BYTES + 10)

    def run(h: _Harness) -> None:
        relay = h.relay(client_transport=_Pausable())
        relay._early = []  # no broker yet: held
        relay.client.data_received(requests[:10])
        relay._early = None
        relay.client.data_received(bytearray(requests[10:20]))
        relay.client.data_received(memoryview(requests[20:]))
        relay.broker.data_received(responses)
        relay.broker.data_received(large)  # not a frame: the broker direction loses its framing
        assert relay.client.transport.paused == 1 and relay._early_bytes == 10

    native, python = _both(run)
    assert native.counted[0] == (len(requests), len(responses) + len(large))
    assert b"".join(native.sent[0][0]) == requests[10:]  # the early bytes were held, not written
    assert native == python


async def test_reads_inspected_at_once_are_alike():
    """With no queue (inspect.batch_delay_ms = 0) each read is inspected as it comes."""
    def run(h: _Harness) -> None:
        for path in CONVERSATIONS[:20]:
            play(h.relay(), *conversation(path), "300", random.Random(path.name))

    native, python = _both(run, delay_ms=0)
    assert native.batches == [] and len(native.facts) > 50
    assert native == python


async def test_a_write_that_raises_raises_from_both_after_the_count():
    for native in (True, False):
        h = _Harness(native)
        relay = h.relay(broker_transport=_Failing())
        with pytest.raises(TypeError, match="bytes-like"):
            relay.client.data_received(b"abc")
        assert relay.client_bytes == 3 and len(h.queue) == 0


def test_a_stand_in_relay_is_called_for_its_reads():
    seen = []

    class StandIn:
        def client_read(self, data):
            seen.append(("client", data))

        def broker_read(self, data):
            seen.append(("broker", data))

    stand_in = StandIn()
    _forward.Reader(stand_in, True)(b"a")
    _forward.Reader(stand_in, False)(b"b")
    assert seen == [("client", b"a"), ("broker", b"b")]
    reader = _forward.Reader(stand_in, True)
    assert reader.relay is stand_in and reader.from_client is True
    with pytest.raises(TypeError, match="one read"):
        reader(b"a", b"b")
    with pytest.raises(TypeError, match="one read"):
        reader(data=b"a")


async def test_the_sides_read_in_c_unless_told_not_to():
    h = _Harness(True)
    relay = h.relay()
    assert type(relay.client.data_received) is _forward.Reader and relay.client.data_received.from_client
    assert type(relay.broker.data_received) is _forward.Reader and not relay.broker.data_received.from_client
    python = _Harness(False).relay()
    assert python.client.data_received == python.client_read and python.broker.data_received == python.broker_read
    assert native_reader(relay, True).relay is relay


async def test_many_reads_leave_no_garbage():
    """What the Reader takes, makes and calls is released (run long enough to show a leak)."""
    h = _Harness(True, max_reads=16)
    h.queue._inspect_reads = None  # the Python batch loop; the reads are what is measured
    relay = h.relay()
    requests, responses = conversation(CONVERSATIONS[-1])
    frames = list(itertools.zip_longest(stream_frames(requests), stream_frames(responses)))

    def rounds():
        for _ in range(20):
            relay.session = Session(h.server.codec, ConnectionInfo(1, "c:1", "b:1"), h.server.session_config,
                                    h.server.plan)
            relay.client.transport.sent.clear()
            relay.broker.transport.sent.clear()
            for q, r in frames:
                if q is not None:
                    relay.client.data_received(q)
                if r is not None:
                    relay.broker.data_received(r)
            h.queue.flush()
        h.log.events.clear()

    grown = bytes_grown(rounds, 20)
    assert grown < 64 * 1024, grown


async def test_a_batch_is_inspected_when_its_bytes_reach_the_bound_exactly():
    frames = stream_frames(longest()[0])

    def run(h: _Harness) -> None:
        relay = h.relay()
        h.queue.max_reads, h.queue.max_bytes = 1000, len(frames[0]) + len(frames[1])
        relay.client.data_received(frames[0])
        assert h.batches == []
        relay.client.data_received(frames[1])  # exactly max_bytes queued: inspected at once
        assert [len(b) for b in h.batches] == [2] and len(h.queue) == 0

    native, python = _both(run)
    assert native == python


async def test_a_read_is_timed_on_the_relays_own_clock_when_the_c_reads_it():
    """With time.monotonic as its clock (every relay's but a test's), the C reader reads the clock itself: each
    queued read's time lies between time.monotonic() before and after it, as the Python's does."""
    for native in (True, False):
        h = _Harness(native, max_reads=1000)
        relay = h.relay()
        relay._clock = time.monotonic
        times = []
        for frame in stream_frames(conversation(CONVERSATIONS[0])[0])[:20]:
            before = time.monotonic()
            relay.client.data_received(frame)
            times.append((before, h.queue._reads[-1][3], time.monotonic()))
        assert all(before <= read <= after for before, read, after in times), (native, times)
        assert all(type(read) is float for _, read, _ in times)
        h.queue.flush()
