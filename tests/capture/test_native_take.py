"""The capture's fact taker in C (capture._take) against its Python reference (FactsTaker.take_python).

Both take the same EXCHANGE tuples and held bytes from every recorded conversation, from
events scanned before (as the metrics leave them) or not yet, with scans shared between
events (the metrics' memo), and from exchanges without facts (a frame over the inspection
limit, a body that does not decode, an unknown api, a lone acks=0 request), which the C
taker hands to the reference.
"""

from __future__ import annotations

import uuid
import tracemalloc

import pytest

from kinspect.capture.facts import FactsTaker, held_bytes
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session
from tests.capture.test_capture_rows import exchange, req, resp
from tests.support.native import native_module
from tests.support.paths import TRAFFIC

_take, _MISSING = native_module("kinspect.capture._take")
Taker = None if _take is None else _take.Taker


def replayed(codec: Codec) -> list[Exchange]:
    """The Exchange events of every recorded conversation, nothing scanned yet."""
    out = []
    for n, requests in enumerate(sorted(TRAFFIC.glob("*/*.requests.bin"))):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        session = Session(codec, ConnectionInfo(n, f"127.0.0.1:{4000 + n}", "127.0.0.1:9092", node_id=n % 3))
        events = session.client_data(requests.read_bytes(), 1.0 + n).events
        events += session.broker_data(responses.read_bytes(), 1.5 + n).events
        events += session.close(2.0 + n)
        out += [e for e in events if type(e) is Exchange]
    return out


def takers(codec: Codec) -> tuple:
    if Taker is None:
        pytest.fail(_MISSING)
    native = FactsTaker(codec)
    assert isinstance(native.take, Taker), "the C taker is built but FactsTaker does not use it"
    return native.take, FactsTaker(codec, native=False).take


def test_recorded_traffic_takes_the_same_facts_scanned_or_not():
    codec = Codec()
    fast, reference = takers(codec)
    fresh = replayed(codec)
    assert len(fresh) > 200
    taken = [fast(x) for x in fresh]  # the C taker scans what nobody scanned yet
    assert taken == [reference(x) for x in fresh]
    again = [fast(x) for x in fresh]  # scans cached on the events now, SCANs kept per (api, direction)
    assert again == taken
    for facts, held in taken:
        assert held == held_bytes(facts)
    # Every direction of every api in the traffic had facts: none fell back to a reason.
    assert all(type(f[19]) is tuple and (f[28] is None or type(f[28]) is tuple) for f, _ in taken)
    assert {f[7] for f, _ in taken} >= {0, 1, 3, 18}  # Produce, Fetch, Metadata, ApiVersions


def test_a_shared_scan_gives_one_scan_tuple():
    """The metrics hand one scan to every event whose body repeats: its SCAN is built once, by either taker."""
    codec = Codec()
    fast, reference = takers(codec)
    frame = req(codec, 3, 12, {"Topics": [{"TopicId": uuid.UUID(int=0), "Name": "t"}], "AllowAutoTopicCreation": False,
                               "IncludeTopicAuthorizedOperations": False})
    answer = resp(codec, 3, 12, {"Brokers": [], "Topics": [{"ErrorCode": 3, "Name": "t", "TopicId": uuid.UUID(int=0),
                                 "IsInternal": False, "Partitions": [], "TopicAuthorizedOperations": 0}]})
    first, second = exchange(codec, frame, answer), exchange(codec, frame, answer)
    for x in (first, second):
        x.request.adopt_scan(first.request.scan())
        x.response.adopt_scan(first.response.scan())
    a, b = fast(first), fast(second)
    assert a == reference(first) == b == reference(second)
    assert a[0][19] is b[0][19] and a[0][28] is b[0][28]
    assert dict(a[0][28][6]) == {3: 1}  # the response's error code, among its facts


def test_scans_alike_in_their_facts_give_one_scan_tuple():
    """A producer's requests are each scanned anew (their records differ): a scan whose facts equal its api's
    previous SCAN gets that very SCAN, from either taker, with the same bytes held; unlike ones their own."""
    codec = Codec()
    fast, reference = takers(codec)

    def metadata(name: str, code: int) -> Exchange:
        frame = req(codec, 3, 12, {"Topics": [{"TopicId": uuid.UUID(int=0), "Name": name}],
                                   "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False})
        topic = {"ErrorCode": code, "Name": name, "TopicId": uuid.UUID(int=0), "IsInternal": False, "Partitions": [],
                 "TopicAuthorizedOperations": 0}
        answer = resp(codec, 3, 12, {"Brokers": [], "Topics": [topic]})
        return exchange(codec, frame, answer)

    first, alike, other_code, other_topic = metadata("t", 3), metadata("t", 3), metadata("t", 5), metadata("u", 5)
    for take in (fast, reference):
        taken = [take(x) for x in (first, alike, other_code, other_topic)]
        assert first.request.scan() is not alike.request.scan()  # two scans of alike bytes
        (a, held_a), (b, held_b), (c, held_c), (d, _) = taken
        assert a[19] is b[19] and a[28] is b[28] and held_a == held_b == held_bytes(b)
        assert c[19] is b[19] and c[28] is not b[28] and dict(c[28][6]) == {5: 1} and held_c == held_bytes(c)
        assert d[19] is not c[19] and d[28] is not c[28] and d[19][5] == (('u', 0),)  # another topic
    assert [fast(x) for x in (first, other_code)] == [reference(x) for x in (first, other_code)]


def test_exchanges_without_facts_go_to_the_reference():
    codec = Codec()
    fast, reference = takers(codec)
    metadata = req(codec, 3, 12, {"Topics": None, "AllowAutoTopicCreation": False,
                                  "IncludeTopicAuthorizedOperations": False})
    answer = resp(codec, 3, 12, {"Brokers": [], "Topics": []})
    produce = req(codec, 0, 9, {"TransactionalId": None, "Acks": 0, "TimeoutMs": 100, "TopicData": []})
    unknown = b"\x03\xe7\x00\x00\x00\x00\x00\x05\x00\x04rows" + b"\x00" * 8
    cases = {
        "request over the limit": exchange(codec, metadata[:20], answer, complete=False, size=4000),
        "response does not decode": exchange(codec, metadata, answer[:-3] + b"\xff\xff\xff"),
        "request does not decode": exchange(codec, metadata[:-2], answer),
        "unknown api": exchange(codec, unknown, None),
        "acks=0, no response": exchange(codec, produce, None),
    }
    for name, x in cases.items():
        expected = reference(x)
        assert fast(x) == expected, name
        if name == "acks=0, no response":
            assert type(expected[0][19]) is tuple and expected[0][20:] == (None,) * 9
        else:
            assert str in {type(expected[0][19]), type(expected[0][28])}, name  # a reason, not facts


def test_what_the_taker_does_not_know_goes_to_the_fallback():
    codec = Codec()
    calls = []
    reference = FactsTaker(codec, native=False).take

    def fallback(x):
        calls.append(x)
        return reference(x)

    if Taker is None:
        pytest.fail(_MISSING)
    from kinspect.capture.facts import BASE_BYTES, TOPIC_BYTES
    from kinspect.protocol.codec import RequestHeader
    from kinspect.protocol.codec.scan_result import ScanResult, batch_fields
    from kinspect.protocol.codec.wire_program import native_module
    from kinspect.session.events import Request, Response

    taker = Taker((Exchange, Request, Response, RequestHeader, ConnectionInfo, ScanResult),
                  native_module().capture_side, batch_fields(), BASE_BYTES, TOPIC_BYTES, fallback,
                  FactsTaker(codec).choose_counting)

    class Later(Exchange):  # a subclass: its slots may be elsewhere
        __slots__ = ()

    frame = req(codec, 18, 3, {"ClientSoftwareName": "k", "ClientSoftwareVersion": "1"})
    plain = exchange(codec, frame, None)
    taker(plain)
    assert calls == []
    sub = Later(plain.request, plain.response, plain.latency)
    assert taker(sub) == reference(sub) and calls == [sub]
    with pytest.raises(TypeError, match="no slot"):
        Taker((Exchange, Request, Response, dict, ConnectionInfo, ScanResult), native_module().capture_side,
              (0, 1, 2, 3), 1, 1, fallback, print)
    with pytest.raises(TypeError, match="taker"):
        taker()


def test_no_reference_leaks():
    codec = Codec()
    fast, _ = takers(codec)
    events = replayed(codec)[:60]
    bad = exchange(codec, req(codec, 18, 3, {"ClientSoftwareName": "k", "ClientSoftwareVersion": "1"})[:-2], None)

    def run(times: int) -> None:
        for _ in range(times):
            for x in events:
                fast(x)
            fast(bad)

    run(20)
    tracemalloc.start()
    try:
        run(10)
        before = tracemalloc.get_traced_memory()[0]
        run(200)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} bytes still allocated after 200 rounds"
