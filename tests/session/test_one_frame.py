"""The session's reads of whole frames in C (session._one_frame) against the Python methods they stand in for.

Two sessions read the same reads, one with the C reads (native, the default) and one without:
after every read both give the same events (every fact of every event) and are in the same
state (pairing table, stream offsets, what the connection learned). The reads are one frame
each (the C reads' case), several frames each, and cut anywhere: every recorded conversation,
one request at a time and all requests first, under the configs that change what is kept (head only, no bodies, a small in-flight
limit, rewrite mode); and a made-up conversation of the special cases the C reads give back
to Python (acks=0, SASL, an unknown api, header tagged fields, KIP-511's fallback, a long
TransactionalId, a new ClientId, unpaired and repeated correlation ids). And bulk Produce requests and Fetch
responses that span reads, which both gather into the pieces they came in (C from the read that starts one to
the read that ends it).
"""

from __future__ import annotations

import dataclasses
import random
import struct
import uuid

import pytest

from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Plan, Session, SessionConfig
from kinspect.session.address_rewrite import AddressRewrite, NodeMap
from kinspect.session.events import frame_bytes
from tests.support.native import bytes_grown, native_module
from tests.support.paths import TRAFFIC
from kinspect.protocol.framing.pieces import FramePieces
from tests.support.proxy_harness import fetch, fetch_response, record_batch, stream_frames

_one_frame, _MISSING = native_module("kinspect.session._one_frame")
Reads = None if _one_frame is None else _one_frame.Reads

CONVERSATIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


def framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def _header(h) -> tuple:
    return h.api_key, h.api_version, h.correlation_id, h.client_id, h.version, h.size, h.fields


def fact(event) -> tuple:
    """Every fact of an event (the connection is compared apart: it is one object both sides change)."""
    if type(event) is Exchange:
        return "Exchange", fact(event.request), event.response and fact(event.response), event.latency
    out = [type(event).__name__]
    for f in dataclasses.fields(event):
        if f.name in ("codec", "_decoded", "_scanned"):
            continue
        value = getattr(event, f.name)
        if f.name == "connection":
            assert type(value) is ConnectionInfo
            continue
        if f.name == "header":
            value = _header(value)
        elif f.name == "frame" and value is not None:
            value = type(value).__name__, frame_bytes(value)  # in pieces or joined, alike
        out.append((f.name, value))
    return tuple(out)


def state(session: Session) -> tuple:
    inflight = [(k, p.api_key, p.api_version, p.request is not None, p.time, p.mode, p.mechanism, p.forgotten)
                for k, p in session._inflight.items()]
    return (session.inflight, session.buffered, session.client_framed, session.broker_framed,
            session.client_inspected, session.broker_inspected, session.failures, session._requests._buffer_offset,
            session._responses._buffer_offset, len(session._remembered), inflight, session._raw_client,
            session._raw_broker, session._raw_turns, list(session._acks_zero), dataclasses.astuple(session.connection))


def pair(codec: Codec, config: SessionConfig | None = None, plan=None) -> tuple[Session, Session]:
    """A session with the C reads and one without, alike otherwise (each its own plan: the plan caches)."""
    if Reads is None:
        pytest.fail(_MISSING)
    made = []
    for native in (True, False):
        made.append(Session(codec, ConnectionInfo(1, "127.0.0.1:50000", "127.0.0.1:9092"), config,
                            plan() if plan else None, native=native))
    native, reference = made
    assert type(native.client_data.__self__) is Reads, "the C reads are built but the session does not use them"
    assert reference.client_data.__self__ is reference  # the Python method
    return native, reference


def run_both(native: Session, reference: Session, reads: list[tuple[str, bytes]], seen: list | None = None,
             midway=None) -> int:
    """Feed both sessions the reads ("c" client, "b" broker), comparing after each; the reads C took (`seen`:
    the native session's events, if given). midway: called with each session before the second half of the reads."""
    for i, (side, data) in enumerate(reads):
        if midway is not None and i == len(reads) // 2:
            midway(native)
            midway(reference)
        now = 1.0 + i / 1024
        a = (native.client_data if side == "c" else native.broker_data)(data, now)
        b = (reference.client_data if side == "c" else reference.broker_data)(data, now)
        if seen is not None:
            seen += a.events
        assert a.forward == b.forward, i
        assert [fact(e) for e in a.events] == [fact(e) for e in b.events], (i, side, data[:24])
        assert all(e.connection is native.connection for e in a.events if type(e) is not Exchange)
        assert state(native) == state(reference), i
    for n, r in zip(native.close(9.0), reference.close(9.0)):
        assert fact(n) == fact(r)
    return native.client_data.__self__.taken


def one_at_a_time(requests: bytes, responses: bytes) -> list[tuple[str, bytes]]:
    """Each response read right after its request (acks=0 requests have none), a frame a read."""
    pending = stream_frames(requests)
    reads = []
    for response in stream_frames(responses):
        correlation_id = response[4:8]
        while pending:
            request = pending.pop(0)
            reads.append(("c", request))
            if request[8:12] == correlation_id:
                break
        reads.append(("b", response))
    return reads + [("c", r) for r in pending]


def all_requests_first(requests: bytes, responses: bytes) -> list[tuple[str, bytes]]:
    return [("c", f) for f in stream_frames(requests)] + [("b", f) for f in stream_frames(responses)]


def _recorded(path):
    return path.read_bytes(), path.with_name(path.name.replace("requests", "responses")).read_bytes()


def test_recorded_traffic_one_request_at_a_time(codec):
    reads = taken = 0
    for path in CONVERSATIONS:
        conversation = one_at_a_time(*_recorded(path))
        taken += run_both(*pair(codec), conversation)
        reads += len(conversation)
    assert reads > 400
    # The first request of each header and whatever the C reads give back are Python's: the rest is C's.
    assert taken > 0.8 * reads, (taken, reads)


def in_reads_of(frames_per_read: int, reads: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Consecutive frames of one side joined into reads of up to frames_per_read frames (pipelined requests)."""
    out: list = []
    for side, data in reads:
        if out and out[-1][0] == side and out[-1][2] < frames_per_read:
            out[-1] = (side, out[-1][1] + data, out[-1][2] + 1)
        else:
            out.append((side, data, 1))
    return [(side, data) for side, data, _ in out]


def in_random_reads(reads: list[tuple[str, bytes]], seed: int) -> list[tuple[str, bytes]]:
    """Each side's bytes cut anywhere (frames split across reads), the sides taking turns as before."""
    rng = random.Random(seed)
    out = []
    for side, data in in_reads_of(1000, reads):
        pos = 0
        while pos < len(data):
            step = rng.choice((3, 17, 60, 200, 1000, 5000))
            out.append((side, data[pos : pos + step]))
            pos += step
    return out


@pytest.mark.parametrize("flag, value", [("client_inspected", False), ("broker_inspected", False),
                                         ("_raw_client", 1), ("_raw_broker", 1)])
def test_a_direction_not_inspected_or_awaiting_raw_tokens_is_read_by_python(codec, flag, value):
    """The flags the C reads load at their slots, each set halfway through as a failure or a SASL exchange
    leaves it: the reads of that direction go to Python from then on, which the C must leave them to."""
    for path in CONVERSATIONS[:3]:
        conversation = one_at_a_time(*_recorded(path))
        run_both(*pair(codec), conversation, midway=lambda session: setattr(session, flag, value))


@pytest.mark.parametrize("frames_per_read", [2, 5, 1000])
def test_recorded_traffic_several_frames_a_read(codec, frames_per_read):
    reads = frames_read = taken = 0
    for path in CONVERSATIONS:
        conversation = in_reads_of(frames_per_read, all_requests_first(*_recorded(path)))
        taken += run_both(*pair(codec), conversation)
        frames_read += len(all_requests_first(*_recorded(path)))
        reads += len(conversation)
    # A read's frames after one that Python reads (a header not seen before) are Python's too.
    assert taken > 0.4 * frames_read and reads < frames_read, (taken, frames_read, reads)


def test_recorded_traffic_cut_anywhere(codec):
    taken = 0
    for n, path in enumerate(CONVERSATIONS):
        taken += run_both(*pair(codec), in_random_reads(one_at_a_time(*_recorded(path)), n))
    assert taken > 100


def test_special_cases_several_frames_a_read(codec):
    for frames_per_read in (2, 3, 7):
        run_both(*pair(codec), in_reads_of(frames_per_read, special_cases(codec)))
    run_both(*pair(codec), in_random_reads(special_cases(codec), 1))


def _rewrite(codec):
    return lambda: Plan(True, AddressRewrite(codec, NodeMap("kinspect.local", port_base=30000)))


@pytest.mark.parametrize("variant", ["default", "heads", "no-bodies", "inflight-2", "rewrite"])
def test_recorded_traffic_all_requests_first(codec, variant):
    config, plan = SessionConfig(), None
    if variant == "heads":
        config = SessionConfig(inspect_max_bytes=300)  # larger frames are kept by their head
    elif variant == "no-bodies":
        plan = lambda: Plan(False)  # noqa: E731 (every frame kept by its head)
    elif variant == "inflight-2":
        config = SessionConfig(max_inflight=2)  # requests' facts are forgotten: Python reads those
    elif variant == "rewrite":
        plan = _rewrite(codec)  # responses framed by Python (held for the transform), requests by C
    reads = taken = 0
    for path in CONVERSATIONS:
        conversation = all_requests_first(*_recorded(path))
        taken += run_both(*pair(codec, config, plan), conversation)
        reads += len(conversation)
    # Forgotten requests' responses and responses held for the rewrite are Python's.
    share = {"inflight-2": 0.3, "rewrite": 0.25}.get(variant, 0.75)
    assert taken > share * reads, (taken, reads)


def _request(codec, api_key, version, correlation_id, body, client_id="cid") -> bytes:
    header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id,
              "ClientId": client_id}
    return framed(codec.encode_request(header, body))


def _response(codec, api_key, version, correlation_id, body) -> bytes:
    return framed(codec.encode_response(api_key, version, {"CorrelationId": correlation_id}, body))


METADATA_REQUEST = {"Topics": None, "AllowAutoTopicCreation": True, "IncludeTopicAuthorizedOperations": False}
METADATA_RESPONSE = {"ThrottleTimeMs": 0, "Brokers": [], "ClusterId": "c", "ControllerId": 1, "Topics": []}


def special_cases(codec) -> list[tuple[str, bytes]]:
    reads = []
    cid = iter(range(1, 1000))

    def exchange(api_key, version, request, response, client_id="cid"):
        n = next(cid)
        reads.append(("c", _request(codec, api_key, version, n, request, client_id)))
        if response is not None:
            reads.append(("b", _response(codec, api_key, version, n, response)))
        return n

    for _ in range(3):  # the header memo warms up; then each case follows a header C has read
        exchange(3, 9, METADATA_REQUEST, METADATA_RESPONSE)
        exchange(3, 12, {**METADATA_REQUEST, "Topics": []}, {**METADATA_RESPONSE, "ClusterId": None})
    produce = {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1000, "TopicData": []}
    produced = {"Responses": [], "ThrottleTimeMs": 0}
    exchange(0, 9, produce, None)  # acks=0: an Exchange at once, no pairing
    exchange(0, 3, produce, None)
    exchange(0, 3, {**produce, "Acks": -1}, produced)
    exchange(0, 9, {**produce, "Acks": 1, "TransactionalId": "tx"}, produced)
    exchange(0, 9, {**produce, "Acks": 1, "TransactionalId": "t" * 200}, produced)  # a two-byte length varint
    exchange(0, 9, {**produce, "Acks": 0, "TransactionalId": "t" * 200}, None)
    software = {"ClientSoftwareName": "kin\x1bspect", "ClientSoftwareVersion": "1.0"}
    versions = {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}
    exchange(18, 3, software, versions)
    exchange(18, 3, {**software, "ClientSoftwareVersion": "2.0"}, versions)
    n = next(cid)  # KIP-511: a v4 request answered with header v0 and a v0 body, error 35
    reads.append(("c", _request(codec, 18, 4, n, software)))
    reads.append(("b", _response(codec, 18, 0, n, {"ErrorCode": 35, "ApiKeys": []})))
    exchange(3, 12, {**METADATA_REQUEST, "Topics": []}, METADATA_RESPONSE | {"ClusterId": None}, client_id="other")
    exchange(3, 12, {**METADATA_REQUEST, "Topics": []}, METADATA_RESPONSE | {"ClusterId": None}, client_id=None)
    # A response header v1 with a tagged field (tag 7, two bytes), then an empty one.
    n = exchange(3, 12, {**METADATA_REQUEST, "Topics": []}, None)
    body = _response(codec, 3, 12, n, {**METADATA_RESPONSE, "ClusterId": None})[9:]
    reads.append(("b", framed(struct.pack(">i", n) + b"\x01\x07\x02hi" + body)))
    reads.append(("b", _response(codec, 3, 12, 999, METADATA_RESPONSE)))  # unpaired
    n = exchange(3, 12, {**METADATA_REQUEST, "Topics": []}, None)
    reads.append(("c", _request(codec, 3, 12, n, {**METADATA_REQUEST, "Topics": []})))  # its correlation id again
    reads.append(("b", _response(codec, 3, 12, n, METADATA_RESPONSE)))
    reads.append(("b", _response(codec, 3, 12, n, METADATA_RESPONSE)))
    reads.append(("c", framed(struct.pack(">hhih", 200, 0, next(cid), 3) + b"cid")))  # an api no spec defines
    reads.append(("c", framed(struct.pack(">hhih", 3, 12, next(cid), 3))))  # a header cut short
    exchange(17, 0, {"Mechanism": "PLAIN"}, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]})
    reads.append(("c", framed(b"\x00user\x00secret")))  # raw SASL tokens
    reads.append(("b", framed(b"")))
    for _ in range(2):
        exchange(3, 9, METADATA_REQUEST, METADATA_RESPONSE)
    reads.append(("c", b"\x00\x00"))  # a read of half a size prefix, then the rest and a frame
    reads.append(("c", _request(codec, 3, 9, 777, METADATA_REQUEST)[2:]))
    reads.append(("b", _response(codec, 3, 9, 777, METADATA_RESPONSE)))
    return reads


def test_special_cases_read_alike(codec):
    reads = special_cases(codec)
    taken = run_both(*pair(codec), reads)
    assert 10 < taken < len(reads)


def test_the_software_of_a_body_read_before_is_not_read_again(codec, monkeypatch):
    """KIP-511's software is read once per distinct ApiVersions body (the C reads remember the last), and every
    connection still learns it: eight connections of one client, then a client with another version."""
    import kinspect.session.session as session_module
    from kinspect.session.client_software import software_of

    calls = []

    def counted(frame, body_offset):
        calls.append(bytes(frame[body_offset:]))
        return software_of(frame, body_offset)

    module = session_module._one_frame_module()
    classes = session_module._one_frame_classes()
    module.configure(classes, counted)
    try:
        software = {"ClientSoftwareName": "kinspect-test", "ClientSoftwareVersion": "1.0"}
        versions = {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}
        learned = []
        for version in ("1.0", "1.0", "2.0"):
            for n in range(8):
                native, reference = pair(codec)
                reads = []
                for cid in range(1, 4):  # the first request's header is read by Python; the next two by C
                    reads.append(("c", _request(codec, 18, 3, cid, {**software, "ClientSoftwareVersion": version})))
                    reads.append(("b", _response(codec, 18, 3, cid, versions)))
                assert run_both(native, reference, reads) > 0
                learned.append(native.connection.client_software_version)
    finally:
        module.configure(classes, software_of)
    assert learned == ["1.0"] * 16 + ["2.0"] * 8
    assert len(calls) == 2 and calls[0] != calls[1]  # one read for each body, whatever the connection


def test_special_cases_in_rewrite_mode_and_with_heads(codec):
    run_both(*pair(codec, None, _rewrite(codec)), special_cases(codec))
    run_both(*pair(codec, SessionConfig(inspect_max_bytes=40)), special_cases(codec))
    run_both(*pair(codec, SessionConfig(max_inflight=1)), special_cases(codec))


def test_a_tls_client_hello_and_an_oversized_frame_stop_framing_alike(codec):
    native, reference = pair(codec, SessionConfig(max_frame_bytes=100))
    reads = special_cases(codec)[:6] + [("c", framed(b"x" * 200)), ("b", framed(b"y" * 200)), ("c", b"abc")]
    run_both(native, reference, reads)
    assert not native.client_framed and not native.broker_framed
    native, reference = pair(codec)
    run_both(native, reference, [("c", b"\x16\x03\x01\x00\x05hello")] + special_cases(codec)[:4])
    assert not native.client_framed


def test_many_reads_leave_no_garbage(codec):
    """Every object the C reads make is released with its event (run long enough to show a leak)."""
    native, _ = pair(codec)
    request = _request(codec, 3, 9, 1, METADATA_REQUEST)
    response = _response(codec, 3, 9, 1, METADATA_RESPONSE)
    reads = [_request(codec, 3, 9, i, METADATA_REQUEST) for i in range(4000)]
    replies = [response[:4] + struct.pack(">i", i) + response[8:] for i in range(4000)]
    client, broker = native.client_data, native.broker_data
    client(request, 0.0)
    broker(response, 0.0)

    def rounds():
        for i in range(4000):
            client(reads[i], 1.0)
            broker(replies[i], 1.0)

    grown = bytes_grown(rounds)
    assert native.client_data.__self__.taken > 15000
    assert grown < 64 * 1024, grown
    assert native.inflight == 0


PRODUCE_RESPONSE = {"Responses": [{"Name": "bulk", "PartitionResponses": [
    {"Index": 0, "ErrorCode": 0, "BaseOffset": 0, "LogAppendTimeMs": -1, "LogStartOffset": 0, "RecordErrors": [],
     "ErrorMessage": None}]}], "ThrottleTimeMs": 0}


def bulk_produce(codec, version: int, acks: int, requests: int = 10, transactional_id=None, client_id="bulk"):
    """Framed Produce requests of about 300 KB (one batch of 100 records of 3 KB each), and their responses
    (None for acks=0), as a producer of large batches sends them."""
    out = []
    for n in range(1, requests + 1):
        batch = record_batch([bytes([n]) * 3000 for _ in range(100)])
        body = {"TransactionalId": transactional_id, "Acks": acks, "TimeoutMs": 30000,
                "TopicData": [{"Name": "bulk", "PartitionData": [{"Index": 0, "Records": batch}]}]}
        request = _request(codec, 0, version, n, body, client_id)
        out.append((request, None if acks == 0 else _response(codec, 0, version, n, PRODUCE_RESPONSE)))
    return out


def cut(exchanges, sizes) -> list[tuple[str, bytes]]:
    """The requests as one client stream cut into reads of the sizes `sizes` yields, each response read as soon
    as its request's last byte has been read."""
    stream = b"".join(request for request, _ in exchanges)
    ends, at = [], 0
    for request, _ in exchanges:
        at += len(request)
        ends.append(at)
    reads, pos, answered = [], 0, 0
    while pos < len(stream):
        step = next(sizes)
        reads.append(("c", stream[pos:pos + step]))
        pos += step
        while answered < len(exchanges) and ends[answered] <= pos:
            if exchanges[answered][1] is not None:
                reads.append(("b", exchanges[answered][1]))
            answered += 1
    return reads


def run_both_in_pieces(native, reference, reads) -> int:
    """run_both, and the requests (each handed over alike by both: `fact` says how) were in pieces."""
    events: list = []
    taken = run_both(native, reference, reads, events)
    assert any(type(e).__name__ == "Request" and type(e.frame) is FramePieces for e in events)
    return taken


def sizes_of(*steps, seed=None):
    rng = random.Random(seed)
    while True:
        yield rng.choice(steps) if seed is not None else steps[0]


@pytest.mark.parametrize("version, acks, transactional_id", [
    (9, -1, None), (9, 1, None), (3, -1, None), (3, 1, "tx"), (9, -1, "tx"),
    (9, 0, None),  # no response to pair: Python reads each request
    pytest.param(9, 1, "t" * 5000, id="9-1-long-transactional-id"),  # acks past a short first piece: Python
])
@pytest.mark.parametrize("reads", ["1 MiB", "64 KiB", "random", "small"])
def test_bulk_produce_in_pieces_reads_alike(codec, version, acks, transactional_id, reads):
    """Requests of 300 KB cut into reads: the C reads gather them from the read that starts one to the read
    that ends it, and hand them over in the same pieces, with the same facts and the same state after every
    read, as the Python methods; reads of under 4 KiB are joined, by Python."""
    sizes = {"1 MiB": sizes_of(1 << 20), "64 KiB": sizes_of(64 << 10),
             "random": sizes_of(12, 13, 4100, 30_000, 150_000, 400_000, 1 << 20, seed=version * 7 + acks),
             "small": sizes_of(1000)}[reads]
    exchanges = bulk_produce(codec, version, acks, transactional_id=transactional_id)
    native, reference = pair(codec, SessionConfig(inspect_max_bytes=1 << 20))
    events: list = []
    taken = run_both(native, reference, cut(exchanges, sizes), events)
    frames = [type(e.frame) for e in events if type(e).__name__ == "Request"]
    assert len(frames) == len(exchanges)
    # a request whole in one read is bytes; one that came in large reads, pieces; in small reads, joined
    assert (FramePieces in frames) == (reads != "small")
    if acks != 0 and reads in ("1 MiB", "64 KiB") and transactional_id != "t" * 5000:
        assert taken >= len(exchanges), taken  # every request after the first, and the reads inside them


def test_a_request_whose_first_piece_is_shorter_than_its_header_is_read_by_python(codec):
    """A read that ends 12 bytes into a request (its size, api key, version and correlation id) leaves its
    header to the next read: the C reads give that request to Python, alike."""
    exchanges = bulk_produce(codec, 9, 1, requests=4, client_id="a-client-id-longer-than-a-few-bytes")
    stream_length = sum(len(request) for request, _ in exchanges)
    first = len(exchanges[0][0])
    steps = iter([first + 12, 100_000, 100_000, 100_000] + [stream_length] * 10)
    run_both_in_pieces(*pair(codec, SessionConfig(inspect_max_bytes=1 << 20)), cut(exchanges, steps))


def test_requests_in_pieces_leave_no_garbage(codec):
    """The pieces, views and stream state the C reads make for requests that span reads are all released with
    their events (each round: 10 requests of 300 KB in reads of 64 KiB, and their responses)."""
    exchanges = bulk_produce(codec, 9, 1)
    reads = cut(exchanges, sizes_of(64 << 10))

    def rounds():
        native, _ = pair(codec, SessionConfig(inspect_max_bytes=1 << 20))
        for side, data in reads:
            (native.client_data if side == "c" else native.broker_data)(data, 1.0)
        assert native.inflight == 0 and native.client_data.__self__.taken > 50

    assert bytes_grown(rounds, times=5) < 64 * 1024


def bulk_fetch(codec, version: int, responses: int = 10, header_tags: bytes = b""):
    """Framed Fetch requests and their responses of about 300 KB (a record set of 100 records of 3 KB), as a
    consumer of large batches is answered."""
    out = []
    for n in range(1, responses + 1):
        request = fetch(codec, n, "bulk", offset=100 * n, version=version, topic_id=uuid.UUID(int=7))
        records = [record_batch([bytes([n]) * 3000 for _ in range(100)])]
        out.append((request, fetch_response(codec, n, "bulk", records, version=version, header_tags=header_tags)))
    return out


def cut_responses(codec, exchanges, sizes, between: bool = False) -> list[tuple[str, bytes]]:
    """Every request first (a consumer's fetches in flight), then the responses as one broker stream cut into
    reads of the sizes `sizes` yields; `between`: a small response sent after each (paired with
    a Metadata request sent with each Fetch)."""
    reads = []
    stream = b""
    for n, (request, response) in enumerate(exchanges):
        reads.append(("c", request))
        stream += response
        if between:
            reads.append(("c", _request(codec, 3, 12, 10_000 + n, {**METADATA_REQUEST, "Topics": []})))
            stream += _response(codec, 3, 12, 10_000 + n, {**METADATA_RESPONSE, "ClusterId": None})
    pos = 0
    while pos < len(stream):
        step = next(sizes)
        reads.append(("b", stream[pos:pos + step]))
        pos += step
    return reads



@pytest.mark.parametrize("version, header_tags", [(4, b""), (12, b""), (16, b""), (12, b"\x01\x07\x02hi")],
                         ids=["v4", "v12", "v16", "v12-header-tags"])
@pytest.mark.parametrize("reads, between", [
    *((reads, between) for reads in ("1 MiB", "64 KiB", "random", "small") for between in (False, True)),
    ("one a read", False),  # each response one read
])
def test_bulk_fetch_in_pieces_reads_alike(codec, version, header_tags, reads, between):
    """Responses of 300 KB cut into reads: the C reads pair each when its first bytes come, gather it from the
    read that starts it to the read that ends it, and hand it over in the same pieces, with the same facts and
    the same state after every read, as the Python methods. A header with tagged fields is Python's."""
    exchanges = bulk_fetch(codec, version, header_tags=header_tags)
    sizes = {"1 MiB": sizes_of(1 << 20), "64 KiB": sizes_of(64 << 10),
             "random": sizes_of(12, 13, 4100, 30_000, 150_000, 400_000, 1 << 20, seed=version),
             "small": sizes_of(1000), "one a read": iter(len(r) for _, r in exchanges)}[reads]
    native, reference = pair(codec)
    events: list = []
    taken = run_both(native, reference, cut_responses(codec, exchanges, sizes, between), events)
    frames = [type(e.frame) for e in events if type(e).__name__ == "Response" and e.api_key == 1]
    assert len(frames) == len(exchanges)
    assert (FramePieces in frames) == (reads != "small")
    if not header_tags and reads in ("1 MiB", "64 KiB", "one a read"):
        # every request but the first (its header is new) and every response, or the reads that make it
        assert taken >= 2 * len(exchanges) - 1, taken


def test_fetch_responses_in_pieces_leave_no_garbage(codec):
    """The pieces, views and stream state the C reads make for responses that span reads are all released with
    their events (each round: 10 responses of 300 KB in reads of 64 KiB, after their requests)."""
    reads = cut_responses(codec, bulk_fetch(codec, 12), sizes_of(64 << 10))

    def rounds():
        native, _ = pair(codec)
        for side, data in reads:
            (native.client_data if side == "c" else native.broker_data)(data, 1.0)
        assert native.inflight == 0 and native.client_data.__self__.taken > 50

    assert bytes_grown(rounds, times=5) < 64 * 1024
