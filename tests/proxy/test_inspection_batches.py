"""Reads inspected in batches (inspect.batch_delay_ms) give what reads inspected at once give, and no later
than a scrape, a connection's end or the batch's bounds.

The queue alone with stand-in relays (order, bounds, the timer); relays fed every recorded
conversation through a queue and without one (the same events and the same /metrics text);
a connection's end; and `kinspect proxy` with a ten-minute batch delay, whose /metrics and
/clients still count a real producer's requests at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.proxy.inspection_queue import InspectionQueue
from kinspect.proxy.relay import Relay
from kinspect.proxy.server import ProxyServer
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Session
from kinspect.session.replay import frame_ends
from tests.support.event_log import EventLog
from tests.support.relay_stubs import RecordingTransport, event_fact, traffic_lines
from tests.support.paths import TRAFFIC
from tests.support.proxy_harness import ProxyHarness, api_versions, poll_until, recv_frame
from tests.support.tansu import TansuBroker, free_port


class _Reader:
    """A stand-in relay: notes what it is asked to inspect."""

    def __init__(self, name: str, seen: list) -> None:
        self.name, self.seen = name, seen

    def inspect(self, from_client: bool, data, now: float) -> None:
        self.seen.append((self.name, from_client, data, now))


def test_the_queue_keeps_the_order_of_reads_and_flushes_at_its_bounds():
    async def scenario():
        seen: list = []
        a, b = _Reader("a", seen), _Reader("b", seen)
        queue = InspectionQueue(3600.0, max_reads=4, max_bytes=100)
        queue.add(a, True, b"1", 1.0)
        queue.add(b, False, b"2", 2.0)
        queue.add(a, False, b"3", 3.0)
        assert seen == [] and len(queue) == 3
        queue.add(b, True, b"4", 4.0)  # the fourth read: the batch is inspected at once, in order
        assert seen == [("a", True, b"1", 1.0), ("b", False, b"2", 2.0), ("a", False, b"3", 3.0),
                        ("b", True, b"4", 4.0)] and len(queue) == 0
        queue.add(a, True, b"x" * 99, 5.0)
        assert len(seen) == 4
        queue.add(a, True, b"y", 6.0)  # 100 bytes queued: inspected at once
        assert [r[2] for r in seen[4:]] == [b"x" * 99, b"y"]
        queue.add(b, True, b"z", 7.0)
        queue.flush()  # what a scrape or a connection's end does
        assert seen[-1] == ("b", True, b"z", 7.0) and len(queue) == 0
        queue.flush()  # nothing waiting: nothing happens
        assert len(seen) == 7

    asyncio.run(scenario())


def test_the_queue_inspects_a_lone_read_after_its_delay():
    async def scenario():
        seen: list = []
        queue = InspectionQueue(0.005)
        queue.add(_Reader("a", seen), True, b"1", 1.0)
        assert seen == []
        started = time.monotonic()
        while not seen:
            assert time.monotonic() - started < 5, "the timer never fired"
            await asyncio.sleep(0.001)
        assert seen == [("a", True, b"1", 1.0)]
        queue.add(_Reader("b", seen), True, b"2", 2.0)
        queue.flush()  # inspected now; the timer, when it fires, finds nothing to inspect twice
        assert [r[0] for r in seen] == ["a", "b"]
        started = time.monotonic()
        while queue._handle is not None:  # until the timer has fired
            assert time.monotonic() - started < 5, "the timer never fired"
            await asyncio.sleep(0.001)
        assert [r[0] for r in seen] == ["a", "b"]

    asyncio.run(scenario())


def test_a_timer_of_a_batch_flushed_since_waits_on_for_the_reads_queued_after():
    """A batch flushed when full leaves its timer pending. When it fires, the reads queued since have waited
    less than the delay: under half of it, they wait on for the rest; past half, they are inspected."""
    async def scenario():
        seen: list = []
        loop = asyncio.get_running_loop()
        queue = InspectionQueue(10.0, max_reads=2)
        queue.add(_Reader("a", seen), True, b"1", 1.0)  # the batch's timer: 10 s from now
        stale = queue._handle
        queue.add(_Reader("a", seen), True, b"2", 2.0)  # full: inspected at once, the timer left pending
        queue.add(_Reader("b", seen), True, b"3", 3.0)
        assert len(seen) == 2 and queue._handle is stale
        stale.cancel()
        queue._due()  # that timer fires now (its callback), 10 s early for read 3
        assert len(seen) == 2, "a read that waited under half the delay was inspected by another batch's timer"
        rest = queue._handle
        assert rest is not stale and not rest.cancelled() and 9.0 <= rest.when() - loop.time() <= 10.5
        rest.cancel()
        queue._flushed_at -= 6.0  # as if read 3 had waited 6 s of the 10
        queue._due()
        assert [r[2] for r in seen] == [b"1", b"2", b"3"] and queue._handle is None and len(queue) == 0

    asyncio.run(scenario())


async def _replay(batch_delay_ms: float, conversations: list[tuple[bytes, bytes]]) -> tuple[list, list, str]:
    """Every conversation through its own relay of one app, frame by frame, each request's reads then its
    response's; the events, the bytes forwarded and the /metrics text once every connection has ended."""
    config = load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": batch_delay_ms,
                                "metrics.topic_bytes": True})
    log = EventLog()
    app = build_app(config, extra_observers=[log])
    server = app.server
    if batch_delay_ms:
        server.inspection_queue.max_reads = 7  # batches end mid-conversation, at every kind of read
    clock = itertools.count(1)  # the same read times in both runs
    forwarded = []
    for number, (requests, responses) in enumerate(conversations, 1):
        session = Session(server.codec, ConnectionInfo(number, "c:1", "b:1"), server.session_config, server.plan)
        relay = Relay(server, session, server.dispatcher, [])
        relay.client.transport, relay.broker.transport = RecordingTransport(), RecordingTransport()
        relay._early, relay._clock = None, lambda: float(next(clock))
        request_ends, response_ends = frame_ends(requests), frame_ends(responses)
        start_q = start_r = 0
        for end_q, end_r in itertools.zip_longest(request_ends, response_ends, fillvalue=None):
            if end_q is not None:
                relay.client.data_received(requests[start_q:end_q])
                start_q = end_q
            if end_r is not None:
                relay.broker.data_received(responses[start_r:end_r])
                start_r = end_r
        relay.close()  # a connection's end inspects what of it was waiting
        assert server.inspection_queue is None or len(server.inspection_queue) == 0
        forwarded.append((relay.broker.transport.sent, relay.client.transport.sent))
    facts = [event_fact(e) for e in log.events]
    metrics = generate_latest(app.metrics.registry).decode()
    return facts, forwarded, metrics


def test_batched_inspection_gives_the_same_events_and_metrics_as_inspection_at_once():
    conversations = [(path.read_bytes(), path.with_name(path.name.replace("requests", "responses")).read_bytes())
                     for path in sorted(TRAFFIC.glob("*/*.requests.bin"))]
    assert len(conversations) >= 60
    at_once = asyncio.run(_replay(0, conversations))
    batched = asyncio.run(_replay(3_600_000, conversations))
    requests_sent = sum(len(list(frame_ends(requests))) for requests, _ in conversations)
    assert [f[0] for f in at_once[0]].count("Request") == requests_sent > 200
    assert batched[0] == at_once[0]
    assert batched[1] == at_once[1]
    requests = [line for line in at_once[2].splitlines() if line.startswith("kinspect_requests_total{")]
    assert len(requests) > 20
    kept = [traffic_lines(text) for text in (at_once[2], batched[2])]
    assert len(kept[0]) > 100
    assert kept[0] == kept[1]


def test_the_inspection_cpu_time_counts_batches_only():
    conversations = [(path.read_bytes(), path.with_name(path.name.replace("requests", "responses")).read_bytes())
                     for path in sorted(TRAFFIC.glob("*/*.requests.bin"))]

    def cpu(text: str) -> float:
        [value] = [float(line.split()[1]) for line in text.splitlines()
                   if line.startswith("kinspect_inspection_cpu_seconds_total ")]
        return value

    assert cpu(asyncio.run(_replay(0, conversations))[2]) == 0.0  # inspected at once: not counted
    assert 0.0 < cpu(asyncio.run(_replay(3_600_000, conversations))[2]) < 60.0


def test_rewrite_mode_and_a_zero_delay_inspect_at_once_and_a_negative_delay_is_refused():
    codec = Codec()
    passthrough = load_config(None, {"proxy.upstream": "127.0.0.1:1"})
    assert ProxyServer(passthrough, codec).inspection_queue.delay == pytest.approx(0.1)
    assert ProxyServer(load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": 0}),
                       codec).inspection_queue is None
    rewrite = load_config(None, {"proxy.mode": "rewrite", "proxy.bootstrap_servers": ["127.0.0.1:1"],
                                 "proxy.node_port_base": 30000})
    assert ProxyServer(rewrite, codec).inspection_queue is None
    with pytest.raises(ValueError, match="inspect.batch_delay_ms must be 0 or more"):
        ProxyServer(load_config(None, {"proxy.upstream": "127.0.0.1:1", "inspect.batch_delay_ms": -1.0}), codec)


@pytest.mark.integration
def test_a_connection_end_inspects_its_waiting_reads():
    """With a ten-minute delay, a client's exchange is inspected when its connection ends, not before."""
    codec = Codec()
    with TansuBroker() as tansu, ProxyHarness({"proxy.upstream": tansu.bootstrap,
                                               "inspect.batch_delay_ms": 600_000}, codec) as proxy:
        queue, log = proxy.server.inspection_queue, proxy.events

        async def peek():  # the state as it is, without the settling that proxy.run does
            return len(queue), [type(e).__name__ for e in log.events]

        with socket.create_connection(("127.0.0.1", proxy.server.bootstrap_port), timeout=10) as sock:
            sock.sendall(api_versions(codec, 7))
            assert int.from_bytes(recv_frame(sock)[:4], "big") == 7  # forwarded at once, not held
            waiting, seen = proxy.call(peek())
            assert waiting == 2 and seen == []  # the request and the response wait for their batch
        poll_until(lambda: proxy.call(peek())[0] == 0, 10)
        assert proxy.call(peek())[1] == ["Request", "Response", "Exchange"]


@pytest.mark.integration
def test_a_scrape_counts_every_request_forwarded_before_it(tmp_path: Path):
    """`kinspect proxy` with a ten-minute batch delay: /metrics and /clients, scraped right after a producer
    is done, count its records and requests."""
    from confluent_kafka import Producer

    port, metrics_port = free_port(), free_port()
    with TansuBroker(advertised_port=port) as tansu:  # the producer is sent back to kinspect's port
        config = tmp_path / "kinspect.toml"
        config.write_text(f'[proxy]\nlisten = "127.0.0.1:{port}"\nupstream = "{tansu.bootstrap}"\n'
                          f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n[inspect]\nbatch_delay_ms = 600000.0\n')
        proc = subprocess.Popen([sys.executable, "-m", "kinspect.cli.main", "proxy", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            line = proc.stdout.readline().decode()
            assert f"proxy listening on 127.0.0.1:{port}" in line, line
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "batched", "linger.ms": 0})
            for i in range(25):
                producer.produce("batched.topic", f"value {i}".encode())
                producer.flush(30)  # one Produce request each
            assert producer.flush(30) == 0
            base = f"http://127.0.0.1:{metrics_port}"
            text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
            samples = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
                       for s in family.samples]
            produced = sum(v for name, labels, v in samples if name == "kinspect_produced_records_total")
            produce_requests = sum(v for name, labels, v in samples
                                   if name == "kinspect_requests_total" and labels["api"] == "Produce")
            assert produced == 25 and produce_requests >= 25
            clients = json.loads(urllib.request.urlopen(f"{base}/clients", timeout=10).read())
            mine = [c for c in clients["clients"] if "batched" in c["client_ids"]]
            assert mine and sum(r["count"] for c in mine for r in c["requests"] if r["api_key"] == 0) >= 25
        finally:
            proc.terminate()
            assert proc.wait(timeout=20) == 0
            proc.stdout.close()
