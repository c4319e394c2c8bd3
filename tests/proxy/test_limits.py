"""The limits that protect the proxy: each is configurable, each hit shows in a metric, and only the
connection limit touches traffic (it refuses connections); the inspection limits never change a
forwarded byte.

- frame size (inspect.max_frame_bytes): kinspect_problems_total{kind="frame_too_large"} and
  kinspect_decode_failures_total{reason="frame_too_large"}
- in-flight requests per connection (inspect.max_inflight): kinspect_problems_total{kind="inflight_overflow"}
- connections (proxy.max_connections): kinspect_connections_refused_total, kinspect_connections_limit
- label cardinality (metrics.max_topics, metrics.max_unknown_series): kinspect_label_overflow_total{metric}

(The capture queue's limit, kinspect_capture_dropped_rows_total, belongs to the capture observer and
is tested with it.)
"""

from __future__ import annotations

import gc
import socket
import struct
import threading
import time

import pytest
from kafka.record.memory_records import MemoryRecords
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from tests.support.proxy_harness import (
    ProxyHarness,
    RewriteRig,
    api_versions,
    check_byte_exact,
    correlation_id,
    create_topic,
    fetch,
    metadata,
    open_fds,
    poll_until,
    produce,
    recv_frame,
)
from tests.support.tansu import TansuBroker
from tests.proxy.test_proxy_faults import read_until_closed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def attach_metrics(proxy: ProxyHarness, **kwargs) -> MetricsObserver:
    observer = MetricsObserver(server=proxy.server, **kwargs)
    proxy.dispatcher.observers.append(observer)
    return observer


def scrape(proxy: ProxyHarness, observer: MetricsObserver) -> dict:
    text = proxy.run(lambda: generate_latest(observer.registry).decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def labelled(metrics: dict, name: str, **match) -> dict:
    """{labels dict as a tuple of the other labels: value} of one metric's samples matching `match`."""
    out = {}
    for (sample, labels), value in metrics.items():
        d = dict(labels)
        if sample == name and all(d.get(k) == v for k, v in match.items()):
            out[tuple(sorted((k, v) for k, v in d.items() if k not in match))] = value
    return out


def open_to(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def ask(sock: socket.socket, codec: Codec, frame: bytes, api_key: int, version: int):
    sock.sendall(frame)
    response = recv_frame(sock)
    assert correlation_id(response) == struct.unpack_from(">i", frame, 8)[0]
    return codec.decode_response(response, api_key, version).body


# ----------------------------------------------------------------------------- inspection limits


def test_frame_size_and_inflight_limits_count_and_never_touch_forwarding(tmp_path, codec: Codec):
    """With inspect.max_frame_bytes = 20000 and inspect.max_inflight = 4: a 40 KB Produce and its 40 KB
    Fetch answer are frame_too_large (request and response), 10 pipelined Metadata requests overflow the
    in-flight table 6 times; each is counted, and the recordings on both sides of kinspect show every
    byte forwarded unchanged (but for the rewritten broker addresses)."""
    gc.collect()
    with RewriteRig(tmp_path, overrides={"inspect.max_frame_bytes": 20_000, "inspect.max_inflight": 4}) as rig:
        observer = attach_metrics(rig.proxy)
        node = f"127.0.0.1:{rig.node_port}"
        with open_to(rig.bootstrap) as sock:
            assert ask(sock, codec, api_versions(codec, 1), 18, 3)["ErrorCode"] == 0
            assert ask(sock, codec, create_topic(codec, 2, "limits.topic"), 19, 4)["Topics"][0]["ErrorCode"] == 0
            # 10 Metadata requests at once: the table keeps 4, forgets the 6 oldest.
            sock.sendall(b"".join(metadata(codec, 100 + i, ["limits.topic"]) for i in range(10)))
            for i in range(10):
                frame = recv_frame(sock)
                assert correlation_id(frame) == 100 + i
                body = codec.decode_response(frame, 3, 12).body
                assert [(b["Host"], b["Port"]) for b in body["Brokers"]] == [("127.0.0.1", rig.node_port)]
        values = [bytes([48 + i % 10]) * 1000 for i in range(40)]  # a 40 KB batch
        with open_to(node) as sock:
            assert ask(sock, codec, api_versions(codec, 1), 18, 3)["ErrorCode"] == 0
            partition = ask(sock, codec, produce(codec, 2, "limits.topic", values), 0, 9)["Responses"][0][
                "PartitionResponses"][0]
            assert partition["ErrorCode"] == 0
        with open_to(node) as sock:
            body = ask(sock, codec, fetch(codec, 3, "limits.topic", max_bytes=1 << 20), 1, 12)
            records = MemoryRecords(bytes(body["Responses"][0]["Partitions"][0]["Records"]))
            got = []
            while (batch := records.next_batch()) is not None:
                got.extend(bytes(r.value) for r in batch)
            assert got == values
        rig.quiesce()
        report = check_byte_exact(rig, codec)
        assert report.rewritten == 10 and report.frames == 15  # the 10 Metadata answers carry addresses

        m = scrape(rig.proxy, observer)
        problems = labelled(m, "kinspect_problems_total")
        assert problems[(("direction", "request"), ("kind", "inflight_overflow"))] == 6
        assert problems[(("direction", "request"), ("kind", "frame_too_large"))] == 1
        assert problems[(("direction", "response"), ("kind", "frame_too_large"))] == 1
        too_large = labelled(m, "kinspect_decode_failures_total", reason="frame_too_large")
        assert sum(too_large.values()) == 2
        assert m[("kinspect_inflight_limit", ())] == 4
        assert m[("kinspect_inflight_requests", ())] == 0


# ----------------------------------------------------------------------------- connections


def test_connection_limit_refuses_counts_and_closes_cleanly(codec: Codec):
    """proxy.max_connections = 3: a 4th client is closed at once and counted; the 3 are undisturbed;
    once one leaves, a new client is served."""
    with TansuBroker() as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                              "proxy.upstream": tansu.bootstrap, "proxy.max_connections": 3}).start()
        observer = attach_metrics(proxy)
        address = proxy.bootstrap
        try:
            fds = open_fds()
            clients = [open_to(address) for _ in range(3)]
            for i, sock in enumerate(clients):
                assert ask(sock, codec, api_versions(codec, i), 18, 3)["ErrorCode"] == 0
            for _ in range(2):
                with open_to(address) as extra:
                    started = time.monotonic()
                    try:
                        extra.sendall(api_versions(codec, 9))
                    except OSError:
                        pass  # already reset
                    assert read_until_closed(extra, 2) == b""
                    assert time.monotonic() - started < 1.0
            for i, sock in enumerate(clients):
                assert ask(sock, codec, metadata(codec, 10 + i), 3, 12)["Brokers"]
            clients.pop().close()
            proxy.wait_until(lambda: len(proxy.server.relays) == 2)
            with open_to(address) as sock:
                assert ask(sock, codec, api_versions(codec, 20), 18, 3)["ErrorCode"] == 0
            m = scrape(proxy, observer)
            assert m[("kinspect_connections_refused_total", ())] == 2
            assert m[("kinspect_connections_limit", ())] == 3
            assert proxy.server.refused_connections == 2
            for sock in clients:
                sock.close()
            proxy.wait_idle()
            assert proxy.kinspect_tasks() == []
            poll_until(lambda: open_fds() <= fds)
        finally:
            proxy.stop()


# ----------------------------------------------------------------------------- label cardinality


def test_topic_label_cap_counts_the_overflow(codec: Codec):
    """metrics.max_topics = 3 with topic_bytes on: 6 topics give 3 named series and "other", and
    kinspect_label_overflow_total{metric="kinspect_topic_bytes_total"} counts what went to "other"."""
    with TansuBroker() as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                              "proxy.upstream": tansu.bootstrap, "metrics.topic_bytes": True,
                              "metrics.max_topics": 3}).start()
        observer = attach_metrics(proxy, topic_bytes=True, max_topics=proxy.config.metrics.max_topics)
        try:
            topics = [f"cap.topic.{i}" for i in range(6)]
            with open_to(proxy.bootstrap) as sock:
                for i, topic in enumerate(topics):
                    assert ask(sock, codec, create_topic(codec, i, topic), 19, 4)["Topics"][0]["ErrorCode"] == 0
                for i, topic in enumerate(topics):
                    assert ask(sock, codec, metadata(codec, 10 + i, [topic]), 3, 12)["Topics"][0]["Name"] == topic
            m = scrape(proxy, observer)
            labels = {dict(k)["topic"] for k in labelled(m, "kinspect_topic_bytes_total")}
            assert labels == {*topics[:3], "other"}
            overflow = labelled(m, "kinspect_label_overflow_total")
            # 3 topics past the cap, each named by a CreateTopics and a Metadata request and response.
            assert overflow == {(("metric", "kinspect_topic_bytes_total"),): 12}
        finally:
            proxy.stop()


def test_unknown_series_cap_counts_the_overflow(codec: Codec):
    """metrics.max_unknown_series = 2: requests of 10 api versions no spec defines make 2 series and
    "other"; every request is still forwarded byte for byte (to a broker that reads and never answers)."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    received = bytearray()

    def drain() -> None:
        conn, _ = sink.accept()
        with conn:
            while data := conn.recv(1 << 16):
                received.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                          "proxy.upstream": f"127.0.0.1:{sink.getsockname()[1]}",
                          "metrics.enabled": True, "metrics.max_unknown_series": 2}).start()
    observer = proxy.app.metrics  # the CLI's wiring: the cap comes from the config
    try:
        frames = b""
        for i in range(10):  # ApiVersions v100..v109, header v1, an empty body
            frame = struct.pack(">hhih", 18, 100 + i, i, 4) + b"test"
            frames += struct.pack(">i", len(frame)) + frame
        with open_to(proxy.bootstrap) as sock:
            sock.sendall(frames)
            poll_until(lambda: len(received) == len(frames), 10)
        assert bytes(received) == frames
        m = scrape(proxy, observer)
        series = labelled(m, "kinspect_requests_total", api="ApiVersions")
        assert series == {(("version", "100"),): 1, (("version", "101"),): 1, (("version", "other"),): 8}
        assert labelled(m, "kinspect_label_overflow_total") == {(("metric", "kinspect_requests_total"),): 8}
        assert m[("kinspect_unknown_api_requests_total", ())] == 10
    finally:
        proxy.stop()
        sink.close()
        reader.join(5)
