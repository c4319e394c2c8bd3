"""The lock-free metrics observer gives the same /metrics text as the pre-issue-12 reference for the same events.

Events come from real Sessions: the recorded conversations of tests/data/traffic (three
clients against a real broker), and synthetic conversations built with the codec that hit
every branch (unknown apis and versions, unknown header and body tags, known and unknown
error codes, decode errors, frames too large or kept by their head only, Produce batches
of several compressions and acks=0, the topic and unknown-series caps). Each event goes to
both observers; their exposition texts (prometheus_client's generate_latest) must be equal,
`_created` timestamps aside (each observer stamps the moment it made a series).
"""

from __future__ import annotations

import collections
import os
import re
import struct
import uuid
import threading
import time

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.observers import metric_families
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV
from kinspect.session import ConnectionInfo, Request, Session, SessionConfig
from tests.support.paths import TRAFFIC
from tests.support.proxy_harness import (api_versions, fetch, fetch_response, metadata, produce, record_batch,
                                         request_frame)
from tests.support.reference_metrics import ReferenceMetricsObserver

_PREFIX = struct.Struct(">i")
CREATED = re.compile(r"^(\S+_created(?:\{.*\})?) (\S+)$", re.M)


def exposition(observer) -> str:
    return generate_latest(observer.registry).decode()


def comparable(text: str) -> tuple[str, list[float]]:
    """The text with each `_created` value replaced by T, and those values; the families both observers serve
    (build info and the process collectors, registered since the reference was kept, are left out)."""
    blocks = re.split(r"(?m)^(?=# HELP )", text)
    text = "".join(b for b in blocks if not b.startswith(("# HELP kinspect_build_info", "# HELP process_",
                                                           "# HELP python_")))
    return CREATED.sub(r"\1 T", text), [float(v) for _, v in CREATED.findall(text)]


def recorded() -> list[list[tuple[bytes, bytes]]]:
    conversations = []
    for requests in sorted(TRAFFIC.glob("*/*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        conversations.append([(requests.read_bytes(), responses.read_bytes())])
    assert len(conversations) >= 60, "the recorded traffic is missing"
    return conversations


def feed(codec: Codec, conversations, observers, config: SessionConfig | None = None) -> collections.Counter:
    """Replay each conversation (steps of client bytes, broker bytes) through a Session; every event to every observer.

    Returns how many events of each type there were.
    """
    count: collections.Counter = collections.Counter()
    for n, steps in enumerate(conversations):
        session = Session(codec, ConnectionInfo(n, f"client-{n}", "broker"), config)
        now = 0.0
        for client, broker in steps:
            events = session.client_data(client, now).events if client else []
            now += 0.0007 * (n + 1)  # latencies that land in several buckets
            events += session.broker_data(broker, now).events if broker else []
            for e in events:
                for observer in observers:
                    observer.on_event(e)
            count.update(type(e).__name__ for e in events)
        for e in session.close(now + 1):
            count[type(e).__name__] += 1
            for observer in observers:
                observer.on_event(e)
    return count


@pytest.fixture(params=["Cell", "list"], ids=["C-cells", "list-cells"])
def cells(request, monkeypatch) -> str:
    """The kind of cell the metric families make: the C counting's Cell where built (the default), or the lists
    that are its reference (what the families make without the C extension)."""
    if request.param == "list":
        monkeypatch.setattr(metric_families, "optional_extension", lambda name: None)
    return request.param if os.environ.get(PURE_PYTHON_ENV) != "1" else "list"


def counting_observer(native: bool, cells: str = "Cell", **settings) -> MetricsObserver:
    """A MetricsObserver counting in C (observers._counting; built in CI: never skipped) or in Python only,
    into cells of the kind `cells` (see the fixture)."""
    observer = MetricsObserver(native=native, **settings)
    made = type(observer._unknown_api_cell).__name__
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        assert made == "list"
    else:
        assert made == cells, f"cells are {made}, not {cells}: is kinspect.observers._counting built?"
    counting = type(observer.handlers[Request]).__name__ == "builtin_function_or_method"
    if native and not counting and os.environ.get(PURE_PYTHON_ENV) != "1":
        pytest.fail("kinspect.observers._counting is not built: reinstall with a C compiler, or set "
                    f"{PURE_PYTHON_ENV}=1")
    assert counting == (native and os.environ.get(PURE_PYTHON_ENV) != "1")
    return observer


def assert_same(reference, observer, started: float) -> str:
    text = exposition(observer)
    want, want_created = comparable(exposition(reference))
    got, got_created = comparable(text)
    assert got == want
    assert len(got_created) == len(want_created) > 0
    assert all(started - 1 <= t <= time.time() + 1 for t in got_created)
    return text


# ----------------------------------------------------------------------------- recorded traffic


@pytest.mark.parametrize("settings", [
    {},
    {"topic_bytes": True},
    {"topic_bytes": True, "max_topics": 3, "max_unknown_series": 2},
], ids=["defaults", "topic-bytes", "caps"])
@pytest.mark.parametrize("native", [True, False], ids=["C-counting", "python-counting"])
def test_recorded_traffic_gives_the_same_metrics(codec: Codec, settings: dict, native: bool, cells: str):
    started = time.time()
    reference, observer = ReferenceMetricsObserver(**settings), counting_observer(native, cells, **settings)
    events = feed(codec, recorded(), (reference, observer))
    assert events["Request"] > 250 and events["Response"] > 250
    text = assert_same(reference, observer, started)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = sum(s.value for s in families["kinspect_requests"].samples if s.name.endswith("_total"))
    assert requests == events["Request"]
    assert len(families["kinspect_requests"].samples) >= 50  # many (api, version) series
    assert any(s.value for s in families["kinspect_response_errors"].samples if s.name.endswith("_total"))
    assert any(s.value for s in families["kinspect_produced_records"].samples if s.name.endswith("_total"))
    assert any(s.value for s in families["kinspect_tagged_fields"].samples if s.name.endswith("_total"))
    if settings.get("max_topics") == 3:
        assert 'kinspect_label_overflow_total{metric="kinspect_topic_bytes_total"}' in text
        assert 'kinspect_topic_bytes_total{direction="request",topic="other"}' in text


# ----------------------------------------------------------------------------- synthetic events


def frame(body: bytes) -> bytes:
    return _PREFIX.pack(len(body)) + body


def request(codec: Codec, api_key: int, version: int, cid: int, body: dict, header_tags=()) -> bytes:
    header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": cid, "ClientId": "synthetic"}
    if header_tags:
        header["_unknown_tagged_fields"] = list(header_tags)
    return frame(codec.encode_request(header, body))


def response(codec: Codec, api_key: int, version: int, cid: int, body: dict, header_tags=()) -> bytes:
    header = {"CorrelationId": cid}
    if header_tags:
        header["_unknown_tagged_fields"] = list(header_tags)
    return frame(codec.encode_response(api_key, version, header, body))


def metadata_response(codec: Codec, cid: int, topics: dict[str, int], header_tags=(), body_tags=()) -> bytes:
    body = {"ThrottleTimeMs": 0, "Brokers": [{"NodeId": 1, "Host": "h", "Port": 9092, "Rack": None}],
            "ClusterId": "c", "ControllerId": 1,
            "Topics": [{"ErrorCode": code, "Name": name, "TopicId": uuid.UUID(int=0),
                        "IsInternal": False, "Partitions": [], "TopicAuthorizedOperations": 0}
                       for name, code in topics.items()]}
    if body_tags:
        body["_unknown_tagged_fields"] = list(body_tags)
    return response(codec, 3, 12, cid, body, header_tags)


def batch(values: list[bytes], compression: int) -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 30)
    for value in values:
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce_request(codec: Codec, cid: int, topic: str, batches: list[bytes], acks: int = 1) -> bytes:
    return request_frame(codec, 0, 9, cid, {
        "TransactionalId": None, "Acks": acks, "TimeoutMs": 1000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": i, "Records": b}
                                                        for i, b in enumerate(batches)]}]})


def produce_response(codec: Codec, cid: int, topic: str, code: int) -> bytes:
    return response(codec, 0, 9, cid, {"ThrottleTimeMs": 0, "Responses": [{"Name": topic, "PartitionResponses": [
        {"Index": 0, "ErrorCode": code, "BaseOffset": 0, "LogAppendTimeMs": -1, "LogStartOffset": 0,
         "RecordErrors": [], "ErrorMessage": None}]}]})


def synthetic(codec: Codec) -> list[list[tuple[bytes, bytes]]]:
    """Conversations that reach every branch of the observers (see the module docstring)."""
    gzip_batch = batch([b"a" * 50, b"b" * 50], compression=1)
    odd_batch = bytearray(batch([b"c"], compression=0))
    odd_batch[22] |= 0x06  # attributes: compression 6, a codec no client uses ("unknown" label)
    truncated = metadata(codec, 40, ["t1"])
    truncated = frame(truncated[4:-6])  # a whole frame whose Metadata v12 body ends too soon
    bad_header = frame(_PREFIX.pack(40) + b"\x05")  # a response header v1 whose tag section runs past the frame
    big = b"x" * 3000
    conversations = [
        # header tags (unknown, past the cap too), body tags, error codes known and unknown, topics past the cap
        [(request(codec, 18, 3, 1, {"ClientSoftwareName": "s", "ClientSoftwareVersion": "1"},
                  [(7, b"abc"), (8, b""), (9, b"z")]), b""),
         (request(codec, 18, 3, 2, {"ClientSoftwareName": "s", "ClientSoftwareVersion": "1"},
                  [(10, b"q"), (11, b"qq"), (7, b"a")]), b""),
         (metadata(codec, 3, ["t1", "t2", "t3", "t4", "t5"]),
          metadata_response(codec, 3, {"t1": 0, "t2": 3, "t3": 9999, "t4": 10001, "t5": 10002},
                            header_tags=[(5, b"hh")], body_tags=[(90, b"123"), (91, b"")])),
         (metadata(codec, 4, ["t6", "t1"]),
          metadata_response(codec, 4, {"t6": 10003, "t1": 36, "t7": 9999}, header_tags=[(6, b"")],
                            body_tags=[(90, b""), (92, b"x")])),
         (metadata(codec, 5, None), metadata_response(codec, 5, {})),
         (truncated, b""),
         (b"", bad_header)],
        # unknown apis and versions, past the cap; an unpaired response
        [(frame(struct.pack(">hhih", 999, 0, 20, -1)) + frame(struct.pack(">hhih", 998, 0, 21, -1))
          + frame(struct.pack(">hhih", 18, 99, 22, -1)) + frame(struct.pack(">hhih", 3, 77, 23, -1))
          + frame(struct.pack(">hhih", 3, 78, 24, -1)) + frame(struct.pack(">hhih", 3, 79, 25, -1)),
          frame(_PREFIX.pack(20)) + frame(_PREFIX.pack(23)) + frame(_PREFIX.pack(12345)))],
        # Produce: compressions, acks=0, a produce error; ApiVersions answered (header v0)
        [(produce_request(codec, 30, "p", [gzip_batch, bytes(odd_batch)]), produce_response(codec, 30, "p", 0)),
         (produce_request(codec, 31, "p", [batch([b"d"], 0)], acks=0), b""),
         (produce(codec, 32, "p", [b"e", b"f"]), produce_response(codec, 32, "p", 6)),
         (api_versions(codec, 33), b"")],
        # frames above the inspection limit (kept by their head) and above the frame limit
        [(produce(codec, 50, "big", [big]), produce_response(codec, 50, "big", 0)),
         (metadata(codec, 51, ["q" * 3000]), b""),
         (b"", _PREFIX.pack(1 << 30))],
    ]
    return conversations


@pytest.mark.parametrize("settings", [
    {},
    {"topic_bytes": True, "max_topics": 2, "max_unknown_series": 3},
    {"topic_bytes": True, "max_topics": 0, "max_unknown_series": 0},
], ids=["defaults", "caps", "zero-caps"])
@pytest.mark.parametrize("native", [True, False], ids=["C-counting", "python-counting"])
def test_synthetic_events_give_the_same_metrics(codec: Codec, settings: dict, native: bool, cells: str):
    started = time.time()
    reference, observer = ReferenceMetricsObserver(**settings), counting_observer(native, cells, **settings)
    config = SessionConfig(max_frame_bytes=1 << 20, inspect_max_bytes=2000)
    feed(codec, synthetic(codec), (reference, observer), config)
    text = assert_same(reference, observer, started)
    # the branches were reached (so the equality above is not vacuous)
    for needle in ('location="header"', 'location="body",path="root"', 'compression="gzip"',
                   'kinspect_produced_batches_total{compression="unknown"} 1.0', 'error="UNKNOWN_TOPIC_OR_PARTITION"',
                   'reason="decode_error"', 'reason="frame_too_large"', 'kind="unpaired_response"',
                   'kinspect_request_latency_seconds_count{api="Produce"} 3.0'):
        assert needle in text, needle
    unknown = "kinspect_unknown_api_requests_total 6.0"
    assert unknown in text
    if settings:
        for metric in ("kinspect_requests_total", "kinspect_tagged_fields_total", "kinspect_response_errors_total",
                       "kinspect_topic_bytes_total"):
            assert f'kinspect_label_overflow_total{{metric="{metric}"}}' in text, metric
        assert 'error="other"' in text and 'version="other"' in text and 'tag="other"' in text
    else:
        assert 'error="UNKNOWN_9999"' in text and 'tag="90"' in text and 'version="77"' in text
        assert "\nkinspect_label_overflow_total{" not in text


# ----------------------------------------------------------------------------- scan policy


def test_wants_body_scans_only_what_can_change_a_metric(codec: Codec):
    observer = MetricsObserver(codec=codec)
    assert observer.wants_body(18, 0, "request") is False  # ApiVersions v0: no fields at all
    assert observer.wants_body(18, 3, "request") is True  # flexible: its tag section is counted
    assert observer.wants_body(18, 0, "response") is True  # ErrorCode
    assert observer.wants_body(3, 5, "request") is False  # Metadata v5: topic names, and topic_bytes is off
    assert MetricsObserver(codec=codec, topic_bytes=True).wants_body(3, 5, "request") is True
    assert observer.wants_body(0, 7, "request") is True  # Produce: record batches
    assert observer.wants_body(1, 11, "request") is False  # Fetch v11 request: nothing the metrics read
    assert observer.wants_body(1, 11, "response") is True
    assert observer.wants_body(999, 0, "request") is False  # unknown api: never scanned
    # without a codec it cannot judge before seeing events: keep bodies
    assert MetricsObserver().wants_body(3, 5, "request") is True


def test_bodies_are_scanned_only_when_a_scan_can_tell_something(codec: Codec):
    """A whole body the metrics read no fact from is still scanned, to count it when malformed (as before).

    Not scanned: bodies with no field at all (ApiVersions v0 requests: nothing to read, nothing
    to fail) and bodies not kept (frames kept by their head, as the pipeline may do when
    wants_body is False), which are counted and measured all the same.
    """
    good = request_frame(codec, 3, 5, 1, {"Topics": [{"Name": "t"}], "AllowAutoTopicCreation": False})
    bad = frame(good[4:-3])  # Metadata v5 request whose topic name runs past the frame
    empty = request_frame(codec, 18, 0, 3, {})
    long = request_frame(codec, 3, 5, 4, {"Topics": [{"Name": "t" * 300}], "AllowAutoTopicCreation": False})
    reference, observer = ReferenceMetricsObserver(), MetricsObserver(codec=codec)
    session = Session(codec, ConnectionInfo(1, "c", "b"), SessionConfig(inspect_max_bytes=200))
    events = session.client_data(good + bad + empty + long, 0.0).events
    requests = [e for e in events if type(e) is Request]
    assert [(e.api_version, e.complete) for e in requests] == [(5, True), (5, True), (0, True), (5, False)]
    assert not observer.wants_body(3, 5, "request") and not observer.wants_body(18, 0, "request")
    for e in events:
        observer.on_event(e)
    assert [e._scanned is not None for e in requests] == [True, True, False, False]
    for e in events:
        reference.on_event(e)
    assert comparable(exposition(observer))[0] == comparable(exposition(reference))[0]
    r = observer.registry
    assert r.get_sample_value("kinspect_requests_total", {"api": "Metadata", "version": "5"}) == 3
    assert r.get_sample_value("kinspect_decode_failures_total",
                              {"api": "Metadata", "direction": "request", "reason": "decode_error"}) == 1


# ----------------------------------------------------------------------------- scrapes from another thread


def test_scrapes_from_another_thread_see_consistent_figures(codec: Codec):
    """A thread scrapes while events flow: no error, every histogram whole, counters never going back."""
    observer = MetricsObserver(topic_bytes=True)
    conversations = recorded()
    stop = threading.Event()
    scrapes: list[dict] = []
    failures: list[BaseException] = []

    def scrape():
        try:
            while not stop.is_set() or not scrapes:
                figures = {}
                for family in text_string_to_metric_families(exposition(observer)):
                    for s in family.samples:
                        figures[(s.name, tuple(sorted(s.labels.items())))] = s.value
                scrapes.append(figures)
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            failures.append(exc)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    events: collections.Counter = collections.Counter()
    try:
        rounds = 0
        while rounds < 3 or (len(scrapes) < 3 and rounds < 200 and not failures):  # scrapes while events flow
            events += feed(codec, conversations, (observer,))
            rounds += 1
    finally:
        stop.set()
        scraper.join(30)
    assert not failures and len(scrapes) >= 3
    final = {}
    for family in text_string_to_metric_families(exposition(observer)):
        for s in family.samples:
            final[(s.name, tuple(sorted(s.labels.items())))] = s.value
    previous: dict = {}
    for figures in scrapes + [final]:
        for (name, labels), value in figures.items():
            if name.endswith("_bucket"):
                series = tuple(kv for kv in labels if kv[0] != "le")
                count = figures[(name[: -len("_bucket")] + "_count", series)]
                assert value <= count
                if dict(labels)["le"] == "+Inf":
                    assert value == count  # the buckets and the count of one snapshot agree
            if name.endswith(("_total", "_count", "_sum", "_bucket")):
                assert value >= previous.get((name, labels), 0)
        previous = figures
    assert sum(v for (n, _), v in final.items() if n == "kinspect_requests_total") == events["Request"] >= 3 * 258


# ----------------------------------------------------------------------------- repeated bodies


def test_repeated_small_bodies_are_scanned_once(codec: Codec):
    """Bodies seen before are not scanned again (ApiVersions, metadata refreshes), with the same figures."""
    good = request_frame(codec, 3, 12, 0, {"Topics": [{"TopicId": uuid.UUID(int=0), "Name": "t"}],
                                           "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False})
    malformed = frame(good[4:-4])  # the same truncated body each time: a decode failure each time
    steps = []
    for n in range(300):
        cid = 10 * n
        steps.append((api_versions(codec, cid), b""))
        steps.append((metadata(codec, cid + 1, ["t"]), metadata_response(codec, cid + 1, {"t": 3})))
        steps.append((malformed[:8] + _PREFIX.pack(cid + 2) + malformed[12:], b""))
    reference, observer = ReferenceMetricsObserver(), MetricsObserver()
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    # (event type, api key) -> the scans (or DecodeErrors) the events hold after the observer: a body seen
    # before gets the scan remembered with it (the same object), so the other observers share it too.
    outcomes: collections.defaultdict = collections.defaultdict(list)
    started = time.time()
    for client, broker in steps:
        events = session.client_data(client, 0.0).events + session.broker_data(broker, 0.001).events
        for e in events:
            observer.on_event(e)
            if type(e).__name__ in ("Request", "Response") and e._scanned is not None:
                outcomes[(type(e).__name__, e.api_key)].append(e._scanned)
        for e in events:
            reference.on_event(e)  # after: the reference scans every event
    assert_same(reference, observer, started)
    # ApiVersions requests: one body; Metadata requests: the good one and the malformed one; one response body
    scanned = {key: len({id(outcome) for outcome in held}) for key, held in outcomes.items()}
    assert scanned == {("Request", 18): 1, ("Request", 3): 2, ("Response", 3): 1}
    # every good body's event holds its scan (the malformed one's only the first time: its error is not kept)
    assert [len(outcomes[key]) for key in (("Request", 18), ("Response", 3))] == [300, 300]
    assert len(outcomes[("Request", 3)]) == 301
    r = observer.registry
    assert r.get_sample_value("kinspect_decode_failures_total",
                              {"api": "Metadata", "direction": "request", "reason": "decode_error"}) == 300
    assert r.get_sample_value("kinspect_response_errors_total",
                              {"api": "Metadata", "error": "UNKNOWN_TOPIC_OR_PARTITION"}) == 300
    assert r.get_sample_value("kinspect_requests_total", {"api": "ApiVersions", "version": "3"}) == 300


def test_memo_stops_for_bodies_that_do_not_repeat(codec: Codec):
    from kinspect.observers.metrics import MEMO_TRIAL

    reference, observer = ReferenceMetricsObserver(topic_bytes=True), MetricsObserver(topic_bytes=True)
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    started = time.time()
    for n in range(MEMO_TRIAL + 10):
        for e in session.client_data(metadata(codec, n, [f"topic-{n}"]), 0.0).events:
            observer.on_event(e)
            reference.on_event(e)
    assert_same(reference, observer, started)
    assert observer._req[(3, 12)].memo is None  # every body differed: memoizing stopped
    assert observer._req[(3, 12)].scan


def test_memo_tells_a_malformed_response_header_from_a_good_one(codec: Codec):
    """Two responses with the same body, one with a header tag section that runs past the frame: one failure."""
    good = metadata_response(codec, 1, {"t": 0})
    assert good[8] == 0  # an empty header tag section
    bad = good[:8] + b"\x7f" + good[9:]  # 127 header tags claimed: the section runs past the frame
    reference, observer = ReferenceMetricsObserver(), MetricsObserver()
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    started = time.time()
    for cid, answer in ((1, bad), (2, good), (3, bad), (4, good)):
        events = session.client_data(metadata(codec, cid, ["t"]), 0.0).events
        events += session.broker_data(answer[:4] + _PREFIX.pack(cid) + answer[8:], 0.001).events
        for e in events:
            observer.on_event(e)
        for e in events:
            reference.on_event(e)
    assert_same(reference, observer, started)
    assert observer.registry.get_sample_value(
        "kinspect_decode_failures_total", {"api": "Metadata", "direction": "response", "reason": "decode_error"}) == 2
    assert observer.registry.get_sample_value("kinspect_responses_total", {"api": "Metadata", "version": "12"}) == 4


# ----------------------------------------------------------------------------- responses in pieces


@pytest.mark.parametrize("native", [True, False], ids=["C-counting", "python-counting"])
def test_fetch_responses_in_pieces_give_the_same_metrics(codec: Codec, native: bool):
    """Large Fetch responses reach the observers in the pieces they came in (a view of one read, or several
    reads): counted alike, their scans read in place; small ones (empty fetches) repeat and are memoized."""
    from kinspect.protocol.framing.pieces import FramePieces

    records = [record_batch([bytes([n]) * 2000] * 40) for n in range(3)]
    started = time.time()
    reference = ReferenceMetricsObserver(topic_bytes=True)
    observer = counting_observer(native, topic_bytes=True)
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    kinds = collections.Counter()
    for n in range(40):
        version = (4, 12)[n % 2]
        data = fetch_response(codec, n, "orders", records[: n % 4] or [None], version=version,
                              error_codes=[0, 6, 0][: n % 4] or [3])
        events = session.client_data(fetch(codec, n, "orders", version=version), 0.0).events
        read = (len(data), 30_000)[n % 3 == 0]
        for i in range(0, len(data), read):
            events += session.broker_data(data[i:i + read], 0.001 * (n + 1)).events
        for e in events:
            observer.on_event(e)
            reference.on_event(e)
            if type(e).__name__ == "Response":
                kinds[type(e.frame).__name__, len(e.frame) > 1 if type(e.frame) is FramePieces else None] += 1
    assert kinds[("FramePieces", True)] and kinds[("FramePieces", False)] and kinds[("bytes", None)], kinds
    text = assert_same(reference, observer, started)
    assert 'kinspect_response_errors_total{api="Fetch",error="NOT_LEADER_OR_FOLLOWER"}' in text
    assert 'kinspect_topic_bytes_total{direction="response",topic="orders"}' in text
