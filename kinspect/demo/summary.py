"""The demo's summary: an observer counting requests, sizes and tagged fields, and the table it prints."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from kinspect.protocol.specs.api_keys import PRODUCE
from kinspect.session import DecodeError, Problem, Request, Response

MAX_SIZES = 100_000  # sizes kept per (api, version, direction): percentiles are over the latest ones
END_MARKER = "== end of summary =="


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100), at least 1
    return sorted_values[int(rank) - 1]


@dataclass
class ApiStats:
    """Counts and recent frame sizes of one (api, version)."""

    requests: int = 0
    responses: int = 0
    request_sizes: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SIZES))
    response_sizes: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SIZES))


class SummaryObserver:
    """Collects what the summary shows, from the proxy's events (call it on the proxy's loop only).

    Tagged fields are read from the events' scans, which are computed once per event and
    shared with the MetricsObserver; header tag sections are read as the metrics read them.
    """
    event_types = (Request, Response, Problem)

    needs_bodies = True

    def __init__(self) -> None:
        self.apis: dict[tuple[str, int], ApiStats] = {}
        # (api, version, direction, location, path, tag, name) -> count
        self.tagged: collections.Counter = collections.Counter()
        self.produced_records: collections.Counter = collections.Counter()  # compression -> records
        self.problems: collections.Counter = collections.Counter()  # kind -> count
        self.connections: set[int] = set()

    @property
    def total_requests(self) -> int:
        return sum(s.requests for s in self.apis.values())

    def _stats(self, name: str | None, version: int) -> ApiStats:
        key = (name or "unknown", version)
        stats = self.apis.get(key)
        if stats is None:
            stats = self.apis[key] = ApiStats()
        return stats

    def on_event(self, event) -> None:
        kind = type(event)
        if kind is Request:
            self._request(event)
        elif kind is Response:
            self._response(event)
        elif kind is Problem:
            self.problems[event.kind] += 1

    def _request(self, e: Request) -> None:
        self.connections.add(e.connection.id)
        stats = self._stats(e.api_name, e.api_version)
        stats.requests += 1
        stats.request_sizes.append(e.size)
        key = (e.api_name or "unknown", e.api_version, "request")
        for tag, _size in e.header_tags:
            self.tagged[(*key, "header", "", tag, None)] += 1
        scan = self._scan(e, key)
        if scan is not None and e.api_key == PRODUCE:
            for summary in scan.records:
                for batch in summary.batches if summary is not None else ():
                    self.produced_records[batch.compression] += max(0, batch.record_count)

    def _response(self, e: Response) -> None:
        stats = self._stats(e.api_name, e.api_version)
        stats.responses += 1
        stats.response_sizes.append(e.size)
        key = (e.api_name or "unknown", e.api_version, "response")
        for tag, _size in e.header_tags:
            self.tagged[(*key, "header", "", tag, None)] += 1
        self._scan(e, key)

    def _scan(self, e, key: tuple):
        if not e.complete or e.api_name is None:
            return None
        try:
            scan = e.scan()
        except DecodeError:
            return None
        for path, tag, name, _size in scan.tagged_fields:
            self.tagged[(*key, "body", path, tag, name)] += 1
        return scan


# ----------------------------------------------------------------------------- rendering


def _sizes(values) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return "/".join(f"{v:,}" for v in (percentile(ordered, 50), percentile(ordered, 90),
                                       percentile(ordered, 99), ordered[-1]))


def render_table(observer: SummaryObserver) -> list[str]:
    """Per (api, version): requests, responses, request and response sizes p50/p90/p99/max."""
    rows = [("api", "requests", "responses", "request B p50/p90/p99/max", "response B p50/p90/p99/max")]
    for (name, version), s in sorted(observer.apis.items()):
        rows.append((f"{name} v{version}", f"{s.requests:,}", f"{s.responses:,}",
                     _sizes(s.request_sizes), _sizes(s.response_sizes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in rows]


def render_tagged(observer: SummaryObserver) -> list[str]:
    """One line per tagged field seen: api, where (direction and header/body), tag, field name, count."""
    if not observer.tagged:
        return ["  (none)"]
    rows = [("api", "where", "tag", "field", "count")]
    for (name, version, direction, location, path, tag, field_name), count in sorted(
            observer.tagged.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3], kv[0][4], kv[0][5])):
        label = field_name or "(unknown to the specs)"
        rows.append((f"{name} v{version}", f"{direction} {location}", str(tag),
                     f"{path}.{label}" if path else label, f"{count:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(w) if i in (2, 4) else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def render_summary(observer: SummaryObserver, workload: list[str], locations: list[tuple[str, str]],
                   title: str = "kinspect demo: what kinspect saw") -> str:
    """The whole summary: workload lines, totals, the api table, tagged fields, where things are, END_MARKER."""
    requests = observer.total_requests
    responses = sum(s.responses for s in observer.apis.values())
    problems = sum(observer.problems.values())
    produced = sum(observer.produced_records.values())
    codecs = ", ".join(f"{c} {n:,}" for c, n in sorted(observer.produced_records.items()))
    lines = [f"== {title} ==", *workload,
             f"kinspect saw {len(observer.connections)} connections, {requests:,} requests, "
             f"{responses:,} responses, {problems:,} problems"
             + (f" ({', '.join(f'{k} {v}' for k, v in sorted(observer.problems.items()))})" if problems else ""),
             f"records in Produce requests: {produced:,}" + (f" ({codecs})" if codecs else ""),
             "", *render_table(observer), "", "tagged fields seen:", *render_tagged(observer), "",
             "where things are:"]
    width = max((len(k) for k, _ in locations), default=0)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in locations]
    lines.append(END_MARKER)
    return "\n".join(lines)
