"""Integer counters left for later (codegen.COUNT_LATER): the event loop's scans keep (frame, body start) instead of
counting, in C as in the Python reference; the writer counts them (capture.count_later) into the very columns the
event loop's counting gave."""

from __future__ import annotations

import os
import pickle

import pytest

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.count_later import LaterCounter
from kinspect.capture.facts import FIELDS, FactsTaker, held_bytes, held_total
from kinspect.capture.writer import CaptureWriter
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codegen import COUNT_LATER
from kinspect.protocol.codec.codec import CompiledStruct
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV, native_module
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.specs.registry import SpecRegistry, load_builtin_layers
from tests.capture.test_capture import read_rows, recorded_exchanges, recorded_facts
from tests.support.native import bytes_grown

REQ, RESP = FIELDS.index("request_side"), FIELDS.index("response_side")


def produce(compiled: CompiledStruct, acks: int) -> bytes:
    return bytes(compiled.encode({"TransactionalId": None, "Acks": acks, "TimeoutMs": 5, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 7, "Records": None}]}]}))


def python_reference(compiled: CompiledStruct) -> CompiledStruct:
    """The struct with the generated Python scanner alone (no C program)."""
    reference = CompiledStruct(compiled.spec, compiled.version, compiled.flexible, api=compiled.api,
                               api_key=compiled.api_key, direction=compiled.direction)
    reference._program = reference._scan = reference._scan_fresh = None
    return reference


def test_a_scan_leaves_a_whole_frame_s_counters_for_later_and_counts_pieces(codec: Codec):
    """COUNT_LATER: a bytes buffer gets int_stats (buf, pos) and the struct's slots, in C and in Python, nothing else
    changed; a frame in pieces is counted as before; a struct without integer fields gets neither."""
    compiled = codec.body(0, "request", 3)
    raw = b"\x00\x00\x00\x01" + produce(compiled, 1)  # a body 4 bytes into its buffer, as after a header
    counted = compiled.scan_fresh(raw, 4, True)
    paths = [compiled, python_reference(compiled)]
    if os.environ.get(PURE_PYTHON_ENV) != "1":
        assert native_module() is not None and compiled._scan_fresh is not None  # C is tested, not skipped
    for struct in paths:
        later = struct.scan_fresh(raw, 4, COUNT_LATER)
        assert later.int_stats == (raw, 4) and later.int_stats[0] is raw and later.int_slots == compiled.int_slots
        for name in ("tag_section_bytes", "error_codes", "topic_partitions", "compact_delta", "trailing_bytes"):
            assert getattr(later, name) == getattr(counted, name), name
        assert struct.scan_fresh(raw, 4, False).int_stats is None
        pieces = FramePieces((raw[:9], raw[9:]))
        in_pieces = struct.scan_fresh(pieces, 4, COUNT_LATER)
        assert in_pieces.int_stats == counted.int_stats and type(in_pieces.int_stats) is bytes
    plain = codec.body(18, "request", 3)  # ApiVersions v3 request: two strings, no integer field
    assert not plain.int_slots
    body = bytes(plain.encode({"ClientSoftwareName": "a", "ClientSoftwareVersion": "1"}))
    for struct in (plain, python_reference(plain)):
        result = struct.scan_fresh(body, 0, COUNT_LATER)
        assert result.int_stats is None and result.int_slots == ()
    with pytest.raises(ValueError, match="left for later"):  # a result holding a frame is not scanned into
        python_reference(compiled).scan(raw, 4, compiled.scan(raw, 4, whole=False, integers=COUNT_LATER), whole=False)


def test_a_capture_side_holding_a_frame_is_shared_where_the_bodies_are_equal(codec: Codec):
    """capture_side(previous): a side whose frame differs only before its body (another correlation id) is the
    previous SCAN; one whose body differs is a new SCAN of the previous one's items and its own frame; the Python
    reference decides alike. Its held bytes are the frame's."""
    compiled = codec.body(0, "request", 3)
    body = produce(compiled, 1)
    first = compiled.scan_fresh(b"head-one" + body, 8, COUNT_LATER)
    same_body = compiled.scan_fresh(b"head-two" + body, 8, COUNT_LATER)
    other_body = compiled.scan_fresh(b"head-two" + produce(compiled, -1), 8, COUNT_LATER)
    kept = first.frozen()
    assert kept[4] == (b"head-one" + body, 8) and kept == first.frozen_python()
    for result, shared in ((same_body, True), (other_body, False)):
        for freeze in (result.frozen, result.frozen_python):
            side = freeze(kept)
            assert (side is kept) is shared
            if not shared:  # alike but for its frame: the previous SCAN's items, its own frame
                assert side[4][0] is result.source and all(side[i] is kept[i] for i in (0, 1, 2, 3, 5, 6, 7))
    counted = compiled.scan_fresh(b"head-two" + body, 8, True)  # counters, not a frame: never alike a frame
    assert counted.frozen(kept) is not kept and counted.frozen_python(kept) is not kept
    facts = recorded_facts(codec, 40)
    later = [(f, held) for f, held in facts if type(f[REQ]) is tuple and type(f[REQ][4]) is tuple]
    assert later
    for f, held in later:
        assert held_bytes(f) == held >= len(f[REQ][4][0])
    assert held_total([f for f, _ in facts]) == sum(held for _, held in facts)


def test_counted_later_the_capture_s_rows_are_those_counted_on_the_event_loop(codec: Codec):
    """The recorded traffic taken as the capture takes it, its counters counted by the writer, builds the batch the
    same exchanges build when the event loop counts them (integer_facts True), integer_fields and all."""
    later = [f for f, _ in recorded_facts(codec)]
    assert codec.integer_facts is COUNT_LATER
    deferred = sum(type(f[i]) is tuple and type(f[i][4]) is tuple for f in later for i in (REQ, RESP))
    assert deferred > 200
    loop_codec = Codec(codec.registry)
    taker = FactsTaker(loop_codec)
    loop_codec.integer_facts = True  # as before: every scan counts
    on_loop = [taker.take(x)[0] for x in recorded_exchanges(loop_codec)]
    assert not any(type(f[i]) is tuple and type(f[i][4]) is tuple for f in on_loop for i in (REQ, RESP))
    assert LaterCounter(codec.registry).count(later) == on_loop
    ours = BatchBuilder(0.0, codec.registry).build(later)
    theirs = BatchBuilder(0.0, codec.registry).build(on_loop)
    assert ours.equals(theirs)
    assert sum(len(v) for v in ours.column("integer_fields").to_pylist()) > 1000


def test_a_side_many_rows_share_is_counted_once_and_stays_shared(codec: Codec):
    """LaterCounter: rows that share a side get one counted side; rows with nothing to count are the same objects."""
    facts = [f for f, _ in recorded_facts(codec) if type(f[REQ]) is tuple and type(f[REQ][4]) is tuple]
    row = facts[0]
    rows = [row, row[:1] + (2.0,) + row[2:], facts[1]] + [f for f, _ in recorded_facts(codec, 5)]
    counter = LaterCounter()
    out = counter.count(rows)
    assert out is not rows and out[0][REQ] is out[1][REQ] and type(out[0][REQ][4]) is bytes
    assert out[0][:REQ] == row[:REQ] and out[0][REQ + 1:RESP] == row[REQ + 1:RESP]
    assert counter.count(out) is out  # nothing left to count: the list itself


def test_the_writer_process_counts_with_the_proxy_s_own_specs(codec: Codec, tmp_path):
    """Built-in specs are not sent (the process loads them); a registry with layers of its own sends them, and the
    process counts with them: the files hold the rows the proxy's own builder makes."""
    assert BatchBuilder(0.0, codec.registry).spec_layers() is None
    builtin = load_builtin_layers()
    extended = SpecRegistry([*builtin, pickle.loads(pickle.dumps(builtin[-1]))])  # a copy: another layer object
    builder = BatchBuilder(0.0, extended)
    layers = builder.spec_layers()
    assert layers is not None and len(layers) == len(builtin) + 1
    facts = [f for f, _ in recorded_facts(codec)]
    w = CaptureWriter(tmp_path, builder, process=True).start()
    try:
        for f in facts:
            assert w.offer(f, held_bytes(f))
    finally:
        w.close()
    table = read_rows(w.files)
    expected = BatchBuilder(0.0, extended).build(facts)
    assert table.column("integer_fields").to_pylist() == expected.column("integer_fields").to_pylist()
    assert sum(len(v) for v in expected.column("integer_fields").to_pylist()) > 1000


def sharing(rows: list) -> list:
    """Per row: the first row whose request and response sides are the same objects as this row's."""
    first: dict[int, int] = {}
    return [(first.setdefault(id(r[REQ]), i), first.setdefault(id(r[RESP]), i))
            if type(r) is tuple and len(r) == len(FIELDS) else None for i, r in enumerate(rows)]


@pytest.mark.parametrize("cache_bodies", [256, 2])
def test_the_c_counter_gives_the_python_reference_s_rows(codec: Codec, monkeypatch, cache_bodies):
    """capture._count_later against LaterCounter.count_python: the recorded traffic (twice: the second time from
    the body cache), sides shared by rows, rows made up (an api the frame is not, no api, not an EXCHANGE): equal
    rows, shared alike; with a cache of two bodies, cleared again and again, the same."""
    from kinspect.capture import count_later

    if os.environ.get(PURE_PYTHON_ENV) == "1":
        assert LaterCounter()._native is None
        pytest.skip(f"{PURE_PYTHON_ENV}=1 chooses the Python")
    assert LaterCounter()._native is not None, "kinspect.capture._count_later is not built; reinstall with a C compiler"
    monkeypatch.setattr(count_later, "CACHED_BODIES", cache_bodies)
    facts = [f for f, _ in recorded_facts(codec)]
    later = [f for f in facts if type(f[REQ]) is tuple and type(f[REQ][4]) is tuple]
    at = FIELDS.index("api_key")
    made_up = [later[0][:at] + (0,) + later[0][at + 1:],  # counted as a Produce request: it does not scan
               later[1][:at] + (None,) + later[1][at + 1:], later[2][:5], later[3][:at] + (4242,) + later[3][at + 1:]]
    rows = facts + [later[0], later[5], later[0]] + made_up + facts
    native, python = LaterCounter(), LaterCounter(native=False)
    for _ in range(2):
        got, want = native.count(rows), python.count_python(rows)
        assert got == want and len(got) == len(rows)
        assert sharing(got) == sharing(want)
        assert [g is r for g, r in zip(got, rows)] == [w is r for w, r in zip(want, rows)]  # rebuilt alike
    assert not any(type(r[i]) is tuple and type(r[i][4]) is tuple for r in got if type(r) is tuple and len(r) == 29
                   for i in (REQ, RESP))
    assert native.count(got) is got


def produce_exchanges(codec: Codec, topics: list[str]) -> list:
    """Produce v9 exchanges, one per topic name given, each answered at a new base offset."""
    from tests.capture.test_capture_rows import exchange, req, resp

    out = []
    for i, topic in enumerate(topics):
        request = req(codec, 0, 9, {"TransactionalId": None, "Acks": 1, "TimeoutMs": 30000, "TopicData": [
            {"Name": topic, "PartitionData": [{"Index": 0, "Records": None}]}]}, correlation_id=i)
        response = resp(codec, 0, 9, {"Responses": [{"Name": topic, "PartitionResponses": [
            {"Index": 0, "ErrorCode": 0, "BaseOffset": 1000 + i, "LogAppendTimeMs": -1, "LogStartOffset": 0,
             "RecordErrors": [], "ErrorMessage": None}]}], "ThrottleTimeMs": 0}, correlation_id=i)
        out.append(exchange(codec, request, response))
    return out


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_an_api_whose_sides_differ_only_in_values_is_counted_in_the_scan(native):
    """A producer's acknowledgements (each at a new offset): the second comes out alike but for its frame (the first's
    items), the taker asks for counting now, and from the third on the counted sides are one shared SCAN. New facts
    each time (another topic) stay left for later; a counted side unlike a counted previous one goes back to later.
    The C taker and the Python one take the same facts and choose alike."""
    if native and os.environ.get(PURE_PYTHON_ENV) == "1":
        pytest.skip(f"{PURE_PYTHON_ENV}=1 chooses the Python")
    codec = Codec()
    taker = FactsTaker(codec, native=native)
    key = (0, 9, False)
    assert codec.integer_facts is COUNT_LATER and key not in codec._count_now

    def take_all(exchanges):
        out = []
        for x in exchanges:  # scanned and taken one by one, as the proxy's batches do
            x.request.scan(), x.response.scan()
            out.append(taker.take(x)[0])
        return out

    rows = take_all(produce_exchanges(codec, ["t"] * 50))
    sides = [r[RESP] for r in rows]
    assert type(sides[0][4]) is tuple and type(sides[1][4]) is tuple
    assert all(sides[1][i] is sides[0][i] for i in (0, 1, 2, 3, 5, 6, 7)) and sides[1] is not sides[0]
    assert key in codec._count_now and codec.fast_scans[key][1] is not COUNT_LATER
    assert type(sides[2][4]) is bytes and all(s is sides[2] for s in sides[3:])
    assert LaterCounter().count(rows[:2])[1][RESP][4] == sides[2][4]  # the writer's counting, the scan's: equal
    rows = take_all(produce_exchanges(codec, ["u", "v"]))  # counted, new facts: not alike a counted one
    assert key not in codec._count_now and codec.fast_scans[key][1] is COUNT_LATER
    rows = take_all(produce_exchanges(codec, [f"t{i}" for i in range(20)]))  # new facts every time: left for later
    assert key not in codec._count_now and all(type(r[RESP][4]) is tuple for r in rows)
    if native:
        reference = Codec()
        python = FactsTaker(reference, native=False)
        mine = produce_exchanges(codec, ["w"] * 10 + ["x", "y"] + ["z"] * 5)
        theirs = produce_exchanges(reference, ["w"] * 10 + ["x", "y"] + ["z"] * 5)
        got, want = [], []
        for a, b in zip(mine, theirs):
            a.request.scan(), a.response.scan(), b.request.scan(), b.response.scan()
            got.append(taker.take(a)[0])
            want.append(python.take(b)[0])
        assert LaterCounter().count(got) == LaterCounter().count(want)
        assert [type(r[RESP][4]) for r in got] == [type(r[RESP][4]) for r in want]
        assert codec._count_now == reference._count_now


def test_integer_facts_set_again_brings_the_fast_scans_in_line(codec: Codec):
    """Codec.integer_facts set to True, False or COUNT_LATER rewrites each fast scan's stats argument; count_now
    names one key."""
    fresh = Codec(codec.registry)
    fresh.integer_facts = COUNT_LATER
    compiled = fresh.body(0, "request", 9)
    frame = b"".join(x.request.frame for x in produce_exchanges(fresh, ["t"])[:1])
    fresh.scan_request(frame)
    key = (0, 9, True)
    assert fresh.fast_scans[key][1] is COUNT_LATER
    fresh.count_now(0, 9, True, True)
    assert fresh.fast_scans[key][1] is compiled._zero_stats and type(fresh.scan_request(frame).int_stats) is bytes
    fresh.count_now(0, 9, True, False)
    assert fresh.fast_scans[key][1] is COUNT_LATER and type(fresh.scan_request(frame).int_stats) is tuple
    fresh.integer_facts = True
    assert fresh.fast_scans[key][1] is compiled._zero_stats
    fresh.integer_facts = False
    assert fresh.scan_request(frame).int_stats is None


def test_the_c_counter_leaks_nothing(codec: Codec):
    """Counted again and again (the body cache full and cleared, rows made up among them), the C counter's memory
    stays where it was."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        pytest.skip(f"{PURE_PYTHON_ENV}=1 chooses the Python")
    facts = [f for f, _ in recorded_facts(codec)]
    later = [f for f in facts if type(f[REQ]) is tuple and type(f[REQ][4]) is tuple]
    at = FIELDS.index("api_key")
    rows = facts + [later[0][:at] + (0,) + later[0][at + 1:], later[1][:at] + (None,) + later[1][at + 1:], later[2][:5]]
    counter = LaterCounter()
    assert counter._native is not None

    def run() -> None:
        for _ in range(20):
            counter.count(rows)

    grown = bytes_grown(run, times=5)
    assert grown < 20_000, f"{grown} bytes still allocated after 100 rounds"
