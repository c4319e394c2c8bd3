"""The metrics observer as it was before issue 12 (prometheus_client counters and histograms): the reference.

kinspect/observers/metrics.py now aggregates into plain structures and renders them at
scrape time; tests/observers/test_metrics_equivalence.py checks that, fed the same events,
both give the same /metrics text. This is kinspect 0.x's MetricsObserver line for line,
except that the header facts come from the events' contract attributes (header_size,
header_tag_bytes, header_tags, known) instead of being parsed here, so that it keeps
working when the session is rebuilt; it never runs in the proxy.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from kinspect.observers.metrics import (COMPRESSIONS, DECODE_PROBLEMS, HEADER_BUCKETS, LATENCY_BUCKETS, PRODUCE,
                                        SIZE_BUCKETS, ServerCollector)
from kinspect.protocol.error_codes import ERROR_NAMES, error_name
from kinspect.protocol.errors import DecodeError
from kinspect.session.events import Exchange, Problem, Request, Response


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


class ReferenceMetricsObserver:
    """Counts and measures the proxy's events into a prometheus_client registry."""

    needs_bodies = True

    def __init__(self, registry: CollectorRegistry | None = None, topic_bytes: bool = False, max_topics: int = 100,
                 server=None, max_unknown_series: int = 200) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
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

    def _children(self, cache: dict, key: tuple[int, int], api_name: str | None, direction: str, known: bool,
                  codec) -> _Children:
        api = api_name or "unknown"
        if direction == "request":
            count, size = self.requests, self.request_size
        else:
            count, size = self.responses, self.response_size
        self._codec = codec
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
        key = (e.api_key, e.api_version)
        c = self._req.get(key)
        if c is None:
            c = self._children(self._req, key, e.api_name, "request", e.known, getattr(e, "codec", None))
        c.count.inc()
        c.size.observe(e.size)
        c.header.observe(e.header_size)
        if not c.known:
            return  # an unknown_api Problem comes with it
        tag_bytes = 0
        if e.header_version >= 2:  # flexible header: ClientId then a tag section
            tag_bytes = e.header_tag_bytes
            for tag, size in e.header_tags:
                self._tagged_field(c.api, "request", "header", "", tag, None, size)
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
            c = self._children(self._resp, key, e.api_name, "response", e.known, getattr(e, "codec", None))
        c.count.inc()
        c.size.observe(e.size)
        tag_bytes = 0
        if e.header_version >= 1:
            c.header.observe(e.header_size)
            tag_bytes = e.header_tag_bytes
            for tag, size in e.header_tags:
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



__all__ = ["ReferenceMetricsObserver"]
