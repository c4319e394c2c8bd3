"""kinspect's proxy under network faults not covered by test_proxy_faults.py: resets in the middle
of a response (from the client's side and from the broker's), half-open connections both ways,
connect timeouts (a log line and a metric), and /metrics scraped hard while traffic flows.

Where the fault must be placed at an exact byte (half a response, then a reset; an EOF and
then an answer) the broker is a scripted socket on loopback; elsewhere it is Tansu. After
each fault: kinspect holds no relay, no in-flight request, no task and no extra descriptor,
and serves the next client.
"""

from __future__ import annotations

import gc
import logging
import socket
import struct
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.observers.http_endpoints import HttpEndpoints
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.session import Problem
from tests.support.proxy_harness import (
    ProxyHarness,
    RewriteRig,
    api_versions,
    correlation_id,
    fetch,
    metadata,
    open_fds,
    poll_until,
    recv_exact,
    recv_frame,
)
from tests.support.tansu import TansuBroker, free_port
from tests.proxy.test_proxy_faults import (
    assert_no_leaks,
    call,
    connect,
    kinspect_conns,
    prepare,
    read_until_closed,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


@pytest.fixture
def rig(tmp_path):
    gc.collect()
    with RewriteRig(tmp_path, record=False) as r:
        yield r


class ScriptedBroker:
    """A loopback listener whose single connection is handled by `script(conn)` in a thread."""

    def __init__(self, script) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(10)
        try:
            script(conn, self.result)
        finally:
            conn.close()

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


def passthrough(upstream: str, **overrides) -> ProxyHarness:
    return ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0", "proxy.upstream": upstream,
                         **overrides}).start()


def assert_clean(proxy: ProxyHarness, fds: int) -> None:
    proxy.wait_idle(5)
    assert proxy.run(lambda: proxy.server.inflight()) == 0
    assert proxy.kinspect_tasks() == []
    poll_until(lambda: open_fds() <= fds, 5)


# ----------------------------------------------------------------------------- resets mid-response


def test_client_reset_mid_response(rig: RewriteRig, codec: Codec):
    """A client asks for ~2 MB, reads 100 KB of the answer and resets: kinspect drops both sides at once,
    the broker connection included, and keeps serving."""
    topic_id = prepare(rig, codec, "rst.topic", [bytes([66]) * 10_000 for _ in range(200)])
    fds = open_fds()
    sock = connect(rig.node_port)
    call(sock, codec, api_versions(codec, 1), 18, 3)
    sock.sendall(fetch(codec, 2, "rst.topic", max_bytes=8 << 20, version=12, topic_id=topic_id))
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    assert size > 1_900_000
    recv_exact(sock, 100_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
    sock.close()
    gone = time.monotonic()
    rig.proxy.wait_idle(2)
    poll_until(lambda: not kinspect_conns(rig), 2, 0.01)
    assert time.monotonic() - gone < 2
    assert_no_leaks(rig, fds)
    with connect(rig.proxy.server.bootstrap_port) as again:
        assert call(again, codec, metadata(codec, 1, ["rst.topic"]), 3, 12).body["Topics"][0]["ErrorCode"] == 0
    assert_no_leaks(rig, fds)


def unsent_until_acked(conn: socket.socket, timeout: float = 10.0) -> None:
    """Wait until the peer has acknowledged every byte sent on conn (Linux SIOCOUTQ: bytes not yet acked)."""
    import fcntl
    import termios

    deadline = time.monotonic() + timeout
    buf = bytearray(4)
    while True:
        fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, buf)
        if struct.unpack("i", buf)[0] == 0:
            return
        assert time.monotonic() < deadline, "the peer did not read what was sent"
        time.sleep(0.005)


def test_broker_reset_mid_response(codec: Codec):
    """The broker sends half a response and resets: the client gets exactly that half, then the close;
    the request is reported unanswered; nothing is left behind."""
    response = struct.pack(">i", 7) + b"\x00\x00" + b"r" * 20_000  # correlation id 7, then a body

    def script(conn, result) -> None:
        frame = recv_frame(conn)
        result["request"] = frame
        conn.sendall(struct.pack(">i", len(response)) + response[: len(response) // 2])
        unsent_until_acked(conn)  # a reset drops what is still in the send queue
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)

    broker = ScriptedBroker(script)
    proxy = passthrough(broker.address)
    try:
        fds = open_fds()
        with connect(proxy.server.bootstrap_port) as sock:
            request = api_versions(codec, 7)
            sock.sendall(request)
            got = read_until_closed(sock, 3)
        broker.close()
        assert broker.result["request"] == request[4:]  # forwarded as sent
        assert got == struct.pack(">i", len(response)) + response[: len(response) // 2]
        assert_clean(proxy, fds)
        unanswered = [p for p in proxy.events_of(Problem) if p.kind == "unanswered"]
        assert len(unanswered) == 1 and "correlation id 7 " in unanswered[0].detail
    finally:
        proxy.stop()
        broker.close()


# ----------------------------------------------------------------------------- half-open connections


def test_client_half_close_still_gets_its_response(codec: Codec):
    """The client sends a request and shuts down its writing side: kinspect passes the EOF on and the
    response (sent by the broker after it saw the EOF) still reaches the client, then both sides close."""
    answer = struct.pack(">i", 3) + b"\x00\x00" + b"late answer"

    def script(conn, result) -> None:
        result["request"] = recv_frame(conn)
        result["eof"] = conn.recv(1) == b""  # the client's EOF, passed on by kinspect
        conn.sendall(struct.pack(">i", len(answer)) + answer)

    broker = ScriptedBroker(script)
    proxy = passthrough(broker.address)
    try:
        fds = open_fds()
        with connect(proxy.server.bootstrap_port) as sock:
            sock.sendall(api_versions(codec, 3))
            sock.shutdown(socket.SHUT_WR)
            got = read_until_closed(sock, 3)
        broker.close()
        assert broker.result["eof"] is True
        assert got == struct.pack(">i", len(answer)) + answer
        assert_clean(proxy, fds)
        assert not [p for p in proxy.events_of(Problem) if p.kind == "unanswered"]
    finally:
        proxy.stop()
        broker.close()


def test_client_half_close_with_tansu(codec: Codec):
    """The same with a real broker: ApiVersions, then the client's EOF; Tansu's answer arrives whole."""
    with TansuBroker() as tansu:
        proxy = passthrough(tansu.bootstrap)
        try:
            fds = open_fds()
            with connect(proxy.server.bootstrap_port) as sock:
                sock.sendall(api_versions(codec, 5) + metadata(codec, 6))
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                first, second = recv_frame(sock), recv_frame(sock)
                assert (correlation_id(first), correlation_id(second)) == (5, 6)
                assert codec.decode_response(first, 18, 3).body["ErrorCode"] == 0
                assert codec.decode_response(second, 3, 12).body["Brokers"]
                assert read_until_closed(sock, 3) == b""
            assert_clean(proxy, fds)
        finally:
            proxy.stop()


def test_broker_half_close_keeps_the_client_direction_open(codec: Codec):
    """The broker answers and shuts down its writing side: the client sees the answer and the EOF, and
    what it sends afterwards still reaches the broker."""
    answer = struct.pack(">i", 1) + b"\x00\x00"

    def script(conn, result) -> None:
        recv_frame(conn)
        conn.sendall(struct.pack(">i", len(answer)) + answer)
        conn.shutdown(socket.SHUT_WR)
        result["after"] = recv_frame(conn)  # sent by the client after it saw our EOF
        result["eof"] = conn.recv(1) == b""

    broker = ScriptedBroker(script)
    proxy = passthrough(broker.address)
    try:
        fds = open_fds()
        with connect(proxy.server.bootstrap_port) as sock:
            sock.sendall(api_versions(codec, 1))
            sock.settimeout(5)
            assert recv_frame(sock) == answer
            assert sock.recv(1) == b""  # the broker's EOF
            later = metadata(codec, 2)
            sock.sendall(later)
            sock.shutdown(socket.SHUT_WR)
            assert read_until_closed(sock, 3) == b""
        broker.close()
        assert broker.result["after"] == later[4:] and broker.result["eof"] is True
        assert_clean(proxy, fds)
    finally:
        proxy.stop()
        broker.close()


# ----------------------------------------------------------------------------- connect timeouts


def scrape(observer: MetricsObserver, proxy: ProxyHarness) -> dict:
    from prometheus_client import generate_latest

    text = proxy.run(lambda: generate_latest(observer.registry).decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_connect_timeout_closes_the_client_logs_and_counts(codec: Codec, caplog):
    """An upstream that never completes the TCP handshake (a listener whose accept queue is full): the
    client is closed after proxy.connect_timeout, a warning names the broker and the setting, and
    kinspect_upstream_connect_failures_total{reason="timeout"} counts it. A refused connect counts
    under reason="refused"."""
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    filler = [socket.socket() for _ in range(3)]
    for s in filler:  # fill the accept queue; later SYNs are dropped, so connects hang
        s.setblocking(False)
        s.connect_ex(blackhole.getsockname())
    silent = f"127.0.0.1:{blackhole.getsockname()[1]}"
    observer = MetricsObserver()
    proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0", "proxy.upstream": silent,
                          "proxy.routes": [f"127.0.0.1:0=127.0.0.1:{free_port()}"],  # nothing listens there
                          "proxy.connect_timeout": 0.3}, observers=(observer,))
    observer.server = proxy.server
    proxy.start()
    try:
        fds = open_fds()
        silent_port, dead_port = (listener.port for listener in proxy.server.listeners)
        with caplog.at_level(logging.WARNING, logger="kinspect.proxy"):
            for _ in range(2):
                with connect(silent_port) as sock:
                    started = time.monotonic()
                    sock.sendall(api_versions(codec, 1))
                    assert read_until_closed(sock, 3) == b""
                    assert 0.25 < time.monotonic() - started < 1.5
            with connect(dead_port) as sock:
                sock.sendall(api_versions(codec, 1))
                assert read_until_closed(sock, 3) == b""
            assert_clean(proxy, fds)
        lines = [r.getMessage() for r in caplog.records if "no broker reachable" in r.getMessage()]
        # One line per broker within the log interval: the second timeout to the same broker is held back.
        assert len(lines) == 2
        assert silent in lines[0] and "proxy.connect_timeout" in lines[0], lines
        assert "Connection refused" in lines[1], lines
        m = scrape(observer, proxy)
        failures = {dict(k[1])["reason"]: v for k, v in m.items() if k[0] == "kinspect_upstream_connect_failures_total"}
        assert failures == {"timeout": 2.0, "refused": 1.0, "error": 0.0}
        assert m[("kinspect_connections_total", ())] == 3.0
        assert m[("kinspect_connections_open", ())] == 0.0
    finally:
        proxy.stop()
        for s in [*filler, blackhole]:
            s.close()


# ----------------------------------------------------------------------------- /metrics under fire


def test_metrics_endpoint_hammered_while_traffic_flows(codec: Codec):
    """8 threads x 25 GETs of /metrics while confluent-kafka produces (for as long as the scraping lasts)
    and consumes through kinspect: every scrape is a 200 that parses, and the records arrive complete
    and in order."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    listen = free_port()
    observer = MetricsObserver()
    with TansuBroker(advertised_port=listen) as tansu:  # follow-up connections come through kinspect
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen}",
                              "proxy.upstream": tansu.bootstrap}, observers=(observer,))
        observer.server = proxy.server
        proxy.start()
        endpoints = HttpEndpoints(observer.registry)
        proxy.call(endpoints.start("127.0.0.1", 0))
        url = f"http://127.0.0.1:{endpoints.port}/metrics"
        bootstrap = f"127.0.0.1:{listen}"
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic("hammer", 1, 1)])["hammer"].result(20)
            produced: list[bytes] = []
            consumed: list[bytes] = []
            scraping_done = threading.Event()
            traffic_done = threading.Event()

            def produce() -> None:
                # Produce steadily for as long as the scrapers run, so the two overlap throughout.
                producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
                while not scraping_done.is_set():
                    for _ in range(20):
                        value = b"h-%06d" % len(produced) + b"." * 200
                        producer.produce("hammer", value=value)
                        produced.append(value)
                    producer.poll(0)
                    time.sleep(0.01)
                assert producer.flush(30) == 0

            def traffic() -> None:
                writer = threading.Thread(target=produce, daemon=True)
                writer.start()
                consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hammer",
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
                consumer.assign([TopicPartition("hammer", 0, 0)])
                deadline = time.monotonic() + 90
                while (writer.is_alive() or len(consumed) < len(produced)) and time.monotonic() < deadline:
                    msg = consumer.poll(0.1)
                    if msg is not None and msg.error() is None:
                        consumed.append(msg.value())
                consumer.close()
                traffic_done.set()

            def scraper(_: int) -> list[tuple[int, int, float]]:
                out = []
                for _ in range(25):
                    with urllib.request.urlopen(url, timeout=10) as response:
                        body = response.read().decode()
                        families = {f.name for f in text_string_to_metric_families(body)}
                        out.append((response.status, len(families), time.monotonic()))
                return out

            worker = threading.Thread(target=traffic, daemon=True)
            worker.start()
            with ThreadPoolExecutor(8) as pool:
                results = [r for rs in pool.map(scraper, range(8)) for r in rs]
            scraping_done.set()
            worker.join(100)
            assert traffic_done.is_set()
            assert len(results) == 200
            assert all(status == 200 for status, _, _ in results)
            assert min(count for _, count, _ in results) >= 20  # whole expositions, never a truncated one
            assert len(produced) >= 1000 and consumed == produced
            with urllib.request.urlopen(url, timeout=10) as response:
                final = {(s.name, tuple(sorted(s.labels.items()))): s.value
                         for f in text_string_to_metric_families(response.read().decode()) for s in f.samples}
            assert final[("kinspect_produced_records_total", (("compression", "none"),))] == len(produced)
        finally:
            proxy.call(endpoints.close())
            proxy.stop()
        assert proxy.leftover_tasks == []
