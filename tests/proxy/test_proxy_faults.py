"""kinspect's proxy when things go wrong: a broker killed mid-stream, a client gone mid-frame,
a slow reader, 500 connections at once, an unreachable broker, and a graceful shutdown.

The proxy runs in-process (tests/support/proxy_harness.py) in rewrite mode in front of a real
Tansu broker whose own advertised address is unusable; raw sockets play the clients where a
test needs to control exactly what is on the wire (an in-flight request, half a frame).
Leaks are looked for in the proxy's loop (tasks), in this process's TCP sockets (kinspect's
accepted and upstream connections, found through /proc/self/net/tcp) and in its open file
descriptors.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import threading
import time

import pytest

from kinspect.protocol.codec import Codec
from kinspect.proxy.receiving import READ_BUFFER_BYTES
from kinspect.proxy.relay import WRITE_BUFFER_HIGH
from kinspect.session import Exchange, Problem
from tests.support.proxy_harness import (
    poll_until,
    CLIENT_HOST, TANSU_NODE_ID, ProxyHarness, RewriteRig, api_versions, correlation_id, create_topic, fetch,
    kinspect_sockets, metadata, open_fds, produce, record_batch, recv_frame, request_frame, rss_bytes, wait_closed,
)
from tests.support.tansu import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def rig(tmp_path):
    """Tansu advertising 127.0.0.2 (unusable) and kinspect in rewrite mode on 127.0.0.1, no relays."""
    gc.collect()  # clients of earlier tests release their descriptors now, not during a leak check
    with RewriteRig(tmp_path, record=False) as r:
        yield r


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection((CLIENT_HOST, port), timeout=timeout)


def call(sock: socket.socket, codec: Codec, frame: bytes, api_key: int, version: int):
    sock.sendall(frame)
    response = recv_frame(sock)
    assert correlation_id(response) == struct.unpack_from(">i", frame, 8)[0]  # after size, api key, version
    return codec.decode_response(response, api_key, version)


def prepare(rig: RewriteRig, codec: Codec, topic: str | None = None, records: list[bytes] | None = None):
    """A first exchange through kinspect (so its node listener exists), a topic, some records.

    Returns the topic's id."""
    with connect(rig.proxy.server.bootstrap_port) as sock:
        assert call(sock, codec, api_versions(codec, 1), 18, 3).body["ErrorCode"] == 0
        md = call(sock, codec, metadata(codec, 2), 3, 12).body
        assert [(b["NodeId"], b["Host"], b["Port"]) for b in md["Brokers"]] == [
            (TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]
        if topic is not None:
            assert call(sock, codec, create_topic(codec, 3, topic), 19, 4).body["Topics"][0]["ErrorCode"] == 0
        if records:
            for i in range(0, len(records), 50):
                body = call(sock, codec, produce(codec, 10 + i, topic, records[i:i + 50]), 0, 9).body
                assert body["Responses"][0]["PartitionResponses"][0]["ErrorCode"] == 0
        topic_id = None
        if topic is not None:
            topic_id = call(sock, codec, metadata(codec, 4, [topic]), 3, 12).body["Topics"][0]["TopicId"]
    rig.proxy.wait_idle()
    return topic_id


def kinspect_conns(rig: RewriteRig) -> list:
    listen = {(CLIENT_HOST, port) for port in rig.proxy.listener_ports()}
    return kinspect_sockets(listen, {("127.0.0.1", rig.tansu.port)})


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the peer sends until it closes the connection (a reset counts as a close)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def assert_no_leaks(rig: RewriteRig, fds: int) -> None:
    """No client connection left in kinspect, no task, no socket of kinspect's, no extra descriptor.

    ``fds`` is this process's descriptor count taken with the proxy idle before the test's clients.
    """
    rig.proxy.wait_idle(5)
    assert rig.proxy.kinspect_tasks() == []
    poll_until(lambda: not kinspect_conns(rig), 5)
    poll_until(lambda: open_fds() <= fds, 5)


# ----------------------------------------------------------------------------- broker killed


def test_broker_killed_mid_stream(rig: RewriteRig, codec: Codec):
    """SIGKILL Tansu while clients consume (long-poll Fetches in flight) and produce through kinspect:
    every client socket sees the close within a second; kinspect keeps nothing behind."""
    prepare(rig, codec, "kill.topic", [b"v%d" % i for i in range(10)])
    # The producer writes elsewhere: records at kill.topic's offset 10 could let the broker answer a Fetch
    # before it dies (CI saw 4 unanswered of 5 twice).
    prepare(rig, codec, "kill.produced")
    fds = open_fds()

    consumers = []
    for i in range(5):
        sock = connect(rig.node_port if i % 2 else rig.proxy.server.bootstrap_port)
        call(sock, codec, api_versions(codec, 1), 18, 3)
        sock.sendall(fetch(codec, 2, "kill.topic", offset=10, max_wait_ms=20000))  # held by the broker
        consumers.append(sock)
    # All five Fetches are in kinspect before the producer starts: its own request in flight must not
    # stand in for a Fetch still in a socket buffer when the broker dies.
    rig.proxy.wait_until(lambda: rig.proxy.server.inflight() == 5)

    # A producer streaming Produce requests (acks=1) and reading the answers, until the connection dies.
    producer = connect(rig.node_port)
    call(producer, codec, api_versions(codec, 1), 18, 3)
    produced = {"ok": 0, "closed_at": None}
    stop = threading.Event()

    def stream() -> None:
        n = 100
        try:
            while not stop.is_set():
                n += 1
                producer.sendall(produce(codec, n, "kill.produced", [b"x" * 2000] * 20, acks=1))
                recv_frame(producer)
                produced["ok"] += 1
        except (EOFError, OSError):
            produced["closed_at"] = time.monotonic()

    streamer = threading.Thread(target=stream, name="raw-producer", daemon=True)
    streamer.start()
    poll_until(lambda: produced["ok"] >= 20)
    assert len(kinspect_conns(rig)) == 2 * 6  # six client connections, each with its broker connection

    rig.tansu._proc.kill()  # SIGKILL: no goodbye from the broker
    killed = time.monotonic()
    for sock in consumers:
        wait_closed(sock, 1.0)
        assert time.monotonic() - killed < 1.0
    streamer.join(2)
    assert produced["closed_at"] is not None and produced["closed_at"] - killed < 1.0, produced
    stop.set()
    for sock in [*consumers, producer]:
        sock.close()

    assert_no_leaks(rig, fds)
    # The inspector reports the Fetches the broker never answered (the message says which connection lacks one).
    def unanswered() -> list:
        return [p for p in rig.proxy.events_of(Problem) if p.kind == "unanswered" and p.api_key == 1]

    deadline = time.monotonic() + 2
    while len(unanswered()) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    problems = [(p.connection.id, p.connection.client_address, p.kind, p.api_key, p.detail)
                for p in rig.proxy.events_of(Problem)]
    assert len(unanswered()) == 5, (sorted({p.connection.id for p in unanswered()}), problems)
    # New clients are closed at once while the broker is down, and kinspect keeps serving.
    with connect(rig.proxy.server.bootstrap_port) as sock:
        sock.sendall(api_versions(codec, 1))
        assert wait_closed(sock, 1.0) < 1.0
    assert_no_leaks(rig, fds)


def test_broker_killed_under_a_real_consumer(rig: RewriteRig, codec: Codec):
    """A kafka-python consumer polling through kinspect when Tansu dies: it notices, kinspect cleans up."""
    from kafka import KafkaConsumer, TopicPartition

    prepare(rig, codec, "kill.real", [b"r%d" % i for i in range(30)])
    fds = open_fds()
    consumer = KafkaConsumer(bootstrap_servers=f"{CLIENT_HOST}:{rig.proxy.server.bootstrap_port}",
                             auto_offset_reset="earliest", fetch_max_wait_ms=5000, reconnect_backoff_ms=200)
    try:
        consumer.assign([TopicPartition("kill.real", 0)])
        got = []
        poll_until(lambda: got.extend(r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs)
                 or len(got) >= 30, 20)
        assert got == [b"r%d" % i for i in range(30)]
        consumer.poll(timeout_ms=300)  # a long-poll Fetch is now waiting in the broker
        node_conns = [s for s in kinspect_conns(rig) if s[0] == (CLIENT_HOST, rig.node_port)]
        assert node_conns
        rig.tansu._proc.kill()
        killed = time.monotonic()
        # kinspect closes the client's connection to its node listener at once.
        poll_until(lambda: not [s for s in kinspect_conns(rig) if s[0] == (CLIENT_HOST, rig.node_port)
                              and s[2] == 1], 1.0, 0.01)  # 1: TCP_ESTABLISHED
        assert time.monotonic() - killed < 1.0
        for _ in range(5):  # the client retries; each attempt is closed by kinspect (no broker)
            consumer.poll(timeout_ms=100)
    finally:
        consumer.close()
    assert_no_leaks(rig, fds)


# ----------------------------------------------------------------------------- client gone mid-frame


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_client_gone_mid_frame(rig: RewriteRig, codec: Codec, how: str):
    """A client sends half a request frame and goes away: kinspect closes the broker side, keeps nothing,
    and goes on serving other clients."""
    prepare(rig, codec, "half.topic")
    fds = open_fds()
    other = connect(rig.node_port)  # a client that stays, before and after
    call(other, codec, api_versions(codec, 1), 18, 3)

    for port in (rig.proxy.server.bootstrap_port, rig.node_port):
        sock = connect(port)
        call(sock, codec, api_versions(codec, 1), 18, 3)
        frame = produce(codec, 2, "half.topic", [b"y" * 1000] * 100)
        sock.sendall(frame[: len(frame) // 2])
        poll_until(lambda: len(kinspect_conns(rig)) == 4)
        if how == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        gone = time.monotonic()
        rig.proxy.wait_until(lambda: len(rig.proxy.server.relays) == 1, 1.0, 0.01)
        poll_until(lambda: len(kinspect_conns(rig)) == 2, 1.0, 0.01)  # only `other` and its broker connection
        assert time.monotonic() - gone < 1.0

    # The other client was not disturbed, and new ones are served.
    assert call(other, codec, metadata(codec, 2, ["half.topic"]), 3, 12).body["Topics"][0]["ErrorCode"] == 0
    other.close()
    with connect(rig.proxy.server.bootstrap_port) as sock:
        assert call(sock, codec, api_versions(codec, 1), 18, 3).body["ErrorCode"] == 0
    assert_no_leaks(rig, fds)
    # The broker never saw a whole request of the departed clients: nothing was produced.
    with connect(rig.node_port) as sock:
        latest = request_frame(codec, 2, 7, 1, {"ReplicaId": -1, "IsolationLevel": 0, "Topics": [
            {"Name": "half.topic", "Partitions": [{"PartitionIndex": 0, "CurrentLeaderEpoch": -1, "Timestamp": -1}]}]})
        partition = call(sock, codec, latest, 2, 7).body["Topics"][0]["Partitions"][0]
        assert (partition["ErrorCode"], partition["Offset"]) == (0, 0)
    assert_no_leaks(rig, fds)


# ----------------------------------------------------------------------------- slow reader


@pytest.mark.parametrize("version", [12, 16])
def test_slow_reader_keeps_memory_bounded(rig: RewriteRig, codec: Codec, version: int):
    """25 pipelined Fetches answered with ~2 MB each (50 MB) to a client that does not read: kinspect
    stops reading from the broker once the client's write buffer passes its high-water mark.

    Fetch v12 responses stream through as they arrive; v16+ responses may carry broker addresses
    (NodeEndpoints), so in rewrite mode kinspect holds each one until it is whole: the bound is
    then the high-water mark plus one response.
    """
    records = [bytes([65 + i % 26]) * 10_000 for i in range(200)]  # 2 MB in the topic
    topic_id = prepare(rig, codec, "slow.topic", records)
    n_fetches = 25
    proxy = rig.proxy
    samples = {"client_buffer": 0, "broker_buffer": 0, "broker_paused": 0, "rss": 0}
    sampling = threading.Event()

    async def sample() -> None:
        while not sampling.is_set():
            for relay in list(proxy.server.relays):
                client, broker = relay.client.transport, relay.broker.transport
                if client is None or broker is None or client.is_closing():
                    continue
                samples["client_buffer"] = max(samples["client_buffer"], client.get_write_buffer_size())
                samples["broker_buffer"] = max(samples["broker_buffer"], broker.get_write_buffer_size())
                samples["broker_paused"] += not broker.is_reading()
            await asyncio.sleep(0.005)

    chunk = READ_BUFFER_BYTES  # what one read from the broker may add past the mark (kinspect.proxy.receiving)
    limit = WRITE_BUFFER_HIGH + chunk + (0 if version < 16 else 2_100_000)
    rss_before = rss_bytes()
    sampler = asyncio.run_coroutine_threadsafe(sample(), proxy.loop)
    sock = connect(rig.node_port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        call(sock, codec, api_versions(codec, 1), 18, 3)
        for i in range(n_fetches):
            sock.sendall(fetch(codec, 100 + i, "slow.topic", offset=0, max_bytes=8 << 20, version=version,
                               topic_id=topic_id))
        # Not reading: the kernel buffers fill, then kinspect's write buffer, then kinspect pauses the broker.
        poll_until(lambda: samples["broker_paused"] > 0, 10)
        # The broker stays paused while the client does not read: seen paused in 200 samples (5 ms apart).
        poll_until(lambda: samples["broker_paused"] >= 200, 20)
        paused_rss = rss_bytes()
        assert samples["client_buffer"] <= limit, samples
        # Now read, slowly at first, and check every response arrived whole and in order.
        sizes = []
        sock.settimeout(30)
        first = None
        for i in range(n_fetches):
            if i < 3:
                time.sleep(0.3)
            frame = recv_frame(sock)
            assert correlation_id(frame) == 100 + i
            sizes.append(len(frame))
            if first is None:
                first = frame[4:]
                body = codec.decode_response(frame, 1, version).body
                batches = body["Responses"][0]["Partitions"][0]["Records"]
                assert len(batches) > len(records) * 10_000
            else:
                assert frame[4:] == first  # same fetch, same answer
        samples["rss"] = max(paused_rss, rss_bytes()) - rss_before
    finally:
        sampling.set()
        sampler.result(5)
        sock.close()
    total = sum(sizes)
    assert max(sizes) < 2_100_000
    assert total > 45 * 1024 * 1024
    assert samples["client_buffer"] <= limit, samples
    # Memory grew by far less than what went through (50 MB); in-process RSS includes the test's own reads.
    assert samples["rss"] < 24 * 1024 * 1024, samples
    proxy.wait_idle()
    exchanges = [x for x in proxy.events_of(Exchange) if x.request.api_key == 1 and x.response is not None]
    assert len(exchanges) == n_fetches and all(not x.response.complete for x in exchanges)  # headers only kept


# ----------------------------------------------------------------------------- many connections


async def test_500_concurrent_connections(rig: RewriteRig, codec: Codec):
    """500 clients connected at once, each doing ApiVersions + Metadata through kinspect to Tansu."""
    n = 500
    prepare(rig, codec, "many.topic")
    loop = asyncio.get_running_loop()
    ports = (rig.proxy.server.bootstrap_port, rig.node_port)
    started = time.monotonic()
    conns = await asyncio.gather(*(asyncio.open_connection(CLIENT_HOST, ports[i % 2]) for i in range(n)))
    try:
        # All 500 are open in kinspect at the same time, each with its own broker connection.
        await loop.run_in_executor(None, lambda: rig.proxy.wait_until(
            lambda: len(rig.proxy.server.relays) == n
            and all(r.broker.transport is not None for r in rig.proxy.server.relays), 30))

        async def exchange(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(api_versions(codec, 2 * i) + metadata(codec, 2 * i + 1, ["many.topic"]))
            await writer.drain()
            frames = []
            for _ in range(2):
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frames.append(await reader.readexactly(size))
            assert [correlation_id(f) for f in frames] == [2 * i, 2 * i + 1]
            assert codec.decode_response(frames[0], 18, 3).body["ErrorCode"] == 0
            md = codec.decode_response(frames[1], 3, 12).body
            assert [(b["NodeId"], b["Host"], b["Port"]) for b in md["Brokers"]] == [
                (TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]
            assert [(t["Name"], t["ErrorCode"]) for t in md["Topics"]] == [("many.topic", 0)]

        await asyncio.wait_for(asyncio.gather(*(exchange(i, r, w) for i, (r, w) in enumerate(conns))), 60)
    finally:
        for _, writer in conns:
            writer.close()
    elapsed = time.monotonic() - started
    await loop.run_in_executor(None, rig.proxy.wait_idle, 20)
    exchanges = [x for x in rig.proxy.events_of(Exchange) if x.response is not None]
    assert len(exchanges) >= 2 * n
    assert rig.proxy.server.refused_connections == 0
    assert elapsed < 60


# ----------------------------------------------------------------------------- broker unreachable


def test_broker_unreachable_closes_client_promptly(codec: Codec):
    """A listener whose broker refuses connections closes its clients at once; another listener
    (a passthrough route to a live broker) keeps serving."""
    dead = free_port()  # nothing listens there
    with TansuBroker() as tansu:
        proxy = ProxyHarness({
            "proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0", "proxy.upstream": f"127.0.0.1:{dead}",
            "proxy.routes": [f"127.0.0.1:0={tansu.bootstrap}"],
        }).start()
        try:
            dead_port, live_port = (listener.port for listener in proxy.server.listeners)
            fds = open_fds()
            live = connect(live_port)
            call(live, codec, api_versions(codec, 1), 18, 3)
            socks = [connect(dead_port) for _ in range(20)]
            started = time.monotonic()
            for sock in socks:
                sock.sendall(api_versions(codec, 1))
            for sock in socks:
                assert read_until_closed(sock, 1.0) == b""  # closed (FIN or RST: unread data), nothing answered
                sock.close()
            assert time.monotonic() - started < 1.0
            assert call(live, codec, metadata(codec, 2), 3, 12).body["Brokers"]
            live.close()
            proxy.wait_idle()
            assert proxy.kinspect_tasks() == []
            poll_until(lambda: open_fds() <= fds)
        finally:
            proxy.stop()
        assert proxy.leftover_tasks == []


def test_broker_connect_timeout_and_failover(codec: Codec):
    """Rewrite mode: the first bootstrap server never answers the TCP handshake (a listener whose
    accept queue is full), the second is Tansu: kinspect gives up on the first after connect_timeout
    and serves the client through the second; with only the silent one, the client is closed."""
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    filler = [socket.socket() for _ in range(3)]
    for s in filler:  # fill the accept queue; later SYNs are dropped, so connects hang
        s.setblocking(False)
        s.connect_ex(blackhole.getsockname())
    silent = "127.0.0.1:%d" % blackhole.getsockname()[1]
    try:
        with TansuBroker() as tansu:
            for servers, served in (([silent, tansu.bootstrap], True), ([silent], False)):
                proxy = ProxyHarness({
                    "proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0", "proxy.bootstrap_servers": servers,
                    "proxy.node_port_base": 0, "proxy.node_ports": {str(TANSU_NODE_ID): free_port()},
                    "proxy.connect_timeout": 0.5,
                }).start()
                try:
                    with connect(proxy.server.bootstrap_port) as sock:
                        started = time.monotonic()
                        sock.sendall(api_versions(codec, 1))  # held by kinspect until a broker is reached
                        if served:
                            assert codec.decode_response(recv_frame(sock), 18, 3).body["ErrorCode"] == 0
                        else:
                            assert read_until_closed(sock, 3.0) == b""
                        assert 0.45 < time.monotonic() - started < 1.5
                    proxy.wait_idle()
                    assert proxy.kinspect_tasks() == []
                finally:
                    proxy.stop()
    finally:
        for s in [*filler, blackhole]:
            s.close()


# ----------------------------------------------------------------------------- graceful shutdown


def test_graceful_shutdown_lets_inflight_requests_finish(rig: RewriteRig, codec: Codec):
    """shutdown(grace): listeners close at once, an in-flight request is answered, then all close."""
    prepare(rig, codec, "grace.topic", [b"g"])
    busy = connect(rig.node_port)
    idle = connect(rig.proxy.server.bootstrap_port)
    call(busy, codec, api_versions(codec, 1), 18, 3)
    call(idle, codec, api_versions(codec, 1), 18, 3)
    busy.sendall(fetch(codec, 7, "grace.topic", offset=1, max_wait_ms=1500))  # the broker holds it 1.5 s
    rig.proxy.wait_until(lambda: rig.proxy.server.inflight() == 1)
    started = time.monotonic()
    shutdown = asyncio.run_coroutine_threadsafe(rig.proxy.server.shutdown(10.0), rig.proxy.loop)
    poll_until(lambda: _refused(rig.proxy.server.bootstrap_port), 1.0)  # no new clients
    busy.settimeout(5)
    frame = recv_frame(busy)  # the in-flight Fetch is answered ...
    answered = time.monotonic() - started
    assert correlation_id(frame) == 7 and codec.decode_response(frame, 1, 12).body["ErrorCode"] == 0
    assert wait_closed(busy, 2) < 1.0  # ... then the connection closes
    assert wait_closed(idle, 1) < 1.0
    shutdown.result(5)
    done = time.monotonic() - started
    assert 1.0 < answered < 3.0 and done < answered + 1.0, (answered, done)
    busy.close()
    idle.close()
    rig.proxy.stop()
    assert rig.proxy.leftover_tasks == []


def test_graceful_shutdown_grace_period_is_a_limit(rig: RewriteRig, codec: Codec):
    """A request still unanswered when the grace period ends is cut off; shutdown takes ~grace, not longer."""
    prepare(rig, codec, "grace.topic", [b"g"])
    busy = connect(rig.node_port)
    call(busy, codec, api_versions(codec, 1), 18, 3)
    busy.sendall(fetch(codec, 7, "grace.topic", offset=1, max_wait_ms=2500))
    rig.proxy.wait_until(lambda: rig.proxy.server.inflight() == 1)
    started = time.monotonic()
    rig.proxy.call(rig.proxy.server.shutdown(0.5))
    done = time.monotonic() - started
    assert read_until_closed(busy, 2.0) == b""  # closed without the answer
    busy.close()
    assert 0.45 < done < 2.0, done
    assert [p for p in rig.proxy.events_of(Problem) if p.kind == "unanswered" and p.api_key == 1]
    rig.proxy.stop()
    assert rig.proxy.leftover_tasks == []


def _refused(port: int) -> bool:
    """True if the port no longer takes connections (a connect queued as the listener closed is reset)."""
    try:
        socket.create_connection((CLIENT_HOST, port), timeout=1).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True


# ----------------------------------------------------------------------------- acks=0 in rewrite mode


def test_acks0_producer_in_rewrite_mode_leaves_nothing_behind(codec: Codec):
    """A Kafka broker never answers acks=0 Produce requests. In rewrite mode Produce v10+ responses may
    carry broker addresses, so kinspect marks those requests' responses to be held; an acks=0 request
    must not be marked, or every one of them stays in the relay's table forever. (Tansu answers acks=0,
    so the broker here is a sink that reads and never answers, as Kafka does.)"""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    received = {"bytes": 0}

    def drain() -> None:
        conn, _ = sink.accept()
        with conn:
            while data := conn.recv(1 << 16):
                received["bytes"] += len(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proxy = ProxyHarness({"proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0",
                          "proxy.bootstrap_servers": ["127.0.0.1:%d" % sink.getsockname()[1]],
                          "proxy.node_ports": {str(TANSU_NODE_ID): free_port()}}).start()
    try:
        n = 5000
        frames = b"".join(
            request_frame(codec, 0, 10, i, {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1000, "TopicData": [
                {"Name": "t", "PartitionData": [{"Index": 0, "Records": record_batch([b"v%d" % i])}]}]})
            for i in range(n))
        with connect(proxy.server.bootstrap_port) as sock:
            sock.sendall(frames)
            poll_until(lambda: received["bytes"] == len(frames), 10)
            relays = proxy.run(lambda: [r.session.inflight for r in proxy.server.relays])
            assert relays == [0]  # one correlation table: nothing kept for responses that never come
        acks0 = [x for x in proxy.events_of(Exchange) if x.request.api_key == 0]
        assert len(acks0) == n and all(x.response is None and not x.request.expects_response for x in acks0)
    finally:
        proxy.stop()
        sink.close()
        reader.join(5)


# ----------------------------------------------------------------------------- known kinspect bugs
# Regression tests of shutdown races found while writing these tests.


def test_shutdown_while_connecting_to_the_broker(codec: Codec):
    slow = socket.socket()  # a broker whose accept queue is full: connects to it hang
    slow.bind(("127.0.0.1", 0))
    slow.listen(0)
    filler = [socket.socket() for _ in range(3)]
    for s in filler:
        s.setblocking(False)
        s.connect_ex(slow.getsockname())
    proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                          "proxy.upstream": "127.0.0.1:%d" % slow.getsockname()[1],
                          "proxy.connect_timeout": 10.0}).start()
    client = connect(proxy.server.bootstrap_port)
    try:
        client.sendall(api_versions(codec, 1))
        proxy.wait_until(lambda: len(proxy.server.relays) == 1)
        proxy.call(proxy.server.shutdown(0))
        assert read_until_closed(client, 1.0) == b""
        assert proxy.kinspect_tasks() == []  # fails: ProxyServer._connect is still waiting for the broker
    finally:
        for task in proxy.kinspect_tasks():
            proxy.loop.call_soon_threadsafe(task.cancel)
        client.close()
        proxy.stop()
        for s in [*filler, slow]:
            s.close()


def test_shutdown_right_after_a_new_node_listener(codec: Codec):
    node_port = free_port()
    proxy = ProxyHarness({"proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0",
                          "proxy.bootstrap_servers": ["127.0.0.1:9"],
                          "proxy.node_ports": {str(TANSU_NODE_ID): node_port}}).start()
    try:
        async def metadata_then_shutdown() -> None:
            # What ProxyServer._rewrite does when a response names broker 111 for the first time,
            # followed in the same loop iteration by a shutdown (SIGTERM at the wrong moment).
            proxy.server._node_listener(TANSU_NODE_ID, "127.0.0.2", 9092)
            await proxy.server.shutdown(0)

        proxy.call(metadata_then_shutdown())
        poll_until(lambda: _refused(node_port), 5)  # fails: the node listener was never closed
    finally:
        proxy.stop()
