"""The live client inventory (served at /clients) and its metrics: clients by software, and what an upgrade would break.

Counts are kept in plain dicts and exported by a custom collector registered on the
metrics observer's registry. Software names and versions come from the wire (KIP-511),
so their label values are capped as the metrics observer caps its own wire-made labels
(metrics.max_unknown_series): past the cap, a new software (name, version) counts as
("other", "other"), a new incompatible (target, api, version, software) as
(target, "other", "other", "other"), and each event so counted increments
kinspect_label_overflow_total{metric}. Values are sanitized and at most 65 characters.
"""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kinspect.protocol.codec import RequestHeader
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.protocol.codec.wire_program import optional_extension
from kinspect.protocol.errors import DecodeError
from kinspect.session.events import ConnectionInfo, Request, Response
from kinspect.upgrade.inventory import MAX_CLIENT_IDS, MAX_PAIRS, UNKNOWN, ConnectionRecord, Inventory
from kinspect.upgrade.targets import PRODUCE, Target, incompatible

UNSUPPORTED_VERSION = 35
API_VERSIONS = 18
OTHER = "other"

METRIC_NAMES = {
    "kinspect_client_connections_total": "counter",
    "kinspect_client_requests_total": "counter",
    "kinspect_upgrade_incompatible_requests_total": "counter",
    "kinspect_unsupported_version_responses_total": "counter",
}


class _Software:
    """The counters of one (software, software_version) label pair."""

    __slots__ = ("connections", "labels", "requests", "unsupported")

    def __init__(self, labels: tuple[str, str]) -> None:
        self.labels = labels
        self.connections = 0
        self.requests = 0
        self.unsupported = 0


class InventoryObserver:
    """Keeps the client inventory from Request and Response events and counts it for Prometheus."""
    event_types = (Request, Response)

    needs_bodies = True  # for dispatchers that do not ask wants_body()

    def __init__(self, targets: list[Target] = (), max_unknown_series: int = 200, label_overflow=None,
                 max_connections: int = 10000, api_name=None, native: bool = True) -> None:
        """native: requests and responses are noted in C (observers._inventory) where it is built; _request and
        _response below do what it leaves, and stay the reference."""
        self.targets = tuple(targets)  # fixed: the verdicts per (api, version, magics) are remembered
        self.max_unknown_series = max_unknown_series
        self.label_overflow = label_overflow  # the metrics observer's kinspect_label_overflow_total, if any
        self.inventory = Inventory(max_connections, api_name)
        self._unnamed = api_name is None
        self._wall_offset = time.time() - time.monotonic()  # events carry monotonic times
        self._software: dict[tuple, _Software] = {}
        self._incompatible: dict[tuple, list] = {}  # (target, api key, version, software) -> [labels, count]
        self._software_series = 0
        self._incompatible_series = 0
        self._records = self.inventory._records  # the records by key, least recently seen first
        # (api key, version, record magics) -> the targets that reject it (a request's verdicts depend on these alone)
        self._rejecting: dict[tuple, tuple] = {}
        noter = _noter(self) if native else None
        self.native = noter is not None
        # For the dispatcher: the C handlers where built (they call the two below for what they leave).
        self.handlers = ({Request: noter.request, Response: noter.response} if noter is not None
                         else {Request: self._request, Response: self._response})

    @staticmethod
    def wants_body(api_key: int, version: int, direction: str) -> bool:
        """Produce requests (their record magics) and ApiVersions responses (KIP-511's error 35) only."""
        return api_key == PRODUCE if direction == "request" else api_key == API_VERSIONS

    # ------------------------------------------------------------------ events

    def on_event(self, event) -> None:
        kind = type(event)
        if kind is Request:
            self._request(event)
        elif kind is Response:
            self._response(event)

    def _request(self, e: Request) -> None:
        conn = e.connection
        header = e.header
        software = (conn.client_software_name, conn.client_software_version)
        api_key, version = header.api_key, header.api_version
        if self._unnamed:  # no api_name given: name apis with the sessions' own specs
            self.inventory.api_name = e.codec.registry.api_name
            self._unnamed = False
        # The connection's record, now the most recently seen (Inventory.record's common case, inline:
        # a batch interleaves many connections' requests, so this runs for nearly every request).
        address = conn.client_address
        key = (conn.id, address)
        record = self._records.get(key)
        if record is not None:
            self._records.move_to_end(key)
            new = False
        else:
            record, new = self.inventory.record(key, address, conn.broker)
        magics = ()
        if api_key == PRODUCE and e.complete:
            magics = _magics(e)
        record.note(api_key, version, magics, e.time + self._wall_offset, header.client_id, software)
        counts = self._software.get(software)
        if counts is None:
            counts = self._counts(software)
        if new:
            counts.connections += 1
        counts.requests += 1
        if not self.targets:  # nothing to judge (the default): no verdict looked up or remembered
            return
        rejecting = self._rejecting.get((api_key, version, magics))
        if rejecting is None:
            rejecting = self._targets_rejecting(api_key, version, magics)
        for target in rejecting:
            self._incompatible_request(target, api_key, version, counts.labels[0], e.api_name)

    def _targets_rejecting(self, api_key: int, version: int, magics: tuple) -> tuple:
        """The targets that would reject such a request, once per (api, version, record magics)."""
        rejecting = tuple(t for t in self.targets if incompatible(t, api_key, version, magics) is not None)
        if len(self._rejecting) < 4096:  # versions a client invents must not grow it forever
            self._rejecting[(api_key, version, magics)] = rejecting
        return rejecting

    def _response(self, e: Response) -> None:
        # A broker answers an ApiVersions version it lacks with error 35 and a v0 body (KIP-511);
        # other apis at a version it lacks get the connection closed, not an error code.
        if e.api_key != API_VERSIONS or not e.complete:
            return
        try:
            codes = e.scan().error_codes
        except DecodeError:
            return
        count = codes.get(UNSUPPORTED_VERSION) if codes else None
        if not count:
            return
        conn = e.connection
        key = (conn.id, conn.client_address)
        record, _ = self.inventory.record(key, conn.client_address, conn.broker)
        record.unsupported_version += 1
        self._counts((conn.client_software_name, conn.client_software_version)).unsupported += 1

    # ------------------------------------------------------------------ capped labels

    def _counts(self, software: tuple) -> _Software:
        counts = self._software.get(software)
        if counts is not None:
            return counts
        if self._software_series >= self.max_unknown_series:
            self._overflowed("kinspect_client_requests_total")
            counts = self._software.get(OTHER)
            if counts is None:
                counts = self._software[OTHER] = _Software((OTHER, OTHER))
            return counts
        self._software_series += 1
        counts = self._software[software] = _Software((software[0] or UNKNOWN, software[1] or UNKNOWN))
        return counts

    def _incompatible_request(self, target: Target, api_key: int, version: int, software: str,
                              api_name: str | None) -> None:
        key = (target.name, api_key, version, software)
        entry = self._incompatible.get(key)
        if entry is None:
            if self._incompatible_series >= self.max_unknown_series:
                self._overflowed("kinspect_upgrade_incompatible_requests_total")
                key = (target.name, OTHER)
                entry = self._incompatible.get(key)
                if entry is None:
                    entry = self._incompatible[key] = [(target.name, OTHER, OTHER, OTHER), 0]
            else:
                self._incompatible_series += 1
                api = api_name or target.api_names.get(api_key) or UNKNOWN
                entry = self._incompatible[key] = [(target.name, api, str(version), software), 0]
        entry[1] += 1

    def _overflowed(self, metric: str) -> None:
        if self.label_overflow is not None:  # the metrics observer's family: a plain cell per label set
            self.label_overflow.cell((metric,))[0] += 1

    # ------------------------------------------------------------------ reading

    def clients_json(self) -> dict:
        """The /clients document: connections, clients grouped by software, and what each target rejects."""
        return self.inventory.to_json(self.targets)

    def collector(self) -> "InventoryCollector":
        return InventoryCollector(self)


def _magics(e: Request) -> tuple[int, ...]:
    """Distinct magic values of a Produce request's record batches, ascending."""
    try:
        scan = e.scan()
    except DecodeError:
        return ()
    if not scan.record_spans:
        return ()
    summaries = scan.records
    if len(summaries) == 1 and summaries[0] is not None:  # the common request: one records field
        batches = summaries[0].batches
        if len(batches) == 1:  # of one batch (what the set below gives, without building it)
            return (batches[0].magic,)
    seen = {batch.magic for summary in summaries if summary is not None for batch in summary.batches}
    return tuple(sorted(seen))


def _noter(observer: InventoryObserver):
    """The C handlers of an observer (kinspect/observers/_inventory.c), or None where not built or KINSPECT_PURE_PYTHON=1."""
    module = optional_extension("kinspect.observers._inventory")
    if module is None:
        return None
    try:
        return module.Noter(observer, (Request, RequestHeader, ConnectionInfo, ConnectionRecord, _Software, ScanResult,
                                       Response),
                            (PRODUCE, API_VERSIONS, MAX_CLIENT_IDS, MAX_PAIRS),
                            (observer._request, observer._response), _magics)
    except TypeError:  # a class without the slots it reads: the Python notes everything
        return None


class InventoryCollector(Collector):
    """Exports the inventory observer's counts at scrape time."""

    def __init__(self, observer: InventoryObserver) -> None:
        self.observer = observer

    def describe(self):
        return []  # collected at scrape time only

    def collect(self):
        software = list(self.observer._software.values())
        families = (
            ("kinspect_client_connections_total", "Client connections by KIP-511 software name and version "
             "(unknown before ApiVersions v3; capped by metrics.max_unknown_series)", "connections"),
            ("kinspect_client_requests_total", "Requests by the client's software name and version", "requests"),
        )
        for name, doc, attr in families:
            family = CounterMetricFamily(name, doc, labels=("software", "software_version"))
            for counts in software:
                family.add_metric(counts.labels, getattr(counts, attr))
            yield family
        family = CounterMetricFamily("kinspect_upgrade_incompatible_requests_total",
                                     "Requests an upgrade target ([upgrade] targets) would reject, by target, api, "
                                     "version and client software", labels=("target", "api", "version", "software"))
        for labels, count in list(self.observer._incompatible.values()):
            family.add_metric(labels, count)
        yield family
        family = CounterMetricFamily("kinspect_unsupported_version_responses_total",
                                     "Responses with error UNSUPPORTED_VERSION (35), by client software",
                                     labels=("software",))
        by_name: dict[str, int] = {}
        for counts in software:
            if counts.unsupported:
                by_name[counts.labels[0]] = by_name.get(counts.labels[0], 0) + counts.unsupported
        for name, count in sorted(by_name.items()):
            family.add_metric((name,), count)
        yield family


__all__ = ["METRIC_NAMES", "InventoryCollector", "InventoryObserver"]
