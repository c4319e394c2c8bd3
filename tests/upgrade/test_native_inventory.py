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

CLASSES = (Request, RequestHeader, ConnectionInfo, ConnectionRecord, _Software, ScanResult, Response)


@pytest.fixture(autouse=True)
def built():
    if _inventory is None:
        pytest.fail(_MISSING)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def _events(codec: Codec, plays: list, scan_requests: bool, backwards: bool = False,
            interleaved: bool = False) -> list:
    """Each (connection id, address, conversation) replayed on its own session; with scan_requests every
    complete request and response is scanned first (the metrics observer does so in the proxy); requests
    later and later (or, backwards, earlier and earlier: what a clock stepped back gives). Interleaved: the
    connections' events taken in turn, one each, as a proxy's batch mixes its connections' reads."""
    events, clock = [], itertools.count(100_000, -1 if backwards else 1)
    each = []
    for connection_id, address, (requests, responses) in plays:
        if interleaved:
            events = []
            each.append(events)
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
    if interleaved:
        return [e for turn in itertools.zip_longest(*each) for e in turn if e is not None]
    return events


def _outcome(observer: InventoryObserver) -> tuple:
    registry = CollectorRegistry()
    registry.register(observer.collector())
    document = observer.clients_json()
    return document, generate_latest(registry).decode(), observer.inventory.forgotten, len(observer._rejecting)


def _both(codec: Codec, plays: list, scan_requests: bool = True, backwards: bool = False, interleaved: bool = False,
          **options) -> tuple:
    native = InventoryObserver(**options)
    python = InventoryObserver(native=False, **options)
    assert native.native and not python.native
    python._wall_offset = native._wall_offset  # the C handler holds its own from the start
    outcomes = []
    for observer in (native, python):
        for event in _events(codec, plays, scan_requests, backwards, interleaved):
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


def _observed_read_by_read(codec: Codec, connections: list, native: bool, **options) -> tuple:
    """Each connection (id, frames, turn it starts at) read a frame at a time, the observer handling each read's
    events before the next read, the connections in turn; a session and its events are dropped when done. The
    outcome."""
    observer = InventoryObserver(native=native, **options)
    observer._wall_offset = 0.0
    if native:  # the handlers again, holding the offset set above
        observer.handlers = dict(zip((Request, Response), _handlers(observer)))
    live = {}
    last = max(start + len(frames) for _, frames, start in connections)
    for turn in range(last):
        for connection_id, frames, start in connections:
            step = turn - start
            if step == 0:
                live[connection_id] = Session(codec, ConnectionInfo(connection_id, f"10.0.{connection_id}.1:1", "b:1"))
            if 0 <= step < len(frames):
                for event in live[connection_id].client_data(frames[step], 100.0 + turn).events:
                    observer.handlers.get(type(event), lambda e: None)(event)
            if step == len(frames) - 1:
                del live[connection_id]
    return _outcome(observer)


@pytest.mark.parametrize("max_connections", [2, 3])
def test_connections_forgotten_while_they_go_on_alike(codec, max_connections):
    """More connections than the inventory keeps, each starting two requests after the one before: a connection's
    record is forgotten between two of its requests by a newer connection's first (the C handler's remembered
    lookups of that connection must not outlive the record)."""
    frames = [_request(codec, cid, "x") for cid in range(1, 9)]
    connections = [(n, frames, 2 * n) for n in range(6)]
    native = _observed_read_by_read(codec, connections, True, max_connections=max_connections)
    python = _observed_read_by_read(codec, connections, False, max_connections=max_connections)
    assert native[2] >= 6 - max_connections and native == python


def test_connections_one_after_another_alike(codec):
    """Each connection closed before the next opens, as a client reconnecting: every one its own record."""
    frames = [_request(codec, cid, "x") for cid in range(1, 5)]
    connections = [(n, frames, len(frames) * n) for n in range(12)]
    native = _observed_read_by_read(codec, connections, True)
    python = _observed_read_by_read(codec, connections, False)
    assert len(native[0]["connections"]) == 12 and native == python


def test_a_connection_whose_address_changes_is_another_record_alike(codec):
    """A ConnectionInfo whose client address is changed between two requests: its next requests are another
    record's (the key is the id and the address), in C as in Python."""
    outcomes = []
    for native in (True, False):
        observer = InventoryObserver(native=native)
        observer._wall_offset = 0.0
        if native:
            observer.handlers = dict(zip((Request, Response), _handlers(observer)))
        session = Session(codec, ConnectionInfo(7, "10.0.0.7:1", "b:1"))
        for cid in range(1, 7):
            if cid == 4:
                session.connection.client_address = "10.0.0.8:1"
            for event in session.client_data(_request(codec, cid, "x"), 100.0 + cid).events:
                observer.handlers.get(type(event), lambda e: None)(event)
        outcomes.append(_outcome(observer))
    assert [c["address"] for c in outcomes[0][0]["connections"]] == ["10.0.0.7:1", "10.0.0.8:1"]
    assert outcomes[0] == outcomes[1]


def test_a_connection_whose_software_changes_is_counted_alike(codec):
    """KIP-511: a client that sends ApiVersions again with another software version, between other requests (each
    request read and observed before the next is read, on two connections in turn)."""
    from tests.upgrade.test_inventory import api_versions_v3

    frames = [api_versions_v3(b"kin", b"1.0", 1), _request(codec, 2, "x"), _request(codec, 3, "x"),
              api_versions_v3(b"kin", b"2.0", 4), _request(codec, 5, "x"), _request(codec, 6, "x")]
    outcomes = []
    for native in (True, False):
        observer = InventoryObserver(native=native)
        observer._wall_offset = 0.0
        if native:  # the handlers again, holding the offset set above
            observer.handlers = dict(zip((Request, Response), _handlers(observer)))
        sessions = [Session(codec, ConnectionInfo(n, f"10.0.0.{n}:1", "b:1")) for n in (1, 2)]
        for i, frame in enumerate(frames):
            for session in sessions:
                for event in session.client_data(frame, 100.0 + i).events:
                    observer.handlers.get(type(event), lambda e: None)(event)
        outcomes.append(_outcome(observer))
    metrics = outcomes[0][1]
    assert 'kinspect_client_requests_total{software="kin",software_version="1.0"} 6.0' in metrics
    assert 'kinspect_client_requests_total{software="kin",software_version="2.0"} 6.0' in metrics
    assert outcomes[0] == outcomes[1]


def _handlers(observer: InventoryObserver) -> tuple:
    """The C Noter's request and response handlers for `observer` (made after its _wall_offset was set)."""
    noter = _inventory.Noter(observer, CLASSES, (PRODUCE, API_VERSIONS, 16, 256),
                             (observer._request, observer._response), _magics)
    return noter.request, noter.response


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
    with pytest.raises(TypeError, match="7 classes"):
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
