"""The inspection queue's batch in C (kinspect.proxy._batch) against the Python loop it stands in for.

Two apps (on a running loop, as relays need), one whose queue inspects its batches in C and one
whose queue runs InspectionQueue.flush's Python loop (Relay.inspect, Dispatcher.dispatch), are
fed the same reads: every recorded
conversation cut into reads of many sizes (frames whole and in pieces, large requests kept in
pieces), a session that raises, observers that raise, observers added between batches, an
interrupt; the events, the bytes forwarded, the failures counted, what was logged and the
/metrics text must be the same. Then a leak test.
"""

from __future__ import annotations

import itertools
import logging
import random
from typing import NamedTuple

import pytest
from prometheus_client import generate_latest

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.proxy.relay import Relay, native_inspect_reads
from kinspect.session import ConnectionInfo, Exchange, Problem, Request, Response, Session
from tests.support.event_log import EventLog
from tests.support.relay_stubs import (CONVERSATIONS, RecordingTransport, conversation, event_fact, longest, play,
                                       traffic_lines)
from tests.support.native import bytes_grown, native_module
from tests.support.proxy_harness import stream_frames

_batch, _MISSING = native_module("kinspect.proxy._batch")


@pytest.fixture(autouse=True)
def built():
    if _batch is None:
        pytest.fail(_MISSING)
    assert native_inspect_reads() is _batch.inspect_reads


class Outcome(NamedTuple):
    """What one harness's run left: what observers saw and counted, what went on, what /metrics says."""

    facts: list  # every event, as tests.support.relay_stubs.event_fact
    sent: list  # per relay: (bytes written to the broker, bytes written to the client)
    inspection_failures: int  # the server's count (sessions that raised, the sessions' own failures)
    observer_failures: int  # the dispatcher's count
    framed: list  # per relay: (client_framed, broker_framed)
    metrics: list  # the /metrics lines of the traffic
    late_events: int | None  # what an observer added part way saw


class _Harness:
    """One app (metrics on, an event log) whose queue inspects in C or in Python, and its relays."""

    def __init__(self, native: bool, max_reads: int = 5) -> None:
        config = load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": 3_600_000,
                                    "metrics.topic_bytes": True})
        self.log = EventLog()
        self.app = build_app(config, extra_observers=[self.log])
        self.server = self.app.server
        self.queue = self.server.inspection_queue
        self.queue.max_reads = max_reads  # batches end mid-conversation, at every kind of read
        if not native:
            self.queue._inspect_reads = None  # the reference: InspectionQueue.flush's Python loop
        assert (self.queue._inspect_reads is not None) == native
        self.clock = itertools.count(1)
        self.relays: list[Relay] = []
        self.late: EventLog | None = None  # an observer added part way

    def relay(self, native_session: bool = True) -> Relay:
        number = len(self.relays) + 1
        session = Session(self.server.codec, ConnectionInfo(number, "c:1", "b:1"), self.server.session_config,
                          self.server.plan, native=native_session)
        relay = Relay(self.server, session, self.server.dispatcher, [])
        relay.client.transport, relay.broker.transport = RecordingTransport(), RecordingTransport()
        relay._early, relay._clock = None, lambda: float(next(self.clock))
        self.relays.append(relay)
        return relay

    def outcome(self) -> Outcome:
        metrics = traffic_lines(generate_latest(self.app.metrics.registry).decode())
        return Outcome([event_fact(e) for e in self.log.events],
                       [(r.broker.transport.sent, r.client.transport.sent) for r in self.relays],
                       self.server.inspection_failures, self.server.dispatcher.failures,
                       [(r.session.client_framed, r.session.broker_framed) for r in self.relays], metrics,
                       len(self.late.events) if self.late is not None else None)


def _feed(harness: _Harness, how: str) -> None:
    """Every recorded conversation, each on its own relay (the same reads for both harnesses)."""
    rng = random.Random(how)
    for path in CONVERSATIONS:
        relay = harness.relay()
        play(relay, *conversation(path), how, rng)
        relay.close()  # a connection's end inspects what of it was waiting
    harness.queue.flush()


def _both(run) -> tuple[Outcome, Outcome]:
    outcomes = []
    for native in (True, False):
        harness = _Harness(native)
        run(harness)
        outcomes.append(harness.outcome())
    return tuple(outcomes)


@pytest.mark.parametrize("how", ["streams", "frames", "300", "17"])
async def test_recorded_conversations_give_the_same_events_bytes_and_metrics(how):
    native, python = _both(lambda h: _feed(h, how))
    assert len(native.facts) > 700 and sum(1 for f in native.facts if f[0] == "Exchange") > 200
    if how in ("300", "17"):  # frames spread over reads: large requests were kept in pieces, then released
        assert any(f[0] == "Request" and f[6] > 300 for f in native.facts)  # f[6]: the size
    assert native == python


class _Failing:
    """An observer that raises on the Nth event it sees (Exception, or what `error` makes)."""

    event_types = (Request, Response, Exchange, Problem)
    needs_bodies = False

    def __init__(self, every: int, error=ValueError) -> None:
        self.every, self.error, self.seen = every, error, 0

    def on_event(self, event) -> None:
        self.seen += 1
        if self.seen % self.every == 0:
            raise self.error(f"event {self.seen}")


async def test_observers_that_raise_are_counted_and_logged_alike(caplog):
    def run(harness: _Harness) -> None:
        harness.server.dispatcher.observers.append(_Failing(3))
        _feed(harness, "200")

    with caplog.at_level(logging.ERROR, logger="kinspect.proxy"):
        native, python = _both(run)
    assert native == python and native.observer_failures > 10
    logged = [r for r in caplog.records if "failed on" in r.getMessage()]
    assert len(logged) == 20  # the first ten of each run
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in logged)  # with the exception handled
    assert [str(r.exc_info[1]) for r in logged[:10]] == [str(r.exc_info[1]) for r in logged[10:]]


class _BrokenSession:
    """A session method that raises on its second call."""

    def __init__(self, method) -> None:
        self.method, self.calls = method, 0

    def __call__(self, data, now):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("a bug in the session")
        return self.method(data, now)


@pytest.mark.parametrize("direction", ["client", "broker"])
async def test_a_session_that_raises_stops_that_direction_alike(direction, caplog):
    """The reads of that direction queued after the failing one, in the same batch, are not inspected."""
    def run(harness: _Harness) -> None:
        harness.queue.max_reads = 1000  # every read in one batch
        relay = harness.relay()
        name = f"{direction}_data"
        setattr(relay.session, name, _BrokenSession(getattr(relay.session, name)))
        play(relay, *longest(), "frames", random.Random(7))
        harness.queue.flush()

    with caplog.at_level(logging.ERROR, logger="kinspect.proxy"):
        native, python = _both(run)
    assert native == python
    assert native.inspection_failures == 1 and native.framed == [(direction != "client", direction != "broker")]
    kinds = [f[0] for f in native.facts]
    assert kinds.count("Request") == (1 if direction == "client" else 14)
    assert kinds.count("Response") == 1  # the first exchange, before the failing read
    logged = [r for r in caplog.records if "the session failed" in r.getMessage()]
    assert len(logged) == 2 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in logged)


async def test_failures_the_session_counts_reach_the_server_alike():
    """An inspection failure the session catches itself (session.failures) is counted by the server."""
    def run(harness: _Harness) -> None:
        for _ in range(3):
            relay = harness.relay(native_session=False)  # every request through _inspect_request
            inspect_request, calls = relay.session._inspect_request, []

            def failing(*args, inspect_request=inspect_request, calls=calls):
                calls.append(1)
                if len(calls) % 4 == 0:
                    raise RuntimeError("a bug in a request's inspection")
                return inspect_request(*args)

            relay.session._inspect_request = failing
            play(relay, *longest(), "frames", random.Random(7))
        harness.queue.flush()

    native, python = _both(run)
    assert native == python
    assert native.inspection_failures == 3  # the first failure of each session stops its requests' inspection
    assert [f[2] for f in native.facts if f[0] == "Problem"] == ["inspection_failed"] * 3


async def test_a_large_produce_in_pieces_is_released_alike():
    """A Produce request over several reads reaches the observers in pieces and is let go of after them."""
    from kinspect.protocol.codec import Codec
    from tests.support.proxy_harness import produce

    codec = Codec()
    exchanges = []  # made once: a record batch carries the time it was made
    for cid in range(1, 4):
        request = produce(codec, cid, "orders", [bytes([cid]) * 3000 for _ in range(40)], acks=1)
        body = {"Responses": [{"Name": "orders", "PartitionResponses": [
            {"Index": 0, "ErrorCode": 0, "BaseOffset": cid, "LogAppendTimeMs": -1, "LogStartOffset": 0,
             "RecordErrors": [], "ErrorMessage": None}]}], "ThrottleTimeMs": 0}
        frame = codec.encode_response(0, 9, {"CorrelationId": cid}, body)
        exchanges.append((request, len(frame).to_bytes(4, "big") + frame))

    def run(harness: _Harness) -> None:
        relay = harness.relay()
        for request, response in exchanges:
            for at in range(0, len(request), 16384):
                relay.client.data_received(request[at:at + 16384])
            relay.broker.data_received(response)
        harness.queue.flush()

    native, python = _both(run)
    requests = [f for f in native.facts if f[0] == "Request"]
    assert len(requests) == 3 and all(f[6] > 100_000 and f[-1] is None for f in requests)  # released
    assert native == python


async def test_an_interrupt_in_an_observer_propagates_from_both():
    for native in (True, False):
        harness = _Harness(native, max_reads=1000)
        harness.server.dispatcher.observers.append(_Failing(2, KeyboardInterrupt))
        relay = harness.relay()
        for frame in stream_frames(longest()[0])[:20]:
            relay.client.data_received(frame)
        with pytest.raises(KeyboardInterrupt):
            harness.queue.flush()


async def test_observers_added_between_batches_see_the_events_after():
    def run(harness: _Harness) -> None:
        relay = harness.relay()
        requests, responses = longest()
        pairs = list(itertools.zip_longest(stream_frames(requests), stream_frames(responses)))
        late = harness.late = EventLog()
        for i, (q, r) in enumerate(pairs):
            if i == len(pairs) // 2:
                harness.server.dispatcher.observers.append(late)
            if q is not None:
                relay.client.data_received(q)
            if r is not None:
                relay.broker.data_received(r)
        harness.queue.flush()

    native, python = _both(run)
    assert native == python
    assert 0 < native.late_events < len(native.facts)  # the late observer saw the second half only


def test_stand_in_relays_are_asked_to_inspect_themselves():
    seen = []

    class Reader:
        def inspect(self, from_client, data, now):
            seen.append((from_client, data, now))

    _batch.inspect_reads([(Reader(), True, b"a", 1.0), (Reader(), False, b"b", 2.0)])
    assert seen == [(True, b"a", 1.0), (False, b"b", 2.0)]
    with pytest.raises(TypeError, match="a read is"):
        _batch.inspect_reads([(Reader(), True, b"a")])
    with pytest.raises(TypeError, match="a list of reads"):
        _batch.inspect_reads(((Reader(), True, b"a", 1.0),))


async def test_many_batches_leave_no_garbage():
    """What the C batch takes and calls is released (run long enough to show a leak)."""
    harness = _Harness(True, max_reads=16)
    relay = harness.relay()
    requests, responses = longest()

    def rounds():
        for _ in range(5):
            session = Session(harness.server.codec, ConnectionInfo(1, "c:1", "b:1"), harness.server.session_config,
                              harness.server.plan)
            relay.session = session
            relay.client.transport.sent.clear()
            relay.client.data_received(requests)
            relay.broker.data_received(responses)
            harness.queue.flush()
        harness.log.events.clear()

    grown = bytes_grown(rounds, 20)
    assert grown < 64 * 1024, grown
