"""Prometheus metrics from the proxy's events (names, types and labels: the kinspect metrics contract).

`MetricsObserver.on_event` turns Request, Response, Exchange and Problem events into
counter and histogram updates on the event loop thread: plain lists ("cells", see
metric_families) updated in place, without prometheus_client's per-update locks, and
rendered by a collector at scrape time with the names, help texts, labels and buckets
prometheus_client's Counter and Histogram gave (tests/observers/test_metrics_equivalence.py
checks the /metrics text against that reference on recorded traffic). The cells of one
(api key, version, direction) are looked up once and kept in a plan, so a frame costs one
dict lookup, a few list increments and one scan of its body, unless the same small body
was seen (and scanned) just before (see MetricsObserver._scan).
The connection, byte and in-flight figures come from the ProxyServer's stats snapshot at
scrape time, by ServerCollector, whose describe() names its families (a clash fails at
registration); kinspect_build_info is a prometheus_client Info, and the process, platform
and GC collectors (RSS, descriptors, CPU, GC) share the registry, which auto-describes them.

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
- `wants_body(api_key, version, direction)` says whether a scan of such a body can change
  a metric (scan_needs: flexible versions, responses with *ErrorCode fields, Produce
  requests with records, topic names when topic_bytes is on), for the pipeline to decide
  which frames to keep whole. A whole body is scanned all the same, as before, so that a
  malformed one counts in decode_failures_total (only bodies with no field at all, whose
  scan reads nothing, are not); a body the pipeline did not keep is counted and measured
  without a scan, like a frame above the inspection limit.
- Label values that come from the wire rather than the specs (versions of unknown apis or
  versions, tags of unknown tagged fields, unknown error codes) are capped together at
  max_unknown_series distinct series; past it they count under "other", as topics do past
  max_topics, and each event so counted increments label_overflow_total{metric}.
"""

from __future__ import annotations

import asyncio
import sys
from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, GCCollector, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import kinspect
from kinspect.observers.metric_families import CounterFamily, FamiliesCollector, HistogramFamily
from kinspect.observers.scan_needs import body_can_fail, metrics_scan_needed
from kinspect.protocol.error_codes import ERROR_NAMES, error_name
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.codec import RequestHeader
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.protocol.codec.wire_program import optional_extension
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
# The histograms' bounds with +Inf, and where each cell keeps its sum (see metric_families).
_SIZE_BOUNDS = (*SIZE_BUCKETS, float("inf"))
_HEADER_BOUNDS = (*HEADER_BUCKETS, float("inf"))
_LATENCY_BOUNDS = (*LATENCY_BUCKETS, float("inf"))
_SIZE_SUM, _HEADER_SUM, _LATENCY_SUM = len(_SIZE_BOUNDS), len(_HEADER_BOUNDS), len(_LATENCY_BOUNDS)
_HEADER_V0_BUCKET = bisect_left(_HEADER_BOUNDS, 4)  # a response header v0: the correlation id alone
# Memo of small bodies' scans per (api key, version, direction) (see MetricsObserver._scan).
MEMO_BODY_BYTES = 1024
MEMO_ENTRIES = 4
MEMO_TRIAL = 256
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
    "kinspect_inspection_cpu_seconds_total": "counter",
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

class _Plan:
    """What one (api key, version, direction) updates: its cells, its api label, and whether to scan its bodies."""

    __slots__ = ("api", "count", "errors", "header", "hits", "known", "lookups", "memo", "scan", "size", "tag_bytes",
                 "tagged", "tagged_last", "memo_last")

    def __init__(self, api: str, count: list, size: list, header: list, tag_bytes: list, known: bool,
                 scan: bool) -> None:
        self.api = api
        self.count = count
        self.size = size
        self.header = header
        self.tag_bytes = tag_bytes
        self.known = known
        self.scan = scan
        self.tagged: dict[tuple, tuple[list, list]] = {}  # (path, tag, name) of a body tagged field -> its cells
        # kinspect/observers/_counting.c's: the last scan's tagged-field list (a memoized body's, met again as the
        # same list) and the cells of each of its fields, so that the same body's fields are not looked up again.
        self.tagged_last: tuple | None = None
        self.errors: dict[int, list] = {}  # error code -> its response_errors cell
        # Small bodies seen before -> their scan (or the DecodeError); None: not memoized (see _scan).
        self.memo: dict[bytes, object] | None = {} if scan else None
        # kinspect/observers/_counting.c's: the memo's last (body, outcome), compared before a key is made (a
        # connection's bodies come again and again); always an entry of memo, so dropped when memo is cleared.
        self.memo_last: tuple | None = None
        self.lookups = 0
        self.hits = 0


def _native_counter(observer: "MetricsObserver"):
    """The C counting of requests, responses and exchanges (observers._counting), calling the observer's
    Python handlers for what it leaves; None where it is not built, or KINSPECT_PURE_PYTHON=1."""
    counting = optional_extension("kinspect.observers._counting")
    if counting is None:
        return None
    try:
        return counting.Counter(observer, (Request, Response, Exchange, RequestHeader, _Plan, ScanResult),
                       (_SIZE_BOUNDS, _HEADER_BOUNDS, _LATENCY_BOUNDS, _HEADER_V0_BUCKET),
                       (MEMO_BODY_BYTES, MEMO_ENTRIES, MEMO_TRIAL),
                       (observer._request, observer._response, observer._exchange),
                       (observer._decode_failure, observer._body_tagged_fields, observer._produced_records,
                        observer._topic_bytes, observer._error_codes), DecodeError)
    except TypeError:  # a class without the slots it reads: Python counts everything
        return None


class MetricsObserver:
    """Counts and measures the proxy's events into plain cells, exported through the registry at scrape time."""

    needs_bodies = True

    def __init__(self, registry: CollectorRegistry | None = None, topic_bytes: bool = False, max_topics: int = 100,
                 server=None, max_unknown_series: int = 200, codec=None, native: bool = True) -> None:
        """native: requests, responses and exchanges are counted in C (observers._counting) where it is built;
        _request, _response and _exchange below count what it leaves, and stay the reference."""
        # auto_describe: collectors without describe() (the process, platform and GC ones) are
        # collected once at registration, so their names clash-check like every other family's.
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.topic_bytes = topic_bytes
        self.max_topics = max_topics
        self.server = server
        self.max_unknown_series = max_unknown_series
        self.codec = codec  # the sessions' codec when known up front (wants_body reads its specs)
        self._unknown_series = 0  # series made so far for label values not in the specs
        self.requests = CounterFamily("kinspect_requests_total", "Requests seen, by api and version",
                                      ("api", "version"))
        self.responses = CounterFamily("kinspect_responses_total", "Responses seen, by api and version",
                                       ("api", "version"))
        self.request_size = HistogramFamily("kinspect_request_size_bytes",
                                            "Request frame sizes (without the size prefix)", ("api",), SIZE_BUCKETS)
        self.response_size = HistogramFamily("kinspect_response_size_bytes",
                                             "Response frame sizes (without the size prefix)", ("api",), SIZE_BUCKETS)
        self.header_size = HistogramFamily("kinspect_header_size_bytes", "Request and response header sizes",
                                           ("api", "direction"), HEADER_BUCKETS)
        self.tag_section_bytes = CounterFamily("kinspect_tag_section_bytes_total",
                                               "Bytes of tag sections (headers and bodies, empty ones included)",
                                               ("api", "direction"))
        labels = ("api", "direction", "location", "path", "tag", "field")
        self.tagged_fields = CounterFamily("kinspect_tagged_fields_total", "Tagged fields present", labels)
        self.tagged_field_bytes = CounterFamily("kinspect_tagged_field_bytes_total", "Data bytes of tagged fields",
                                                labels)
        self.latency = HistogramFamily("kinspect_request_latency_seconds", "Seconds from request seen to response seen",
                                       ("api",), LATENCY_BUCKETS)
        self.response_errors = CounterFamily("kinspect_response_errors_total",
                                             "Non-zero error codes in responses (nested ones included)",
                                             ("api", "error"))
        self.produced_records = CounterFamily("kinspect_produced_records_total", "Records in Produce requests",
                                              ("compression",))
        self.produced_batches = CounterFamily("kinspect_produced_batches_total", "Record batches in Produce requests",
                                              ("compression",))
        self.topic_bytes_total = CounterFamily("kinspect_topic_bytes_total",
                                               "Frame bytes by the topics they name (opt-in, capped; the rest: other)",
                                               ("topic", "direction"))
        self.decode_failures = CounterFamily("kinspect_decode_failures_total", "Frames kinspect could not decode",
                                             ("api", "direction", "reason"))
        self.unknown_api = CounterFamily("kinspect_unknown_api_requests_total",
                                         "Requests whose api key or version no loaded spec defines")
        self.problems = CounterFamily("kinspect_problems_total", "Problems the sessions reported",
                                      ("kind", "direction"))
        self.label_overflow = CounterFamily("kinspect_label_overflow_total",
                                            "Events counted under an \"other\" label: the label's distinct values "
                                            "reached their cap (metrics.max_topics, metrics.max_unknown_series)",
                                            ("metric",))
        self.families = FamiliesCollector((
            self.requests, self.responses, self.request_size, self.response_size, self.header_size,
            self.tag_section_bytes, self.tagged_fields, self.tagged_field_bytes, self.latency, self.response_errors,
            self.produced_records, self.produced_batches, self.topic_bytes_total, self.decode_failures,
            self.unknown_api, self.problems, self.label_overflow))
        self.registry.register(self.families)
        self._collector = ServerCollector(self)
        self.registry.register(self._collector)
        # Registered after ServerCollector, which settles the event loop's name at a scrape
        # before this is collected (see ServerCollector.collect).
        self.build_info = Info("kinspect_build", "kinspect's version, Python, event loop and native codec",
                               registry=self.registry)
        self.build_info.info(build_labels(event_loop_name()))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._unknown_api_cell = self.unknown_api.cell(())
        # caches of cells, keyed by what the events carry
        self._req: dict[tuple[int, int], _Plan] = {}
        self._resp: dict[tuple[int, int], _Plan] = {}
        self._req_overflow: dict[str, _Plan] = {}  # api name -> plan of version "other"
        self._resp_overflow: dict[str, _Plan] = {}
        self._wants: dict[tuple[int, int, str], bool] = {}  # (api key, version, direction) -> scan its bodies
        self._tagged: dict[tuple, tuple[list, list]] = {}
        self._errors: dict[tuple[str, int | str], list] = {}
        self._latency: dict[str, list] = {}
        self._produced: dict[str, tuple[list, list]] = {}
        self._decode_failures: dict[tuple, list] = {}
        self._problems: dict[tuple[str, str], list] = {}
        self._topics: dict[tuple[str, str], tuple[list, bool]] = {}
        self._topic_names: set[str] = set()
        self._overflow: dict[str, list] = {}  # metric -> its label_overflow cell
        self._codec = None  # the sessions' codec, once an event brought it (names the api of a Problem)
        # For the dispatcher: each event type's method (one call per event, no switch on the type).
        self.handlers = {Request: self._request, Response: self._response, Exchange: self._exchange,
                         Problem: self._problem}
        counter = _native_counter(self) if native else None
        if counter is not None:
            self.handlers.update({Request: counter.request, Response: counter.response, Exchange: counter.exchange})

    # ------------------------------------------------------------------ body policy

    def wants_body(self, api_key: int, version: int, direction: str) -> bool:
        """Whether a scan of bodies of this (api key, version, direction) can change a metric (scan_needs).

        For the pipeline: False means the metrics read nothing from such bodies, so the frames
        need not be kept whole for them (they are then counted and measured without a scan).
        """
        key = (api_key, version, direction)
        wanted = self._wants.get(key)
        if wanted is None:
            codec = self.codec or (self.server.codec if self.server is not None else None) or self._codec
            if codec is None:
                return True  # no specs to judge by yet: keep the body
            wanted = self._wants[key] = metrics_scan_needed(codec.registry.message(api_key, direction, version),
                                                           api_key, version, direction, self.topic_bytes)
        return wanted

    def _scan_worth(self, api_key: int, version: int, direction: str, codec) -> bool:
        """Whether to scan whole bodies of a known version: for the facts it holds, or to find it malformed."""
        codec = codec or self.codec or (self.server.codec if self.server is not None else None)
        if codec is None:
            return True
        spec = codec.registry.message(api_key, direction, version)
        return self.wants_body(api_key, version, direction) or body_can_fail(spec, version)

    # ------------------------------------------------------------------ events

    def on_event(self, event) -> None:
        handler = self.handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _exchange(self, event: Exchange) -> None:
        latency = event.latency
        if event.response is not None and latency is not None:
            api = event.request.api_name or "unknown"
            cell = self._latency.get(api)
            if cell is None:
                cell = self._latency[api] = self.latency.cell((api,))
            cell[bisect_left(_LATENCY_BOUNDS, latency)] += 1
            cell[_LATENCY_SUM] += latency

    def _plan(self, cache: dict, key: tuple[int, int], e, direction: str) -> _Plan:
        api = e.api_name or "unknown"
        if direction == "request":
            count, size = self.requests, self.request_size
        else:
            count, size = self.responses, self.response_size
        codec = getattr(e, "codec", None)
        if codec is not None:
            self._codec = codec
        known = bool(e.known)
        if not known and not self._new_unknown_series():
            # Past the cap: one shared "other" version per api name, not cached by (key, version),
            # so neither the families nor this cache grow with what a client invents.
            overflow = self._req_overflow if direction == "request" else self._resp_overflow
            plan = overflow.get(api)
            if plan is None:
                plan = overflow[api] = _Plan(api, count.cell((api, "other")), size.cell((api,)),
                                             self.header_size.cell((api, direction)),
                                             self.tag_section_bytes.cell((api, direction)), False, False)
            self._overflowed("kinspect_requests_total" if direction == "request" else "kinspect_responses_total")
            return plan
        scan = known and self._scan_worth(key[0], key[1], direction, codec)
        plan = _Plan(api, count.cell((api, str(key[1]))), size.cell((api,)), self.header_size.cell((api, direction)),
                     self.tag_section_bytes.cell((api, direction)), known, scan)
        if key[0] == PRODUCE and direction == "request":
            plan.memo = None  # record batches: never the same twice, and summarized from their own frame
        cache[key] = plan
        return plan

    def _new_unknown_series(self) -> bool:
        """Whether one more series for a label value not in the specs fits under the cap (taken if so)."""
        if self._unknown_series >= self.max_unknown_series:
            return False
        self._unknown_series += 1
        return True

    def _overflowed(self, metric: str) -> None:
        cell = self._overflow.get(metric)
        if cell is None:
            cell = self._overflow[metric] = self.label_overflow.cell((metric,))
        cell[0] += 1

    def _request(self, e: Request) -> None:
        header = e.header  # read once: the event's api_key, header_size... are properties of it
        key = (header.api_key, header.api_version)
        c = self._req.get(key)
        if c is None:
            c = self._plan(self._req, key, e, "request")
        c.count[0] += 1
        size = e.size
        cell = c.size
        cell[bisect_left(_SIZE_BOUNDS, size)] += 1
        cell[_SIZE_SUM] += size
        header_size = header.size
        cell = c.header
        cell[bisect_left(_HEADER_BOUNDS, header_size)] += 1
        cell[_HEADER_SUM] += header_size
        if not c.known:
            return  # an unknown_api Problem comes with it
        tag_bytes = 0
        if header.version >= 2:  # flexible header: ClientId then a tag section
            tag_bytes = e.header_tag_bytes
            if tag_bytes > 1:  # more than an empty section's count byte
                for tag, n in e.header_tags:
                    self._tagged_field(c.api, "request", "header", "", tag, None, n)
        scan = None
        if c.scan and e.complete:
            scan = self._scan(c, e, header_size)
            if scan is None:
                self._decode_failure(c.api, "request", "decode_error")
            else:
                tag_bytes += scan.tag_section_bytes
                if scan.tagged_fields:
                    self._body_tagged_fields(c, "request", scan.tagged_fields)
        if tag_bytes:
            c.tag_bytes[0] += tag_bytes
        if scan is None:
            return
        if key[0] == PRODUCE and scan.record_spans:
            self._produced_records(scan.records)
        if self.topic_bytes and scan.topics:
            self._topic_bytes(scan.topics, size, "request")

    def _response(self, e: Response) -> None:
        key = (e.api_key, e.api_version)
        c = self._resp.get(key)
        if c is None:
            c = self._plan(self._resp, key, e, "response")
        c.count[0] += 1
        size = e.size
        cell = c.size
        cell[bisect_left(_SIZE_BOUNDS, size)] += 1
        cell[_SIZE_SUM] += size
        cell = c.header
        tag_bytes = 0
        if e.header_version >= 1:
            header_size = e.header_size
            cell[bisect_left(_HEADER_BOUNDS, header_size)] += 1
            cell[_HEADER_SUM] += header_size
            tag_bytes = e.header_tag_bytes
            if tag_bytes > 1:
                for tag, n in e.header_tags:
                    self._tagged_field(c.api, "response", "header", "", tag, None, n)
        else:
            cell[_HEADER_V0_BUCKET] += 1
            cell[_HEADER_SUM] += 4
        scan = None
        if c.scan and e.complete:
            # The memo's key is all after the correlation id, the header's tag section included:
            # the scan reads the header too, and fails with it when it is malformed.
            scan = self._scan(c, e, 4)
            if scan is None:
                self._decode_failure(c.api, "response", "decode_error")
            else:
                tag_bytes += scan.tag_section_bytes
                if scan.tagged_fields:
                    self._body_tagged_fields(c, "response", scan.tagged_fields)
        if tag_bytes:
            c.tag_bytes[0] += tag_bytes
        if scan is None:
            return
        if scan.error_codes:
            self._error_codes(c, scan.error_codes)
        if self.topic_bytes and scan.topics:
            self._topic_bytes(scan.topics, size, "response")

    @staticmethod
    def _scan(c: _Plan, e, body_start: int) -> ScanResult | None:
        """The event's scan, None if its body is malformed; a small body seen before is not scanned again.

        The facts a scan gives the metrics depend only on the bytes it reads (for a given api,
        version and direction): the body from body_start, where the key starts (for responses
        4, after the correlation id, so that the header's tag section, which the scan also
        reads, is part of the key). Small bodies repeat: ApiVersions, Metadata refreshes,
        heartbeats, empty fetches. So each plan remembers its last few small bodies (up to
        MEMO_BODY_BYTES, MEMO_ENTRIES of them) with their scan; a body seen before costs a
        slice and a hash instead of a scan. Produce requests (their record batches) are not
        memoized, and a plan whose bodies rarely repeat stops memoizing after MEMO_TRIAL
        lookups with fewer than half found.
        """
        memo = c.memo
        if memo is None or e.size - body_start > MEMO_BODY_BYTES:  # e.size: a FramePieces' len() counts pieces
            try:
                return e.scan()
            except DecodeError:
                return None
        body = e.frame[body_start:]
        if type(body) is not bytes:
            body = bytes(body)  # a memoryview or bytearray frame: a hashable copy of the body
        outcome = memo.get(body)
        c.lookups += 1
        if outcome:
            # The same bytes scan the same: the event takes the remembered scan, so that the other
            # observers that ask for it (inventory, capture) do not scan the body again either.
            e.adopt_scan(outcome)
            c.hits += 1
        elif outcome is None:
            try:
                outcome = e.scan()
            except DecodeError:
                outcome = False
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
                c.memo_last = None
            memo[body] = outcome
        else:
            c.hits += 1
        if c.lookups >= MEMO_TRIAL:
            if 2 * c.hits < c.lookups:
                c.memo = None  # these bodies do not repeat: hashing them is wasted
            c.lookups = c.hits = 0
        return outcome or None

    def _error_codes(self, c: _Plan, codes: dict[int, int]) -> None:
        known = c.errors
        for code, count in codes.items():
            cell = known.get(code)
            if cell is None:
                cell = self._error_cell(c.api, code, count)
                if cell is None:
                    continue  # counted under "other"
                known[code] = cell
            cell[0] += count

    def _error_cell(self, api: str, code: int, count: int) -> list | None:
        """The cell of (api, code); None past the cap for unknown codes, which are then counted under "other"."""
        errors = self._errors
        cell = errors.get((api, code))
        if cell is None:
            if code not in ERROR_NAMES and not self._new_unknown_series():
                cell = errors.get((api, "other"))
                if cell is None:
                    cell = errors[(api, "other")] = self.response_errors.cell((api, "other"))
                self._overflowed("kinspect_response_errors_total")
                cell[0] += count
                return None
            cell = errors[(api, code)] = self.response_errors.cell((api, error_name(code)))
        return cell

    def _body_tagged_fields(self, c: _Plan, direction: str, fields: list) -> None:
        known = c.tagged
        for path, tag, name, size in fields:
            cells = known.get((path, tag, name))
            if cells is None:
                cells = self._tagged_cells(c.api, direction, "body", path, tag, name)
                if cells[2]:
                    known[(path, tag, name)] = cells
            cells[0][0] += 1
            if size:
                cells[1][0] += size

    def _tagged_field(self, api: str, direction: str, location: str, path: str, tag: int, name: str | None,
                      size: int) -> None:
        cells = self._tagged_cells(api, direction, location, path, tag, name)
        cells[0][0] += 1
        if size:
            cells[1][0] += size

    def _tagged_cells(self, api: str, direction: str, location: str, path: str, tag: int,
                      name: str | None) -> tuple[list, list, bool]:
        """The (count, bytes) cells of a tagged field, and whether they are its own (False: "other", past the cap)."""
        key = (api, direction, location, path, tag, name)
        cells = self._tagged.get(key)
        if cells is None:
            if name is None and not self._new_unknown_series():
                # An unknown tag is any number a client chose: past the cap it counts as tag "other".
                key = (api, direction, location, path, "other", None)
                cells = self._tagged.get(key)
                self._overflowed("kinspect_tagged_fields_total")
                if cells is None:
                    labels = (api, direction, location, path or "root", "other", "unknown")
                    cells = self._tagged[key] = (self.tagged_fields.cell(labels),
                                                 self.tagged_field_bytes.cell(labels), False)
                return cells
            labels = (api, direction, location, path or "root", str(tag), name or "unknown")
            cells = self._tagged[key] = (self.tagged_fields.cell(labels), self.tagged_field_bytes.cell(labels), True)
        return cells

    def _produced_records(self, summaries) -> None:
        produced = self._produced
        for summary in summaries:
            if summary is None:
                continue
            for batch in summary.batches:
                compression = batch.compression
                cells = produced.get(compression)
                if cells is None:
                    label = compression if compression in COMPRESSIONS else "unknown"
                    cells = produced[compression] = (self.produced_records.cell((label,)),
                                                     self.produced_batches.cell((label,)))
                if batch.record_count > 0:
                    cells[0][0] += batch.record_count
                cells[1][0] += 1

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
                entry = (self.topic_bytes_total.cell((label, direction)), label == "other")
                if label != "other" or len(cache) < 4 * self.max_topics + 1024:
                    cache[(topic, direction)] = entry
            entry[0][0] += share
            if entry[1]:
                self._overflowed("kinspect_topic_bytes_total")

    def _decode_failure(self, api: str, direction: str, reason: str) -> None:
        key = (api, direction, reason)
        cell = self._decode_failures.get(key)
        if cell is None:
            cell = self._decode_failures[key] = self.decode_failures.cell(key)
        cell[0] += 1

    def _problem(self, p: Problem) -> None:
        key = (p.kind, p.direction)
        cell = self._problems.get(key)
        if cell is None:
            cell = self._problems[key] = self.problems.cell(key)
        cell[0] += 1
        if p.kind in DECODE_PROBLEMS:
            api = "unknown"
            codec = self.server.codec if self.server is not None else (self.codec or self._codec)
            if p.api_key is not None and codec is not None:
                api = codec.registry.api_name(p.api_key) or "unknown"
            self._decode_failure(api, p.direction, p.kind)
        elif p.kind == "unknown_api":
            self._unknown_api_cell[0] += 1


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
        from kinspect.protocol.codec.wire_program import native_available

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
     "Inspection failures (inspector bugs); the bytes still flow, and pairing and rewriting go on", ()),
    ("kinspect_tasks", "gauge", "asyncio tasks alive on the proxy's event loop", ()),
    ("kinspect_inspection_cpu_seconds_total", "counter",
     "CPU seconds spent inspecting forwarded reads in batches, apart from forwarding them (reads inspected at "
     "once, in rewrite mode or with inspect.batch_delay_ms 0, are not counted)", ()),
)


def _family(name: str, kind: str, documentation: str, labels: tuple[str, ...]):
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, documentation, labels=labels)


class ServerCollector(Collector):
    """Connections, bytes, in-flight requests, limits and failures from the server's stats snapshot, and build_info.

    bytes_total counts what kinspect received from clients (direction request) and from
    brokers (direction response), open and closed connections alike.
    """

    def __init__(self, observer: MetricsObserver) -> None:
        self.observer = observer
        self._loop_name: str | None = None

    def describe(self):
        return [_family(*spec) for spec in SERVER_FAMILIES]

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

    @staticmethod
    def _values(server) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Every family's samples, from one stats snapshot of the server (zeros before there is one)."""
        stats = server.stats() if server is not None else None
        if stats is None:
            zero = {"timeout": 0, "refused": 0, "error": 0}
            return {name: ([((reason,), 0) for reason in zero] if name == "kinspect_upstream_connect_failures_total"
                           else [(("request",), 0), (("response",), 0)] if name == "kinspect_bytes_total"
                           else [((), 0)]) for name, *_ in SERVER_FAMILIES}
        return {
            "kinspect_connections_open": [((), stats.connections_open)],
            "kinspect_connections_total": [((), stats.connections_total)],
            "kinspect_bytes_total": [(("request",), stats.bytes_from_clients), (("response",), stats.bytes_from_brokers)],
            "kinspect_inflight_requests": [((), stats.inflight)],
            "kinspect_inflight_limit": [((), stats.inflight_limit)],
            "kinspect_connections_limit": [((), stats.connections_limit)],
            "kinspect_connections_refused_total": [((), stats.connections_refused)],
            "kinspect_upstream_connect_failures_total": [((reason,), count)
                                                         for reason, count in stats.connect_failures.items()],
            "kinspect_inspection_failures_total": [((), stats.inspection_failures)],
            "kinspect_tasks": [((), stats.tasks)],
            "kinspect_inspection_cpu_seconds_total": [((), stats.inspection_cpu_seconds)],
        }


__all__ = ["METRIC_NAMES", "RUNTIME_METRIC_NAMES", "MetricsObserver", "ServerCollector", "event_loop_name"]
