"""Exchanges whose bodies share one scan (the metrics' memo) give the facts a fresh read gives; alike sides are shared
before they cross to the writer process, and build the same rows."""

from __future__ import annotations

import os
import pickle
import random

import pytest

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.count_later import LaterCounter
from kinspect.capture import facts as facts_module
from kinspect.capture.facts import (FIELDS, FactsTaker, held_bytes, held_total, share_alike_sides,
                                    share_alike_sides_python)
from kinspect.capture.facts_wire import encode_python
from kinspect.capture.writer_process import PICKLE_ROWS, pickled_slices, read_batch
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session
from tests.capture.test_capture import recorded_facts
from tests.support.paths import TRAFFIC


def test_shared_scans_give_the_same_facts(codec: Codec):
    taker = FactsTaker(codec)  # before any scan: scans count integer fields from here on
    metrics = MetricsObserver()
    shared = fresh = 0
    for requests in sorted(TRAFFIC.glob("*/*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        for _ in range(2):  # the same conversation twice: its bodies repeat
            session = Session(codec, ConnectionInfo(1, "c:1", "b:1"))
            events = session.client_data(requests.read_bytes(), 1.0).events
            events += session.broker_data(responses.read_bytes(), 2.0).events
            for event in events:
                if type(event).__name__ in ("Request", "Response"):
                    metrics.handlers[type(event)](event)
            for event in events:
                if type(event) is Exchange:
                    scans = [e._scanned for e in (event.request, event.response) if e is not None]
                    got, held = taker.take(event)
                    fresh_facts, fresh_held = FactsTaker(codec).take(event)
                    # Alike, as the writer sees them: a shared SCAN's frame to count may be an earlier request's
                    # with the same body (another correlation id), so the two are compared counted.
                    assert counted(got) == counted(fresh_facts) and held == fresh_held
                    shared += any(s is not None for s in scans)
                    fresh += 1
    assert fresh > 200 and shared > 100


REQ, RESP = FIELDS.index("request_side"), FIELDS.index("response_side")


def counted(facts: tuple) -> tuple:
    """The facts with the integer counters the event loop left for later counted, as the writer counts them."""
    return LaterCounter().count([facts])[0]


def copied(side):
    """An equal side that is another object, nested tuples and all (as a fresh scan of a like body gives)."""
    return pickle.loads(pickle.dumps(side))


def with_side(row: tuple, index: int, side) -> tuple:
    return row[:index] + (side,) + row[index + 1:]


def native_batch_functions():
    """capture._take's share_alike_sides and held_total: they fail (never skip) where not built, but under
    KINSPECT_PURE_PYTHON=1."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        assert facts_module._batch_functions() is None
        pytest.skip(f"{PURE_PYTHON_ENV}=1 chooses the Python")
    native = facts_module._batch_functions()
    assert native is not None, "kinspect.capture._take is not built; reinstall with a C compiler"
    return native


def native_share(rows):
    return native_batch_functions()[0](rows, REQ, RESP, 7)


@pytest.mark.parametrize("share", [share_alike_sides_python, native_share], ids=["python", "c"])
def test_alike_sides_are_shared_and_nothing_else_changes(codec: Codec, share):
    """Each side equal to the previous row's becomes that row's object; a side that differs anywhere (its records
    or only its integer counters) keeps its own; reasons and absent responses stay as they are."""
    raw = [f for f, _ in recorded_facts(codec)]
    facts = LaterCounter().count(raw)  # counters as bytes, each row a copy of its own
    scanned = [f for f in facts if type(f[REQ]) is tuple and type(f[RESP]) is tuple and f[REQ][4]]
    later = [f for f in raw if type(f[REQ]) is tuple and type(f[REQ][4]) is tuple]
    assert later
    with_records = [f for f in facts if type(f[REQ]) is tuple and f[REQ][7]]
    assert scanned and with_records
    rows = []
    for base in scanned[:40] + with_records[:20]:
        counters = bytearray(base[REQ][4])
        counters[0] ^= 1
        other_records = base[REQ][7] if not base[REQ][7] else ((((2, 99, "none", 1),),) + base[REQ][7][1:])
        rows += [
            base,
            with_side(with_side(base, REQ, copied(base[REQ])), RESP, copied(base[RESP])),
            with_side(base, REQ, copied(base[REQ])),
            with_side(base, REQ, base[REQ][:4] + (bytes(counters),) + base[REQ][5:]),  # counters differ, records alike
            with_side(base, REQ, copied(base[REQ])),
            with_side(base, REQ, base[REQ][:7] + (other_records,)),
            with_side(base, RESP, "the response could not be read"),
            with_side(base, RESP, "the response could not be read"),
            with_side(base, RESP, None),
        ]
    for base in later[:20]:  # frames to count: alike when equal (the same frame), not when only the bodies are
        other_frame = base[REQ][4][0][:-1] + bytes([base[REQ][4][0][-1] ^ 1])
        rows += [base, with_side(base, REQ, copied(base[REQ])),
                 with_side(base, REQ, base[REQ][:4] + ((other_frame, base[REQ][4][1]),) + base[REQ][5:])]
    shared = share(rows)
    assert shared == rows and len(shared) == len(rows)
    sharing = 0
    for i, (row, out) in enumerate(zip(rows, shared)):
        for index in (REQ, RESP):
            alike = i > 0 and type(row[index]) is tuple and row[index] == rows[i - 1][index]
            if alike:
                assert out[index] is shared[i - 1][index]
                sharing += row[index] is not rows[i - 1][index]
            else:
                assert out[index] is row[index]
        if out[REQ] is row[REQ] and out[RESP] is row[RESP]:
            assert out is row  # not rebuilt
    assert sharing > 100


@pytest.mark.parametrize("encoding", ["encoded", "pickled"])
def test_alike_sides_cross_the_pipe_once_and_build_the_same_rows(codec: Codec, encoding):
    """A producer's alike requests, each with scans of its own: the batch's message holds their sides once (encoded,
    as the writer thread sends it; pickled a slice at a time, where the encoder declines), and the writer process
    builds the rows the sides unshared give."""
    facts = [f for f, _ in recorded_facts(codec)]
    produce = [f for f in facts if f[FIELDS.index("api_name")] == "Produce" and type(f[REQ]) is tuple]
    assert produce
    rows = [with_side(with_side(f, REQ, copied(f[REQ])), RESP, copied(f[RESP])) for f in produce for _ in range(40)]
    unshared = sum(len(pickle.dumps(rows[i:i + PICKLE_ROWS], protocol=5)) for i in range(0, len(rows), PICKLE_ROWS))
    shared = share_alike_sides(rows)
    payload = encode_python(shared) if encoding == "encoded" else b"".join(pickled_slices(shared))
    assert len(payload) < unshared / 3
    got = read_batch(payload)
    assert got == rows
    assert got[1][REQ] is got[2][REQ]
    builder = BatchBuilder(0.0, codec.registry)
    assert builder.build(got).equals(BatchBuilder(0.0, codec.registry).build(rows))


def sharing_pattern(rows: list) -> list:
    """Per row: which earlier row's object each side is (its first row), and whether the row is a given one."""
    first: dict[int, int] = {}
    return [(first.setdefault(id(row[REQ]), i), first.setdefault(id(row[RESP]), i)) for i, row in enumerate(rows)]


def test_the_c_sharing_shares_what_the_python_shares(codec: Codec):
    """Random runs of rows, alike or not, in every order: the C gives the reference's rows, sides shared and rows
    rebuilt alike; the bytes held summed alike; what is not a row of tuples raises in both."""
    native_share_, native_held = native_batch_functions()
    facts = [f for f, _ in recorded_facts(codec)]
    rng = random.Random(5)
    sides = [f[REQ] for f in facts] + [f[RESP] for f in facts] + ["a reason", None]
    for _ in range(300):
        rows = []
        for _ in range(rng.randrange(0, 40)):
            base = rng.choice(facts)
            req = rng.choice([base[REQ], copied(base[REQ]), rng.choice(sides)])
            resp = rng.choice([base[RESP], copied(base[RESP]), rng.choice(sides)])
            row = with_side(with_side(base, REQ, req), RESP, resp)
            rows += [row] * rng.choice((1, 1, 2)) + [with_side(row, REQ, copied(req))] * rng.choice((0, 1))
        given = list(rows)
        mine, theirs = native_share_(rows, REQ, RESP, 7), share_alike_sides_python(rows)
        assert rows == given  # the list given is left as it was
        assert mine == theirs == rows
        assert sharing_pattern(mine) == sharing_pattern(theirs)
        assert [m is r for m, r in zip(mine, rows)] == [t is r for t, r in zip(theirs, rows)]
        assert native_held(rows, facts_module.BASE_BYTES, facts_module.TOPIC_BYTES, REQ, RESP) == \
            sum(map(held_bytes, rows)) == held_total(rows)
    short = facts[0][:RESP]
    with pytest.raises(IndexError):
        share_alike_sides_python([short])
    with pytest.raises(IndexError):
        native_share_([short], REQ, RESP, 7)
    with pytest.raises(TypeError):  # rows are EXCHANGE tuples (the Python takes a list it need not rebuild)
        native_share_([list(facts[0])], REQ, RESP, 7)
    with pytest.raises(IndexError):
        native_held([short], 1, 1, REQ, RESP)
    scan = next(f[REQ] for f in facts if type(f[REQ]) is tuple)
    for bad_scan in (scan[:5], scan[:7]):  # SCANs cut short: the records or the counters missing
        rows = [with_side(facts[0], REQ, bad_scan), with_side(facts[0], REQ, copied(bad_scan))]
        for share in (share_alike_sides_python, lambda r: native_share_(r, REQ, RESP, 7)):
            with pytest.raises(IndexError):
                share(rows)
    assert share_alike_sides((rows[0],)) == [rows[0]]  # not a list: the Python takes it
