"""kinspect's Prometheus metrics against what real clients did through the proxy, and the HTTP endpoints.

A Tansu broker advertises kinspect's listener (passthrough), confluent-kafka creates a
topic (twice: the second answer carries TOPIC_ALREADY_EXISTS, a nested error code),
produces records and reads its metadata; the MetricsObserver's figures are then checked
against the EventLog of the same run and against frames decoded independently.
"""

from __future__ import annotations

import collections
import gc
import struct
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.observers.http_endpoints import HttpEndpoints, readiness_of
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.error_codes import ERROR_NAMES, error_name
from kinspect.session import Exchange, Problem, Request, Response
from tests.support.proxy_harness import ProxyHarness
from tests.support.tansu import TansuBroker, free_port

TIMEOUT = 20.0
TOPIC = "metrics.topic"
RECORDS = 37

CONTRACT = {
    "kinspect_requests_total": "counter", "kinspect_responses_total": "counter",
    "kinspect_request_size_bytes": "histogram", "kinspect_response_size_bytes": "histogram",
    "kinspect_header_size_bytes": "histogram", "kinspect_tag_section_bytes_total": "counter",
    "kinspect_tagged_fields_total": "counter", "kinspect_tagged_field_bytes_total": "counter",
    "kinspect_request_latency_seconds": "histogram", "kinspect_response_errors_total": "counter",
    "kinspect_produced_records_total": "counter", "kinspect_produced_batches_total": "counter",
    "kinspect_topic_bytes_total": "counter", "kinspect_decode_failures_total": "counter",
    "kinspect_unknown_api_requests_total": "counter", "kinspect_problems_total": "counter",
    "kinspect_connections_open": "gauge", "kinspect_connections_total": "counter",
    "kinspect_bytes_total": "counter", "kinspect_inflight_requests": "gauge",
    "kinspect_inflight_limit": "gauge", "kinspect_build_info": "gauge",
}


def test_error_names():
    assert error_name(-1) == "UNKNOWN_SERVER_ERROR" and error_name(0) == "NONE"
    assert error_name(6) == "NOT_LEADER_OR_FOLLOWER" and error_name(35) == "UNSUPPORTED_VERSION"
    assert error_name(36) == "TOPIC_ALREADY_EXISTS" and error_name(9999) == "UNKNOWN_9999"
    assert len(set(ERROR_NAMES.values())) == len(ERROR_NAMES)
    assert sorted(ERROR_NAMES) == list(range(-1, max(ERROR_NAMES) + 1))  # no gaps


# ----------------------------------------------------------------------------- helpers


def samples(proxy: ProxyHarness, registry) -> dict:
    """{(sample name, sorted labels): value}, collected on the proxy's loop."""

    def collect():
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in registry.collect() for s in family.samples}

    return proxy.run(collect)


def total(values: dict, name: str, **match) -> float:
    return sum(v for (n, labels), v in values.items()
               if n == name and all(dict(labels).get(k) == want for k, want in match.items()))


def by_label(values: dict, name: str, *keys: str) -> dict:
    out = collections.Counter()
    for (n, labels), v in values.items():
        if n == name and v:
            d = dict(labels)
            out[tuple(d[k] for k in keys)] += v
    return dict(out)


def uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


class TagWalk:
    """A hand-written walk of the tag sections of ApiVersions v3+ and Metadata v12 responses (independent of kinspect)."""

    def __init__(self) -> None:
        self.fields: collections.Counter = collections.Counter()  # (location, path, tag) -> count
        self.section_bytes = 0

    def tags(self, buf: bytes, pos: int, location: str, path: str) -> int:
        start = pos
        count, pos = uvarint(buf, pos)
        for _ in range(count):
            tag, pos = uvarint(buf, pos)
            size, pos = uvarint(buf, pos)
            pos += size
            self.fields[(location, path, tag)] += 1
        self.section_bytes += pos - start
        return pos

    @staticmethod
    def compact_string(buf: bytes, pos: int) -> int:
        n, pos = uvarint(buf, pos)
        return pos + max(n - 1, 0)

    def api_versions(self, frame: bytes) -> None:
        pos = 4 + 2  # header v0, ErrorCode
        n, pos = uvarint(frame, pos)
        for _ in range(n - 1):
            pos = self.tags(frame, pos + 6, "body", "ApiKeys")
        pos = self.tags(frame, pos + 4, "body", "root")  # after ThrottleTimeMs
        assert pos == len(frame)

    def metadata_v12(self, frame: bytes) -> None:
        pos = self.tags(frame, 4, "header", "root")
        pos += 4  # ThrottleTimeMs
        n, pos = uvarint(frame, pos)
        for _ in range(n - 1):  # Brokers
            pos = self.compact_string(frame, pos + 4)  # NodeId, Host
            pos = self.compact_string(frame, pos + 4)  # Port, Rack
            pos = self.tags(frame, pos, "body", "Brokers")
        pos = self.compact_string(frame, pos)  # ClusterId
        pos += 4  # ControllerId
        n, pos = uvarint(frame, pos)
        for _ in range(n - 1):  # Topics
            pos = self.compact_string(frame, pos + 2)  # ErrorCode, Name
            pos += 16 + 1  # TopicId, IsInternal
            p, pos = uvarint(frame, pos)
            for _ in range(p - 1):  # Partitions
                pos += 2 + 4 + 4 + 4  # ErrorCode, PartitionIndex, LeaderId, LeaderEpoch
                for _ in range(3):  # ReplicaNodes, IsrNodes, OfflineReplicas
                    k, pos = uvarint(frame, pos)
                    pos += 4 * max(k - 1, 0)
                pos = self.tags(frame, pos, "body", "Topics.Partitions")
            pos = self.tags(frame, pos + 4, "body", "Topics")  # after TopicAuthorizedOperations
        pos = self.tags(frame, pos, "body", "root")
        assert pos == len(frame)


def unknown_tagged_fields(value, out: list) -> list:
    """Every (tag, bytes) under an `_unknown_tagged_fields` key of a decoded value."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "_unknown_tagged_fields":
                out.extend(v)
            else:
                unknown_tagged_fields(v, out)
    elif isinstance(value, list):
        for v in value:
            unknown_tagged_fields(v, out)
    return out


# ----------------------------------------------------------------------------- real traffic


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_metrics_match_real_client_traffic(codec: Codec):
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    listen_port = free_port()
    observer = MetricsObserver(topic_bytes=True, max_topics=100)
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}, codec=codec, observers=(observer,))
        observer.server = proxy.server
        proxy.start()
        try:
            base = {"bootstrap.servers": f"127.0.0.1:{listen_port}", "client.id": "metrics-test"}
            admin = AdminClient(dict(base))
            admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(TIMEOUT)
            with pytest.raises(KafkaException) as exc:
                admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(TIMEOUT)
            assert exc.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
            assert TOPIC in admin.list_topics(timeout=TIMEOUT).topics
            producer = Producer({**base, "compression.type": "lz4", "linger.ms": 5, "acks": "all"})
            delivered = []
            for i in range(RECORDS):
                producer.produce(TOPIC, value=b"metrics %d " % i * (i + 1),
                                 on_delivery=lambda err, msg: delivered.append(err))
            assert producer.flush(TIMEOUT) == 0
            assert delivered == [None] * RECORDS
            mid = samples(proxy, observer.registry)  # a scrape while the clients' connections are open
            assert mid[("kinspect_connections_open", ())] >= 1
            del admin, producer
            gc.collect()
            proxy.wait_idle()
            values = samples(proxy, observer.registry)
            server_connections = proxy.run(lambda: proxy.server.connections_total)
        finally:
            proxy.stop()

    events = list(proxy.events.events)
    requests = [e for e in events if type(e) is Request]
    responses = [e for e in events if type(e) is Response]
    exchanges = [e for e in events if type(e) is Exchange]
    problems = [e for e in events if type(e) is Problem]
    assert all(r.complete for r in requests + responses)

    # requests and responses per (api, version), and their sizes
    want = collections.Counter((r.api_name, str(r.api_version)) for r in requests)
    assert by_label(values, "kinspect_requests_total", "api", "version") == dict(want)
    assert {"ApiVersions", "Metadata", "CreateTopics", "Produce"} <= {api for api, _ in want}
    want = collections.Counter((r.api_name, str(r.api_version)) for r in responses)
    assert by_label(values, "kinspect_responses_total", "api", "version") == dict(want)
    assert total(values, "kinspect_request_size_bytes_sum") == sum(r.size for r in requests)
    assert total(values, "kinspect_request_size_bytes_count") == len(requests)
    assert total(values, "kinspect_response_size_bytes_sum") == sum(r.size for r in responses)
    assert total(values, "kinspect_header_size_bytes_sum", direction="request") == sum(r.header.size for r in requests)
    header_sizes = sum(codec.decode_response(r.frame, r.api_key, r.api_version).header_size for r in responses)
    assert total(values, "kinspect_header_size_bytes_sum", direction="response") == header_sizes
    for api in ("Produce", "Metadata"):
        assert total(values, "kinspect_request_size_bytes_sum", api=api) == sum(
            r.size for r in requests if r.api_name == api)

    # produced records and batches: what the producer sent, all lz4
    assert total(values, "kinspect_produced_records_total") == RECORDS
    assert total(values, "kinspect_produced_records_total", compression="lz4") == RECORDS
    produce_batches = sum(len(s.batches) for r in requests if r.api_name == "Produce" for s in r.scan().records)
    assert total(values, "kinspect_produced_batches_total", compression="lz4") == produce_batches >= 1

    # the nested error code of the second CreateTopics, and no other CreateTopics error
    assert values[("kinspect_response_errors_total", (("api", "CreateTopics"), ("error", "TOPIC_ALREADY_EXISTS")))] == 1
    assert total(values, "kinspect_response_errors_total", api="CreateTopics") == 1

    # latency: one observation per exchange with a response
    answered = [x for x in exchanges if x.response is not None]
    assert total(values, "kinspect_request_latency_seconds_count") == len(answered) > 0
    assert total(values, "kinspect_request_latency_seconds_sum") == pytest.approx(sum(x.latency for x in answered))

    # tagged fields: an independent walk of ApiVersions and Metadata v12 responses...
    walks = {"ApiVersions": TagWalk(), "Metadata": TagWalk()}
    for r in responses:
        if r.api_name == "ApiVersions" and r.api_version >= 3:
            walks["ApiVersions"].api_versions(r.frame)
        elif r.api_name == "Metadata" and r.api_version == 12:
            walks["Metadata"].metadata_v12(r.frame)
    assert walks["ApiVersions"].fields and walks["Metadata"].section_bytes
    for api, walk in walks.items():
        got = collections.Counter()
        for (n, labels), v in values.items():
            d = dict(labels)
            if n == "kinspect_tagged_fields_total" and d["api"] == api and d["direction"] == "response" and v:
                got[(d["location"], d["path"], int(d["tag"]))] += v
        assert dict(got) == {k: v for k, v in walk.fields.items()}, api
        assert total(values, "kinspect_tag_section_bytes_total", api=api, direction="response") == walk.section_bytes
    # ... and the unknown tagged fields kinspect's full decoder finds in every frame
    unknown = collections.Counter()
    for r in requests:
        d = codec.decode_request(r.frame)
        for _ in unknown_tagged_fields([d.header.fields, d.body], []):
            unknown[(r.api_name, "request")] += 1
    for r in responses:
        d = codec.decode_response(r.frame, r.api_key, r.api_version)
        for _ in unknown_tagged_fields([d.header, d.body], []):
            unknown[(r.api_name, "response")] += 1
    got = {k: v for k, v in by_label(values, "kinspect_tagged_fields_total", "api", "direction", "field").items()
           if k[2] == "unknown"}
    assert {(a, d): v for (a, d, _), v in got.items()} == dict(unknown)

    # topic bytes (opt-in): the frames naming the topic, split evenly among the topics they name
    topic_share = collections.Counter()
    for r in requests + responses:
        topics = r.scan().topics
        for t in topics:
            topic_share[(t, "request" if type(r) is Request else "response")] += r.size / len(topics)
    assert total(values, "kinspect_topic_bytes_total", topic=TOPIC, direction="request") == pytest.approx(
        topic_share[(TOPIC, "request")]) and topic_share[(TOPIC, "request")] > 0

    # problems, decode failures, connections, build info
    want = collections.Counter((p.kind, p.direction) for p in problems)
    assert by_label(values, "kinspect_problems_total", "kind", "direction") == dict(want)
    assert total(values, "kinspect_decode_failures_total") == 0
    assert total(values, "kinspect_unknown_api_requests_total") == 0
    assert values[("kinspect_connections_total", ())] == server_connections >= 2
    assert values[("kinspect_connections_open", ())] == 0
    assert values[("kinspect_inflight_requests", ())] == 0
    assert values[("kinspect_inflight_limit", ())] == proxy.config.inspect.max_inflight
    sent = sum(4 + r.size for r in requests)  # every client byte was a whole request frame
    # Relays closed since the last scrape are added from the server's closed_bytes when it keeps
    # one; otherwise only relays seen open at an earlier scrape count (here: those open at `mid`).
    for direction in ("request", "response"):
        key = ("kinspect_bytes_total", (("direction", direction),))
        assert 0 < mid[key] <= values[key]
    if getattr(proxy.server, "closed_bytes", None) is not None:
        assert values[("kinspect_bytes_total", (("direction", "request"),))] == sent
    assert values[("kinspect_bytes_total", (("direction", "request"),))] <= sent
    (info,) = [dict(labels) for (n, labels), v in values.items() if n == "kinspect_build_info" and v == 1]
    assert info["event_loop"] == "uvloop" and info["native"] in ("true", "false") and info["version"]


def test_observer_counts_problems_and_unknown_apis(codec: Codec):
    """Problems of every decode kind, unknown apis and a frame too large, through a Session."""
    from kinspect.session import ConnectionInfo, Session, SessionConfig
    from tests.support.proxy_harness import api_versions

    observer = MetricsObserver()
    session = Session(codec, ConnectionInfo(1, "c", "b"), SessionConfig(max_frame_bytes=1000))
    events = session.client_data(api_versions(codec, 1) + struct.pack(">ihhi", 12, 18, 99, 2)
                                 + struct.pack(">hh", -1, 0) + struct.pack(">ihhih", 10, 999, 0, 3, -1), 0.0).events
    events += session.broker_data(struct.pack(">i", 5000), 1.0).events  # frame too large
    for e in events:
        observer.on_event(e)
    r = observer.registry
    assert r.get_sample_value("kinspect_unknown_api_requests_total") == 2  # ApiVersions v99 and api key 999
    assert r.get_sample_value("kinspect_requests_total", {"api": "unknown", "version": "0"}) == 1
    assert r.get_sample_value("kinspect_problems_total", {"kind": "unknown_api", "direction": "request"}) == 2
    assert r.get_sample_value("kinspect_decode_failures_total",
                              {"api": "unknown", "direction": "response", "reason": "frame_too_large"}) == 1
    assert r.get_sample_value("kinspect_problems_total", {"kind": "frame_too_large", "direction": "response"}) == 1


# ----------------------------------------------------------------------------- HTTP endpoints


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def test_http_endpoints():
    upstream = free_port()  # nothing listens there: the endpoints do not need a broker
    observer = MetricsObserver()
    proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": "127.0.0.1:0",
                          "proxy.upstream": f"127.0.0.1:{upstream}"}, observers=(observer,))
    observer.server = proxy.server
    proxy.start()
    endpoints = HttpEndpoints(observer.registry, readiness_of(proxy.server))
    try:
        proxy.call(endpoints.start("127.0.0.1", 0))
        assert endpoints.port
        url = f"http://127.0.0.1:{endpoints.port}"
        status, body, content_type = get(url + "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        families = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
        for name, kind in CONTRACT.items():
            family = name[: -len("_total")] if kind == "counter" else name
            assert families.get(family) == kind, (name, families.get(family))
        assert "kinspect_build_info{" in body.decode() and 'event_loop="uvloop"' in body.decode()
        assert get(url + "/healthz")[:2] == (200, b"ok")
        assert get(url + "/readyz")[0] == 200
        assert get(url + "/nope")[0] == 404
        assert get(url + "/metrics?x=1")[0] == 200
        proxy.call(proxy.server.shutdown(0.0))  # listeners closed: no longer ready, still alive
        assert get(url + "/readyz")[0] == 503
        assert get(url + "/healthz")[0] == 200
    finally:
        proxy.call(endpoints.close())
        proxy.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{endpoints.port}/healthz", timeout=2)


def test_http_endpoints_reject_bad_requests():
    import asyncio
    import socket

    observer = MetricsObserver()

    async def run():
        endpoints = await HttpEndpoints(observer.registry, lambda: False).start()
        loop = asyncio.get_running_loop()

        def raw(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", endpoints.port), timeout=5) as s:
                s.sendall(data)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
                return out

        try:
            assert (await loop.run_in_executor(None, raw, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
            assert (await loop.run_in_executor(None, raw, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(
                b"HTTP/1.1 405")
            head = await loop.run_in_executor(None, raw, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
            assert (await loop.run_in_executor(None, raw, b"GET /readyz HTTP/1.0\r\n\r\n")).startswith(
                b"HTTP/1.1 503")
        finally:
            await endpoints.close()

    asyncio.run(run())
