"""The capture's derived columns in C (capture._derive) against BatchBuilder._derived_python, their reference.

Both must give the same columns, value for value and type for type (compared by repr), the same integer
counters and slot table numbers: on every recorded conversation in batches of several sizes, with alike sides
shared or not; on facts made up from the recorded ones (sides that are reasons, exchanges without a response,
several record batches and compressions, negative counts, topics named by both directions, error codes out of
order, header tags, ints beyond 64 bits, a run of rows with one side); and a malformed row raises in both.
"""

from __future__ import annotations

import os
import random

import pytest

from kinspect.capture.batch import _DERIVED, BatchBuilder
from kinspect.capture.facts import share_alike_sides
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV
from tests.support.capture_facts import AT, recorded_facts, with_fields, with_side

# CI builds the extension: these tests fail (never skip) where it is missing, unless pure Python is chosen.
pytestmark = pytest.mark.skipif(os.environ.get(PURE_PYTHON_ENV) == "1",
                                reason="KINSPECT_PURE_PYTHON=1: no C to compare with the Python")


@pytest.fixture(scope="module")
def codec() -> Codec:
    codec = Codec()
    codec.integer_facts = True  # the capture's scans carry integer counters
    return codec


@pytest.fixture(scope="module")
def recorded(codec) -> list[tuple]:
    return recorded_facts(codec)


def _builders(codec) -> tuple[BatchBuilder, BatchBuilder]:
    native, reference = BatchBuilder(0.0, codec.registry), BatchBuilder(0.0, codec.registry, native=False)
    assert native._derive is not None, "capture._derive is not built"
    assert reference._derive is None
    return native, reference


def _same(native: BatchBuilder, reference: BatchBuilder, facts: list) -> None:
    got, expected = native._derived(facts), reference._derived(facts)
    assert list(got) == list(expected) == [*(n for n in _DERIVED if n != "integer_groups"), "integer_fields"]
    for name in _DERIVED[:-1]:
        assert repr(list(got[name])) == repr(list(expected[name])), name
    for part, g, e in zip(("counters", "tables", "groups"), got["integer_fields"], expected["integer_fields"]):
        assert repr(list(g)) == repr(list(e)), part


@pytest.mark.parametrize("size", [1, 7, 64, 512, 100_000])
@pytest.mark.parametrize("shared", [False, True])
def test_recorded_traffic(codec, recorded, size, shared):
    native, reference = _builders(codec)
    rows = recorded * 2
    for start in range(0, len(rows), size):
        batch = rows[start:start + size]
        _same(native, reference, share_alike_sides(batch) if shared else batch)


def _made_up(recorded: list[tuple], rng: random.Random, count: int) -> list[tuple]:
    """Rows of the recorded ones with sides and fields changed at random, runs of one side among them."""
    both = [r for r in recorded if type(r[AT["request_side"]]) is tuple and type(r[AT["response_side"]]) is tuple]
    produce, others = [r for r in both if r[AT["api_key"]] == 0], [r for r in both if r[AT["api_key"]] != 0]
    assert produce and others
    big = 1 << 70
    rows = []
    while len(rows) < count:
        base = rng.choice(produce if rng.random() < 0.4 else others)
        req, resp = base[AT["request_side"]], base[AT["response_side"]]
        kind = rng.randrange(12)
        if kind == 0:
            req = "truncated request"
        elif kind == 1:
            resp = None
            base = with_fields(base, response_size=None, response_header_tag_bytes=None, response_header_tags=None)
        elif kind == 2:
            resp = "the response did not decode"
        elif kind == 3:  # several batches, None among them, negative counts, several compressions
            req = with_side(req, records=(((2, 5, "zstd", 900), (2, -1, "none", 70)), None,
                                        ((1, 3, "gzip", 40), (2, 4, "zstd", 100))))
        elif kind == 4:  # one batch of a negative count
            req = with_side(req, records=(((2, -3, "lz4", 10),),))
        elif kind == 5:  # topics named by both directions, with different partition counts
            req = with_side(req, topics=(("b", 2), ("a", 1)))
            resp = with_side(resp, topics=(("a", 3), ("c", 1), ("b", 1)))
        elif kind == 6:  # only the response names topics; error codes out of order, one unknown
            req = with_side(req, topics=())
            resp = with_side(resp, topics=(("z", 1), ("y", 2)), codes=((3, 2), (-1, 1), (0, 5), (9999, 1)))
        elif kind == 7:  # body and header tags
            req = with_side(req, tag_bytes=5, tagged=(("Topics.x", 3, "Name", 4), ("", 9, None, 2)))
            resp = with_side(resp, tag_bytes=2, tagged=(("", 0, "ClusterId", 7),))
            base = with_fields(base, request_header_tags=((3, 4), (1, 0)), response_header_tags=((0, 2),))
        elif kind == 8:  # ints beyond 64 bits where sizes are summed
            req = with_side(req, delta=big, tag_bytes=big)
            resp = with_side(resp, delta=-big)
            base = with_fields(base, request_size=big, response_header_tag_bytes=big)
        elif kind == 9:  # records in the response (a Fetch's) joined to the request's
            resp = with_side(resp, records=(((2, 7, "snappy", 300),), ((0, 1, "none", 20),)))
        elif kind == 10:  # no integer counters in either direction
            req, resp = with_side(req, stats=None), with_side(resp, stats=None)
        client_id = rng.choice([None, "c", "é-client", ""])
        row = with_fields(base, request_side=req, response_side=resp, client_id=client_id)
        if kind == 11:  # the same sides under another api: worked out again (a Produce's magics, say)
            rows += [row, with_fields(row, api_key=1 if row[AT["api_key"]] == 0 else 0)]
        rows += [row] * rng.choice([1, 1, 1, 3])
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_made_up_facts(codec, recorded, seed):
    rng = random.Random(seed)
    native, reference = _builders(codec)
    for _ in range(5):
        _same(native, reference, _made_up(recorded, rng, rng.choice([1, 40, 300])))


@pytest.mark.parametrize("broken", ["short row", "short side", "a tag of three", "topics of one value"])
def test_malformed_facts_raise_in_both(codec, recorded, broken):
    row = next(r for r in recorded if type(r[AT["response_side"]]) is tuple)
    if broken == "short row":
        row = row[:-1]
    elif broken == "short side":
        row = with_fields(row, response_side=row[AT["response_side"]][:7])
    elif broken == "a tag of three":
        row = with_fields(row, request_header_tags=((1, 2, 3),))
    else:
        row = with_fields(row, request_side=with_side(row[AT["request_side"]], topics=(("a", 1),)),
                    response_side=with_side(row[AT["response_side"]], topics=(("a",),)))
    native, reference = _builders(codec)
    with pytest.raises((ValueError, TypeError)):
        reference._derived([row])
    with pytest.raises((ValueError, TypeError)):
        native._derived([row])
