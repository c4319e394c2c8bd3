"""Prometheus metrics from the proxy's events (names, types and labels: the kinspect metrics contract).

`MetricsObserver.on_event` turns Request, Response, Exchange and Problem events into
counter and histogram updates; the connection, byte and in-flight figures are read from
the ProxyServer at scrape time by a custom collector whose describe() names its families (a
clash fails at registration); kinspect_build_info is a prometheus_client Info, and the
process, platform and GC collectors (RSS, descriptors, CPU, GC) share the registry, which
auto-describes them. Label children are looked up once
per label set and cached in plain dicts, so a frame costs a few dict lookups, the
`.inc()`/`.observe()` calls and (for complete frames) one scan of the frame.

Choices the contract leaves open:
- tag_section_bytes_total counts every tag section of a frame: the body's (from the scan)
  and the header's (request header v2, response header v1).
- Header tagged fields are all unknown to the specs (RequestHeader v2 and ResponseHeader
  v1 define none): location="header", path="root", field="unknown".
- unknown_api_requests_total counts the session's unknown_api Problems: one per request
  whose api key or version no loaded spec defines (a Request whose api_name is None always
  comes with such a Problem, so counting both would count it twice).
- topic_bytes_total (opt-in) splits a frame's size evenly among the topics it names.
- A frame larger than the inspection limit (kept by its header only) is counted and
  measured but not scanned.
- Label values that come from the wire rather than the specs (versions of unknown apis or
  versions, tags of unknown tagged fields, unknown error codes) are capped together at
  max_unknown_series distinct series; past it they count under "other", as topics do past
  max_topics, and each event so counted increments label_overflow_total{metric}.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import kinspect
from kinspect.protocol.error_codes import ERROR_NAMES, error_name
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.peek import tag_section_fields
from kinspect.protocol.primitives import Malformed
from kinspect.session.events import Exchange, Problem, Request, Response

PRODUCE = 0


def _exponential(start: float, factor: float, stop: float) -> tuple[float, ...]:
    out, value = [], start
    while value <= stop * 1.000001:
        out.append(value)
        value *= factor
    return tuple(out)


SIZE_BUCKETS = _exponential(16, 4, 256 * 1024 * 1024)  # 16 B .. 256 MiB, x4
HEADER_BUCKETS = _exponential(8, 2, 4096)  # 8 .. 4096 B, x2
LATENCY_BUCKETS = _exponential(50e-6, 2, 60.0)  # 50 us .. ~52 s, x2
COMPRESSIONS = frozenset(("none", "gzip", "snappy", "lz4", "zstd"))
DECODE_PROBLEMS = frozenset(("decode_error", "frame_too_large"))


# Every metric kinspect exports, with its type: the deploy/ dashboard and alert rules are
# checked against this (tests/deploy/test_deploy.py).
METRIC_NAMES = {
    "kinspect_requests_total": "counter",
    "kinspect_responses_total": "counter",
    "kinspect_request_size_bytes": "histogram",
    "kinspect_response_size_bytes": "histogram",
    "kinspect_header_size_bytes": "histogram",
    "kinspect_tag_section_bytes_total": "counter",
    "kinspect_tagged_fields_total": "counter",
    "kinspect_tagged_field_bytes_total": "counter",
    "kinspect_request_latency_seconds": "histogram",
    "kinspect_response_errors_total": "counter",
    "kinspect_produced_records_total": "counter",
    "kinspect_produced_batches_total": "counter",
    "kinspect_topic_bytes_total": "counter",
    "kinspect_decode_failures_total": "counter",
    "kinspect_unknown_api_requests_total": "counter",
    "kinspect_problems_total": "counter",
    "kinspect_connections_open": "gauge",
    "kinspect_connections_total": "counter",
    "kinspect_bytes_total": "counter",
    "kinspect_inflight_requests": "gauge",
    "kinspect_inflight_limit": "gauge",
    "kinspect_build_info": "gauge",
    "kinspect_label_overflow_total": "counter",
    "kinspect_connections_limit": "gauge",
    "kinspect_connections_refused_total": "counter",
    "kinspect_upstream_connect_failures_total": "counter",
    "kinspect_inspection_failures_total": "counter",
    "kinspect_tasks": "gauge",
}

# The process itself, from prometheus_client's process, platform and GC collectors registered
# on the same registry (Linux /proc; a memory-bounded sidecar shows its RSS and descriptors).
# Not kinspect_ names: tests/deploy checks the dashboard against these too.
RUNTIME_METRIC_NAMES = {
    "process_virtual_memory_bytes": "gauge",
    "process_resident_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_cpu_seconds_total": "counter",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "python_info": "gauge",
    "python_gc_objects_collected_total": "counter",
    "python_gc_objects_uncollectable_total": "counter",
    "python_gc_collections_total": "counter",
}

class _Children:
    """The label children of one (api key, version, direction)."""

    __slots__ = ("api", "count", "header", "known", "size", "tag_bytes")

    def __init__(self, api, count, size, header, tag_bytes, known) -> None:
        self.api = api
        self.count = count
        self.size = size
        self.header = header
        self.tag_bytes = tag_bytes
        self.known = known


class MetricsObserver:
    """Counts and measures the proxy's events into a prometheus_client registry."""

    needs_bodies = True

    def __init__(self, registry: CollectorRegistry | None = None, topic_bytes: bool = False, max_topics: int = 100,
                 server=None, max_unknown_series: int = 200) -> None:
        # auto_describe: collectors without describe() (the process, platform and GC ones) are
        # collected once at registration, so their names clash-check like every other family's.
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.topic_bytes = topic_bytes
        self.max_topics = max_topics
        self.server = server
        self.max_unknown_series = max_unknown_series
        self._unknown_series = 0  # series made so far for label values not in the specs
        r = self.registry
        self.requests = Counter("kinspect_requests_total", "Requests seen, by api and version",
                                ("api", "version"), registry=r)
        self.responses = Counter("kinspect_responses_total", "Responses seen, by api and version",
                                 ("api", "version"), registry=r)
        self.request_size = Histogram("kinspect_request_size_bytes", "Request frame sizes (without the size prefix)",
                                      ("api",), buckets=SIZE_BUCKETS, registry=r)
        self.response_size = Histogram("kinspect_response_size_bytes",
                                       "Response frame sizes (without the size prefix)",
                                       ("api",), buckets=SIZE_BUCKETS, registry=r)
        self.header_size = Histogram("kinspect_header_size_bytes", "Request and response header sizes",
                                     ("api", "direction"), buckets=HEADER_BUCKETS, registry=r)
        self.tag_section_bytes = Counter("kinspect_tag_section_bytes_total",
                                         "Bytes of tag sections (headers and bodies, empty ones included)",
                                         ("api", "direction"), registry=r)
        labels = ("api", "direction", "location", "path", "tag", "field")
        self.tagged_fields = Counter("kinspect_tagged_fields_total", "Tagged fields present", labels, registry=r)
        self.tagged_field_bytes = Counter("kinspect_tagged_field_bytes_total", "Data bytes of tagged fields",
                                          labels, registry=r)
        self.latency = Histogram("kinspect_request_latency_seconds", "Seconds from request seen to response seen",
                                 ("api",), buckets=LATENCY_BUCKETS, registry=r)
        self.response_errors = Counter("kinspect_response_errors_total",
                                       "Non-zero error codes in responses (nested ones included)",
                                       ("api", "error"), registry=r)
        self.produced_records = Counter("kinspect_produced_records_total", "Records in Produce requests",
                                        ("compression",), registry=r)
        self.produced_batches = Counter("kinspect_produced_batches_total", "Record batches in Produce requests",
                                        ("compression",), registry=r)
        self.topic_bytes_total = Counter("kinspect_topic_bytes_total",
                                         "Frame bytes by the topics they name (opt-in, capped; the rest: other)",
                                         ("topic", "direction"), registry=r)
        self.decode_failures = Counter("kinspect_decode_failures_total", "Frames kinspect could not decode",
                                       ("api", "direction", "reason"), registry=r)
        self.unknown_api = Counter("kinspect_unknown_api_requests_total",
                                   "Requests whose api key or version no loaded spec defines", registry=r)
        self.problems = Counter("kinspect_problems_total", "Problems the sessions reported",
                                ("kind", "direction"), registry=r)
        self.label_overflow = Counter("kinspect_label_overflow_total",
                                      "Events counted under an \"other\" label: the label's distinct values reached "
                                      "their cap (metrics.max_topics, metrics.max_unknown_series)",
                                      ("metric",), registry=r)
        self.unknown_api_child = self.unknown_api  # no labels: the metric is its own child
        self._collector = ServerCollector(self)
        r.register(self._collector)
        # Registered after ServerCollector, which settles the event loop's name at a scrape
        # before this is collected (see ServerCollector.collect).
        self.build_info = Info("kinspect_build", "kinspect's version, Python, event loop and native codec",
                               registry=r)
        self.build_info.info(build_labels(event_loop_name()))
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # label-children caches
        self._req: dict[tuple[int, int], _Children] = {}
        self._resp: dict[tuple[int, int], _Children] = {}
        self._req_overflow: dict[str, _Children] = {}  # api name -> children of version "other"
        self._resp_overflow: dict[str, _Children] = {}
        self._tagged: dict[tuple, tuple] = {}
        self._errors: dict[tuple[str, int], object] = {}
        self._latency: dict[str, object] = {}
        self._produced: dict[str, tuple] = {}
        self._decode_failures: dict[tuple, object] = {}
        self._problems: dict[tuple[str, str], object] = {}
        self._topics: dict[tuple[str, str], object] = {}
        self._topic_names: set[str] = set()
        self._overflow: dict[str, object] = {}  # metric -> its label_overflow child
        self._codec = None  # the sessions' codec, once an event brought it (names the api of a Problem)

    # ------------------------------------------------------------------ events

    def on_event(self, event) -> None:
        kind = type(event)
        if kind is Request:
            self._request(event)
        elif kind is Response:
            self._response(event)
        elif kind is Exchange:
            if event.response is not None and event.latency is not None:
                api = event.request.api_name or "unknown"
                child = self._latency.get(api)
                if child is None:
                    child = self._latency[api] = self.latency.labels(api)
                child.observe(event.latency)
        elif kind is Problem:
            self._problem(event)

    def _children(self, cache: dict, key: tuple[int, int], api_name: str | None, direction: str, codec) -> _Children:
        api = api_name or "unknown"
        if direction == "request":
            count, size = self.requests, self.request_size
        else:
            count, size = self.responses, self.response_size
        self._codec = codec
        known = codec.registry.message(key[0], direction, key[1]) is not None
        version = str(key[1])
        if not known and not self._new_unknown_series():
            # Past the cap: one shared "other" version per api name, not cached by (key, version),
            # so neither the registry nor this cache grows with what a client invents.
            overflow = self._req_overflow if direction == "request" else self._resp_overflow
            children = overflow.get(api)
            if children is None:
                children = overflow[api] = _Children(
                    api, count.labels(api, "other"), size.labels(api), self.header_size.labels(api, direction),
                    self.tag_section_bytes.labels(api, direction), False)
            self._overflowed("kinspect_requests_total" if direction == "request" else "kinspect_responses_total")
            return children
        children = _Children(api, count.labels(api, version), size.labels(api),
                             self.header_size.labels(api, direction), self.tag_section_bytes.labels(api, direction),
                             known)
        cache[key] = children
        return children

    def _new_unknown_series(self) -> bool:
        """Whether one more series for a label value not in the specs fits under the cap (taken if so)."""
        if self._unknown_series >= self.max_unknown_series:
            return False
        self._unknown_series += 1
        return True

    def _overflowed(self, metric: str) -> None:
        child = self._overflow.get(metric)
        if child is None:
            child = self._overflow[metric] = self.label_overflow.labels(metric)
        child.inc()

    def _request(self, e: Request) -> None:
        header = e.header
        key = (header.api_key, header.api_version)
        c = self._req.get(key)
        if c is None:
            c = self._children(self._req, key, e.api_name, "request", e.codec)
        c.count.inc()
        c.size.observe(e.size)
        c.header.observe(header.size)
        if not c.known:
            return  # an unknown_api Problem comes with it
        tag_bytes = 0
        if header.version >= 2:  # flexible header: ClientId then a tag section
            frame = e.frame
            n = int.from_bytes(frame[8:10], "big", signed=True)
            tag_bytes = header.size - 10 - (max(0, n))
            unknown = header.fields.get("_unknown_tagged_fields")
            if unknown:
                for tag, data in unknown:
                    self._tagged_field(c.api, "request", "header", "", tag, None, len(data))
        scan = self._scan(e, c, "request", tag_bytes, e.complete)
        if scan is None:
            return
        if key[0] == PRODUCE and scan.record_spans:
            self._produced_records(scan.records)
        if self.topic_bytes and scan.topics:
            self._topic_bytes(scan.topics, e.size, "request")

    def _scan(self, e, c, direction: str, tag_bytes: int, scannable: bool):
        """Scan a body (None if it cannot be); count tag-section bytes, header's included, and tagged fields."""
        scan = None
        if scannable:
            try:
                scan = e.scan()
            except DecodeError:
                self._decode_failure(c.api, direction, "decode_error")
        if scan is not None:
            tag_bytes += scan.tag_section_bytes
            for path, tag, name, size in scan.tagged_fields:
                self._tagged_field(c.api, direction, "body", path, tag, name, size)
        if tag_bytes:
            c.tag_bytes.inc(tag_bytes)
        return scan

    def _response(self, e: Response) -> None:
        key = (e.api_key, e.api_version)
        c = self._resp.get(key)
        if c is None:
            c = self._children(self._resp, key, e.api_name, "response", e.codec)
        c.count.inc()
        c.size.observe(e.size)
        frame = e.frame
        tag_bytes = 0
        if e.header_version >= 1:
            try:
                fields, end = tag_section_fields(frame, 4)
            except (IndexError, Malformed):
                fields, end = (), min(len(frame), 5)
            c.header.observe(end)
            tag_bytes = end - 4
            for tag, size in fields:
                self._tagged_field(c.api, "response", "header", "", tag, None, size)
        else:
            c.header.observe(4)
        scan = self._scan(e, c, "response", tag_bytes, e.complete and c.known)
        if scan is None:
            return
        if scan.error_codes:
            errors = self._errors
            for code, count in scan.error_codes.items():
                child = errors.get((c.api, code))
                if child is None:
                    name = error_name(code)
                    if code not in ERROR_NAMES and not self._new_unknown_series():
                        child = errors.get((c.api, "other"))
                        if child is None:
                            child = errors[(c.api, "other")] = self.response_errors.labels(c.api, "other")
                        self._overflowed("kinspect_response_errors_total")
                        child.inc(count)
                        continue
                    child = errors[(c.api, code)] = self.response_errors.labels(c.api, name)
                child.inc(count)
        if self.topic_bytes and scan.topics:
            self._topic_bytes(scan.topics, e.size, "response")

    def _tagged_field(self, api: str, direction: str, location: str, path: str, tag: int, name: str | None,
                      size: int) -> None:
        key = (api, direction, location, path, tag, name)
        children = self._tagged.get(key)
        if children is None:
            if name is None and not self._new_unknown_series():
                # An unknown tag is any number a client chose: past the cap it counts as tag "other".
                key = (api, direction, location, path, "other", None)
                children = self._tagged.get(key)
                self._overflowed("kinspect_tagged_fields_total")
            if children is None:
                labels = (api, direction, location, path or "root", str(key[4]), name or "unknown")
                children = self._tagged[key] = (self.tagged_fields.labels(*labels),
                                                self.tagged_field_bytes.labels(*labels))
        children[0].inc()
        if size:
            children[1].inc(size)

    def _produced_records(self, summaries) -> None:
        produced = self._produced
        for summary in summaries:
            if summary is None:
                continue
            for batch in summary.batches:
                compression = batch.compression
                children = produced.get(compression)
                if children is None:
                    label = compression if compression in COMPRESSIONS else "unknown"
                    children = produced[compression] = (self.produced_records.labels(label),
                                                        self.produced_batches.labels(label))
                if batch.record_count > 0:
                    children[0].inc(batch.record_count)
                children[1].inc()

    def _topic_bytes(self, topics: Iterable[str], size: int, direction: str) -> None:
        share = size / len(topics)
        cache = self._topics
        for topic in topics:
            entry = cache.get((topic, direction))
            if entry is None:
                names = self._topic_names
                if topic not in names and len(names) >= self.max_topics:
                    label = "other"
                else:
                    names.add(topic)
                    label = topic
                entry = (self.topic_bytes_total.labels(label, direction), label == "other")
                if label != "other" or len(cache) < 4 * self.max_topics + 1024:
                    cache[(topic, direction)] = entry
            entry[0].inc(share)
            if entry[1]:
                self._overflowed("kinspect_topic_bytes_total")

    def _decode_failure(self, api: str, direction: str, reason: str) -> None:
        key = (api, direction, reason)
        child = self._decode_failures.get(key)
        if child is None:
            child = self._decode_failures[key] = self.decode_failures.labels(api, direction, reason)
        child.inc()

    def _problem(self, p: Problem) -> None:
        key = (p.kind, p.direction)
        child = self._problems.get(key)
        if child is None:
            child = self._problems[key] = self.problems.labels(p.kind, p.direction)
        child.inc()
        if p.kind in DECODE_PROBLEMS:
            api = "unknown"
            codec = self.server.codec if self.server is not None else self._codec
            if p.api_key is not None and codec is not None:
                api = codec.registry.api_name(p.api_key) or "unknown"
            self._decode_failure(api, p.direction, p.kind)
        elif p.kind == "unknown_api":
            self.unknown_api_child.inc()


# ---------------------------------------------------------------------- scrape-time figures


def event_loop_name() -> str:
    """'uvloop' if the running loop (or, outside one, the loop policy) is uvloop's, else 'asyncio'."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        policy = type(asyncio.get_event_loop_policy())
        return "uvloop" if policy.__module__.startswith("uvloop") else "asyncio"
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _native() -> str:
    try:
        from kinspect.protocol.wire_program import native_available

        return "true" if native_available() else "false"
    except Exception:  # noqa: BLE001 (a broken native build must not break scraping)
        return "false"


def build_labels(loop_name: str) -> dict[str, str]:
    """kinspect_build_info's labels."""
    return {"version": kinspect.__version__, "python": "{}.{}.{}".format(*sys.version_info[:3]),
            "event_loop": loop_name, "native": _native()}


# ServerCollector's families: (name, type, help, label names). describe() returns them without
# samples, so a clash with another collector's name fails when either is registered.
SERVER_FAMILIES = (
    ("kinspect_connections_open", "gauge", "Client connections open", ()),
    ("kinspect_connections_total", "counter", "Client connections accepted", ()),
    ("kinspect_bytes_total", "counter", "Bytes relayed, by direction", ("direction",)),
    ("kinspect_inflight_requests", "gauge", "Requests awaiting a response", ()),
    ("kinspect_inflight_limit", "gauge", "Requests tracked per connection at most (inspect.max_inflight)", ()),
    ("kinspect_connections_limit", "gauge", "Client connections allowed at once (proxy.max_connections)", ()),
    ("kinspect_connections_refused_total", "counter",
     "Client connections refused and closed: proxy.max_connections reached, or stopping", ()),
    ("kinspect_upstream_connect_failures_total", "counter",
     "Failed attempts to connect to a broker, by reason (timeout: proxy.connect_timeout)", ("reason",)),
    ("kinspect_inspection_failures_total", "counter",
     "Directions of connections no longer inspected after an inspector bug (bytes still flow)", ()),
    ("kinspect_tasks", "gauge", "asyncio tasks alive on the proxy's event loop", ()),
)


def _family(name: str, kind: str, documentation: str, labels: tuple[str, ...]):
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, documentation, labels=labels)


class ServerCollector(Collector):
    """Connections, bytes and in-flight requests read from the ProxyServer at scrape time.

    bytes_total counts what kinspect received from clients (direction request) and from
    brokers (direction response): the open relays' counters plus the server's running
    total of closed relays' bytes when it keeps one (`closed_bytes`, keyed like
    Relay.bytes_in). Without it, the collector remembers the relays it saw at earlier
    scrapes and adds their final counts when they close; a connection that opened and
    closed between two scrapes is then missed.
    """

    def __init__(self, observer: MetricsObserver) -> None:
        self.observer = observer
        self._loop_name: str | None = None
        self._seen: set = set()  # relays seen open (fallback accounting of closed relays)
        self._closed = {"client": 0, "broker": 0}

    def describe(self):
        return [_family(*spec) for spec in SERVER_FAMILIES]

    def _relays(self, server) -> list:
        for _ in range(5):
            try:
                return list(server.relays)
            except RuntimeError:  # the set changed size while copied from another thread
                continue
        return []

    def collect(self):
        self._settle_loop_name()
        values = self._values(self.observer.server)
        for spec in SERVER_FAMILIES:
            family = _family(*spec)
            for labels, value in values[spec[0]]:
                family.add_metric(labels, value)
            yield family

    def _settle_loop_name(self) -> None:
        """The first scrape made on a running loop names it in kinspect_build_info (until then: the policy's)."""
        if self._loop_name is not None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._loop_name = event_loop_name()
        self.observer.build_info.info(build_labels(self._loop_name))

    def _values(self, server) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        open_, total, inflight, limit = 0, 0, 0, 0
        sent = {"client": 0, "broker": 0}
        if server is not None:
            relays = self._relays(server)
            open_ = len(relays)
            total = server.connections_total
            inflight = sum(relay.session.inflight for relay in relays)
            limit = server.config.inspect.max_inflight
            closed = getattr(server, "closed_bytes", None)
            if closed is None:
                now = set(relays)
                for relay in self._seen - now:
                    for side in ("client", "broker"):
                        self._closed[side] += relay.bytes_in[side]
                self._seen = now
                closed = self._closed
            for side in ("client", "broker"):
                sent[side] = closed.get(side, 0) + sum(relay.bytes_in[side] for relay in relays)
        values = {
            "kinspect_connections_open": [((), open_)],
            "kinspect_connections_total": [((), total)],
            "kinspect_bytes_total": [(("request",), sent["client"]), (("response",), sent["broker"])],
            "kinspect_inflight_requests": [((), inflight)],
            "kinspect_inflight_limit": [((), limit)],
        }
        values.update(self._limits_and_failures(server))
        return values

    @staticmethod
    def _limits_and_failures(server) -> dict[str, list]:
        """The connection limit and its refusals, failed broker connects, inspection failures, loop tasks."""
        config = getattr(server, "config", None)
        failures = getattr(server, "connect_failures", None) or {"timeout": 0, "refused": 0, "error": 0}
        tasks = 0
        loop = getattr(server, "loop", None)
        if loop is not None and not loop.is_closed():
            for _ in range(5):
                try:
                    tasks = len(asyncio.all_tasks(loop))  # done tasks are not counted
                    break
                except RuntimeError:  # the task set changed while read from another thread
                    continue
        return {
            "kinspect_connections_limit": [((), config.proxy.max_connections if config is not None else 0)],
            "kinspect_connections_refused_total": [((), getattr(server, "refused_connections", 0))],
            "kinspect_upstream_connect_failures_total": [((reason,), count) for reason, count in failures.items()],
            "kinspect_inspection_failures_total": [((), getattr(server, "inspection_failures", 0))],
            "kinspect_tasks": [((), tasks)],
        }


__all__ = ["METRIC_NAMES", "RUNTIME_METRIC_NAMES", "MetricsObserver", "ServerCollector", "event_loop_name"]
