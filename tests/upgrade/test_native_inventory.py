"""The inventory's handlers in C (kinspect.observers._inventory.Noter) against InventoryObserver._request/_response.

Two observers, one whose handlers are the C Noter's and one whose handlers are the Python methods,
are given the same events (each its own replay of the same reads, so that neither sees a scan the
other made): every recorded conversation, on connections that come back and are forgotten, with
upgrade targets that reject some requests, with software labels past their cap, with client ids
and (api, version) pairs past theirs, Produce requests scanned before the inventory sees them (as
the metrics do in the proxy) or not. /clients, the exported metrics and what was forgotten must be
the same. Then a leak test.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import kinspect.upgrade.inventory as inventory_module
from kinspect.observers.inventory import API_VERSIONS, PRODUCE, InventoryObserver, _magics, _Software
from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.session import Session
from kinspect.session.events import ConnectionInfo, Request, Response
from kinspect.session.replay import replay
from kinspect.upgrade.inventory import ConnectionRecord
from kinspect.upgrade.targets import load_target
from tests.support.native import bytes_grown, native_module
from tests.support.relay_stubs import CONVERSATIONS, conversation
from tests.upgrade.test_inventory import api_versions_error_35, api_versions_v3

_inventory, _MISSING = native_module("kinspect.observers._inventory")

CLASSES = (Request, RequestHeader, ConnectionInfo, ConnectionRecord, _Software, ScanResult)


@pytest.fixture(autouse=True)
def built():
    if _inventory is None:
        pytest.fail(_MISSING)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def _events(codec: Codec, plays: list, scan_requests: bool, backwards: bool = False) -> list:
    """Each (connection id, address, conversation) replayed on its own session; with scan_requests every
    complete request and response is scanned first (the metrics observer does so in the proxy); requests
    later and later (or, backwards, earlier and earlier: what a clock stepped back gives)."""
    events, clock = [], itertools.count(100_000, -1 if backwards else 1)
    for connection_id, address, (requests, responses) in plays:
        session = Session(codec, ConnectionInfo(connection_id, address, "b:1"))
        for step in replay(session, requests, responses, float(next(clock))):
            for event in step:
                if type(event) is Request:
                    event.time = float(next(clock))  # each request later than the one before
                if scan_requests and type(event) in (Request, Response) and event.complete:
                    try:
                        event.scan()
                    except Exception:  # noqa: BLE001 (the inventory is told of the DecodeError itself)
                        pass
                events.append(event)
    return events


def _outcome(observer: InventoryObserver) -> tuple:
    registry = CollectorRegistry()
    registry.register(observer.collector())
    document = observer.clients_json()
    return document, generate_latest(registry).decode(), observer.inventory.forgotten, len(observer._rejecting)


def _both(codec: Codec, plays: list, scan_requests: bool = True, backwards: bool = False, **options) -> tuple:
    native = InventoryObserver(**options)
    python = InventoryObserver(native=False, **options)
    assert native.native and not python.native
    python._wall_offset = native._wall_offset  # the C handler holds its own from the start
    outcomes = []
    for observer in (native, python):
        for event in _events(codec, plays, scan_requests, backwards):
            handler = observer.handlers.get(type(event))
            if handler is not None:
                handler(event)
        outcomes.append(_outcome(observer))
    return tuple(outcomes)


def _plays(connections: int, rounds: int = 1) -> list:
    """Every recorded conversation, spread over `connections` connection ids, `rounds` times."""
    return [(i % connections, f"10.0.0.{i % connections}:5{i % connections:04d}", conversation(path))
            for i, path in enumerate(CONVERSATIONS * rounds)]


@pytest.mark.parametrize("scan_requests", [True, False])
def test_recorded_conversations_give_the_same_inventory_and_metrics(codec, scan_requests):
    native, python = _both(codec, _plays(len(CONVERSATIONS)), scan_requests)
    document = native[0]
    assert len(document["connections"]) == len(CONVERSATIONS) and len(document["clients"]) >= 3
    assert any(r["record_magics"] == [2] for c in document["connections"] for r in c["requests"])
    assert native == python


@pytest.mark.parametrize("backwards", [False, True])
@pytest.mark.parametrize("connections", [3, 7])
def test_connections_that_come_back_and_are_forgotten_alike(codec, connections, backwards):
    native, python = _both(codec, _plays(connections, rounds=2), backwards=backwards, max_connections=4)
    assert (native[2] > 0) == (connections > 4) and len(native[0]["connections"]) == min(connections, 4)
    assert native == python


def test_targets_that_reject_requests_alike(codec):
    targets = [load_target("4.3.1"), load_target("3.9.2")]
    removed = b"".join(_request(codec, cid, "old", 2, 0, {"ReplicaId": -1, "Topics": []}) for cid in range(5))
    plays = _plays(len(CONVERSATIONS)) + [(99, "10.0.0.99:1", (removed, b"")), (1, "10.0.0.1:50001", (removed, b""))]
    native, python = _both(codec, plays, targets=targets)
    assert "kinspect_upgrade_incompatible_requests_total{" in native[1]  # some requests were rejected
    assert native == python


def test_software_labels_past_their_cap_alike(codec):
    native, python = _both(codec, _plays(len(CONVERSATIONS)), max_unknown_series=1)
    assert 'software="other"' in native[1]
    assert native == python


def _request(codec: Codec, cid: int, client_id: str, api_key: int = 3, version: int = 12, body=None) -> bytes:
    body = body if body is not None else {
        3: {"Topics": None, "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False},
        18: {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}}[api_key]
    frame = codec.encode_request({"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": cid,
                                  "ClientId": client_id}, body)
    return struct.pack(">i", len(frame)) + frame


def test_client_ids_and_pairs_past_their_caps_alike(codec, monkeypatch):
    """A connection's client ids and (api, version) pairs are capped (small caps here, for both)."""
    monkeypatch.setattr(inventory_module, "MAX_CLIENT_IDS", 2)
    monkeypatch.setattr(inventory_module, "MAX_PAIRS", 3)
    requests = b"".join(_request(codec, cid, f"id-{cid % 4}", *pair)
                        for cid, pair in enumerate([(3, v) for v in range(4, 13)] * 2 + [(18, 3), (18, 2)]))
    plays = [(1, "10.0.0.1:1", (requests, b""))]
    outcomes = []
    for native in (True, False):
        observer = InventoryObserver(native=False)
        observer._wall_offset = 0.0  # before the Noter, which holds it
        if native:  # the C handlers with the same small caps
            noter = _inventory.Noter(observer, CLASSES, (PRODUCE, API_VERSIONS, 2, 3),
                                     (observer._request, observer._response), _magics)
            observer.handlers = {Request: noter.request, Response: noter.response}
        for event in _events(codec, plays, True):
            observer.handlers.get(type(event), lambda e: None)(event)
        outcomes.append(_outcome(observer))
    connection = outcomes[0][0]["connections"][0]
    assert connection["client_ids"] == ["id-0", "id-1"] and connection["dropped_requests"] > 0
    assert len(connection["requests"]) == 3
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("scanned", [True, False])
def test_only_api_versions_responses_not_known_to_be_free_of_error_35_are_handed_to_python(codec, scanned):
    seen = []
    observer = InventoryObserver(native=False)
    noter = _inventory.Noter(observer, CLASSES, (PRODUCE, API_VERSIONS, 16, 256),
                             (observer._request, seen.append), _magics)
    responses = [e for e in _events(codec, _plays(len(CONVERSATIONS))[:6], scanned) if type(e) is Response]
    for event in responses:
        noter.response(event)
    api_versions = [e for e in responses if e.api_key == API_VERSIONS]
    assert api_versions and seen == ([] if scanned else api_versions)


def test_error_35_answers_are_counted_alike(codec):
    """KIP-511: a broker answers an ApiVersions version it lacks with error 35; the client asks again lower."""
    requests = api_versions_v3(b"old-client", b"0.1", 1) + api_versions_v3(b"old-client", b"0.1", 2)
    requests += _request(codec, 3, "old")
    answers = api_versions_error_35(1) + api_versions_error_35(2)
    plays = [(1, "10.0.0.1:1", (requests, answers)), (2, "10.0.0.2:2", (requests, answers))]
    native, python = _both(codec, plays + _plays(len(CONVERSATIONS)))
    assert 'kinspect_unsupported_version_responses_total{software="old-client"} 4.0' in native[1]
    assert native == python


def test_a_noter_needs_the_slots_it_reads():
    observer = InventoryObserver(native=False)

    class Loose:
        pass

    with pytest.raises(TypeError, match="has no slot"):
        _inventory.Noter(observer, (Loose,) + CLASSES[1:], (PRODUCE, API_VERSIONS, 16, 256),
                         (observer._request, observer._response), _magics)
    with pytest.raises(RuntimeError, match="not initialized"):
        _inventory.Noter.__new__(_inventory.Noter).request(None)
    with pytest.raises(TypeError, match="6 classes"):
        _inventory.Noter(observer, CLASSES[:2], (PRODUCE, API_VERSIONS, 16, 256),
                         (observer._request, observer._response), _magics)


def test_many_requests_leave_no_garbage(codec):
    """What the C handlers take, make and update is released (run long enough to show a leak)."""
    observer = InventoryObserver()
    events = _events(codec, _plays(4), True)

    def rounds():
        for event in events:
            handler = observer.handlers.get(type(event))
            if handler is not None:
                handler(event)

    grown = bytes_grown(rounds, 10)
    assert grown < 16 * 1024, grown


@pytest.mark.parametrize("scan_requests", [True, False])
def test_the_c_handler_does_the_requests_of_known_connections(codec, scan_requests):
    """Only a connection's firsts (its first request, a new software, a verdict to make) go to Python, and a
    Produce's magics only when its scan was not made before (the proxy's metrics make it first)."""
    observer = InventoryObserver(native=False)
    left, magics = [], []
    noter = _inventory.Noter(observer, CLASSES, (PRODUCE, API_VERSIONS, 16, 256),
                             (lambda e: (left.append(e), observer._request(e)), observer._response),
                             lambda e: (magics.append(e), _magics(e))[1])
    requests = [e for e in _events(codec, _plays(len(CONVERSATIONS), rounds=3), scan_requests) if type(e) is Request]
    for event in requests:
        noter.request(event)
    produces = [e for e in requests if e.api_key == PRODUCE]
    assert len(left) < 0.4 * len(requests) and [e for e in produces if e not in left]
    assert len(magics) == (0 if scan_requests else len(produces))  # (asked before the handler knows it is left)


def test_a_pair_whose_record_magics_change_gains_them_alike(codec):
    """A connection's Produce requests of one version carrying another magic (read from the scan's summaries)."""
    outcomes = []
    for native in (True, False):
        observer = InventoryObserver(native=native)
        observer._wall_offset = 0.0
        if native:  # the handlers again, holding the offset set above
            observer.handlers = {Request: _inventory.Noter(observer, CLASSES, (PRODUCE, API_VERSIONS, 16, 256),
                                                          (observer._request, observer._response), _magics).request}
        produced = 0
        for event in _events(codec, _plays(len(CONVERSATIONS), rounds=2), True):
            if type(event) is not Request:
                continue
            if event.api_key == PRODUCE and event.complete:
                produced += 1
                summaries = event.scan()._summaries
                if produced % 3 == 0 and len(summaries) == 1 and summaries[0] is not None:
                    summary = summaries[0]
                    batches = tuple(b._replace(magic=produced % 2) for b in summary.batches)
                    summaries[0] = summary._replace(batches=batches)
            observer.handlers[Request](event)
        outcomes.append(_outcome(observer))
    magics = {tuple(r["record_magics"]) for c in outcomes[0][0]["connections"] for r in c["requests"]}
    assert (0, 1, 2) in magics or (0, 2) in magics or (1, 2) in magics
    assert outcomes[0] == outcomes[1]
