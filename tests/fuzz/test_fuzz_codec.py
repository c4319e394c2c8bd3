"""Hostile bytes for every (api, version, direction) body and every header: a value or a DecodeError, C and Python alike.

Each input goes through the oracle of the atheris harness (fuzz/fuzz_codec.py `agree`):
the C decoder and scanner and the generated Python reference must both accept or both
reject it, with identical values and scans, and the public decode and scan must return a
value or raise DecodeError, nothing else. Inputs are valid encodings (from the spec model)
mutated: truncations, bit flips, inserted and deleted bytes, huge and negative int32
lengths, overlong varints, compact lengths of 0xFFFFFFFF, crafted tag sections (duplicate,
descending, oversized), plus plain random bytes. Bounded for CI: a fixed seed
(derandomize) and a few examples per case, more for the hot apis.
"""

from __future__ import annotations

import importlib.util
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.errors import DecodeError
from tests.spec_values import struct_value
from tests.support.paths import ROOT

_spec = importlib.util.spec_from_file_location(
    "fuzz_codec", ROOT / "fuzz" / "fuzz_codec.py")
fuzz_codec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_codec)

CODEC = fuzz_codec.CODEC
CASES = [
    (key, direction, version)
    for key in CODEC.registry.api_keys()
    for direction in ("request", "response")
    for version in CODEC.registry.versions(key, direction)
]
HOT_KEYS = (0, 1, 3, 18)  # Produce, Fetch, Metadata, ApiVersions
HOT = [c for c in CASES if c[0] in HOT_KEYS]
HEADERS = [("RequestHeader", 0), ("RequestHeader", 1), ("RequestHeader", 2), ("ResponseHeader", 0),
           ("ResponseHeader", 1)]

pytestmark = pytest.mark.timeout(120)
_BOUNDED = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def _id(case) -> str:
    key, direction, version = case
    return f"{CODEC.registry.api_name(key)}-{direction}-v{version}"


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Byte runs that hit the length and varint checks: int32 lengths at the extremes, compact
# lengths of 2^32-1 (the largest uvarint32), overlong varints (6+ bytes for 32 bits, 11+
# for 64), a varint that never ends, and -1 (null) where nulls may not be.
HOSTILE_RUNS = [
    struct.pack(">i", 2**31 - 1), struct.pack(">i", -(2**31)), struct.pack(">i", -2), struct.pack(">i", -1),
    struct.pack(">h", 32767), struct.pack(">h", -2), struct.pack(">i", 0x00FFFFFF),
    b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07",
    b"\x80\x80\x80\x80\x80\x00", b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00", b"\xff" * 12, b"\x80" * 5,
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
]


@st.composite
def mutated(draw, encoded: bytes) -> bytes:
    """One hostile variant of a valid encoding."""
    n = len(encoded)
    kind = draw(st.sampled_from(["cut", "flip", "insert", "delete", "splice", "overwrite", "random"]))
    at = draw(st.integers(0, n))
    if kind == "cut":
        return encoded[:at]
    if kind == "flip":
        out = bytearray(encoded)
        for _ in range(draw(st.integers(1, 4)) if n else 0):
            bit = draw(st.integers(0, n * 8 - 1))
            out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)
    if kind == "insert":
        return encoded[:at] + draw(st.binary(min_size=1, max_size=8)) + encoded[at:]
    if kind == "delete":
        return encoded[:at] + encoded[at + draw(st.integers(1, 8)):]
    run = draw(st.sampled_from(HOSTILE_RUNS))
    if kind == "splice":
        return encoded[:at] + run + encoded[at:]
    if kind == "overwrite":
        return encoded[:at] + run + encoded[at + len(run):]
    return draw(st.binary(max_size=64))


def _without_tags(value: dict, compiled) -> dict:
    """The top-level value with no tagged field, so that the encoding ends in an empty tag section."""
    tagged = {f.name for f in compiled.spec.struct.fields if f.tag is not None}
    return {k: v for k, v in value.items() if k not in tagged and k != UNKNOWN_TAGS}


@st.composite
def tag_section(draw, known_tags: list[int]) -> bytes:
    """A top-level tag section built to break the rules: repeated or descending tags, known tags
    with wrong sizes, huge tag numbers and sizes, a count larger than what follows."""
    pool = st.sampled_from(known_tags) | st.integers(0, 40) if known_tags else st.integers(0, 40)
    entries = draw(st.lists(st.tuples(
        pool | st.just(2**31 - 1) | st.just(2**32 - 1),
        st.binary(max_size=12),
        st.sampled_from(["exact", "short", "long", "huge"]),
    ), min_size=1, max_size=4))
    order = draw(st.sampled_from(["as drawn", "duplicate", "descending"]))
    if order == "duplicate":
        entries = entries + entries[:1]
    elif order == "descending":
        entries = sorted(entries, key=lambda e: -e[0])
    count = len(entries) + draw(st.sampled_from([0, 0, 1, 1000]))
    out = bytearray(uvarint(count))
    for tag, data, size in entries:
        declared = {"exact": len(data), "short": max(len(data) - 1, 0), "long": len(data) + 3,
                    "huge": 2**32 - 1}[size]
        out += uvarint(tag) + uvarint(declared) + data
    return bytes(out)


def _exercise(compiled, data) -> None:
    value = data.draw(struct_value(compiled.spec.struct, compiled.version, compiled.flexible), label="value")
    encoded = bytes(compiled.encode(value))
    fuzz_codec.agree(compiled, encoded, 0)
    for _ in range(3):
        fuzz_codec.agree(compiled, data.draw(mutated(encoded), label="mutated"), 0)
    if compiled.flexible:
        plain = bytes(compiled.encode(_without_tags(value, compiled)))
        assert plain[-1] == 0  # the empty top-level tag section
        known = [f.tag for f in compiled.spec.struct.fields if f.tag is not None]
        fuzz_codec.agree(compiled, plain[:-1] + data.draw(tag_section(known), label="tags"), 0)


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(max_examples=2, **_BOUNDED)
@given(data=st.data())
def test_every_body_decoder(case, data):
    _exercise(CODEC.body(*case), data)


@pytest.mark.parametrize("case", HOT, ids=_id)
@settings(max_examples=12, **_BOUNDED)
@given(data=st.data())
def test_hot_body_decoders(case, data):
    _exercise(CODEC.body(*case), data)


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: f"{h[0]}-v{h[1]}")
@settings(max_examples=60, **_BOUNDED)
@given(data=st.data())
def test_headers(header, data):
    _exercise(CODEC.header(*header), data)


@settings(max_examples=300, **_BOUNDED)
@given(prefix=st.sampled_from(CASES), tail=st.binary(max_size=80), client_id=st.binary(max_size=6))
def test_whole_request_frames(prefix, tail, client_id):
    """Frames with a real (api, version) prefix and hostile rest: header decode, body decode, scan."""
    key, _, version = prefix
    frame = struct.pack(">hhi", key, version, 7) + client_id + tail
    fuzz_codec.check_request(frame)


@settings(max_examples=300, **_BOUNDED)
@given(frame=st.binary(max_size=120))
def test_random_request_frames(frame):
    fuzz_codec.check_request(frame)


@settings(max_examples=300, **_BOUNDED)
@given(case=st.sampled_from([c for c in CASES if c[1] == "response"]), frame=st.binary(max_size=120))
def test_random_response_frames(case, frame):
    fuzz_codec.check_response(struct.pack(">hh", case[0], case[2]) + frame)


def _hostile_bodies() -> list[bytes]:
    bodies = []
    for run in HOSTILE_RUNS:
        bodies.append(run * 8)
        bodies.append(b"\x01" + run * 4)  # a one-byte lead shifts every later length by one
    return bodies


def test_huge_lengths_allocate_in_proportion_to_the_input():
    """Every decoder and scanner fed length fields claiming up to 2^32-1 of everything:
    DecodeError (or a value) without allocating what the lengths claim."""
    bodies = _hostile_bodies()
    structs = [CODEC.body(*c) for c in CASES] + [CODEC.header(*h) for h in HEADERS]
    for compiled in structs:  # compile first: the codecs' own size is not what is measured
        fuzz_codec._Reference.of(compiled)
        compiled.diagnose(b"", 0, ValueError())  # the tracing decoder that names a failure's field
        try:
            compiled.scan(b"", whole=False)  # the pure-Python scanner, when that is what serves
        except DecodeError:
            pass
    worst = (0, None)
    tracemalloc.start()
    try:
        for compiled in structs:
            for body in bodies:
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                for call in (compiled.decode, compiled.scan, compiled.decode_python):
                    try:
                        call(body, 0) if call is compiled.decode_python else call(body, 0, whole=False)
                    except (DecodeError, *fuzz_codec._RAW_FAILURES):
                        pass
                grown = tracemalloc.get_traced_memory()[1] - base
                if grown > worst[0]:
                    worst = (grown, f"{compiled.label} on {body[:16].hex()}")
                assert grown < 1024 * 1024 + 64 * len(body), (grown, compiled.label, body.hex())
    finally:
        tracemalloc.stop()
    assert worst[1] is not None  # the loop measured something


def test_mutation_strategies_reach_the_checks():
    """The hostile runs are rejected where they land on a length (a guard against a no-op fuzzer)."""
    compiled = CODEC.body(3, "request", 12)  # Metadata v12: compact array of topics first
    for run, reason in ((b"\xff\xff\xff\xff\x0f", "overruns"), (b"\x80\x80\x80\x80\x80\x00", "longer than 5 bytes"),
                        (b"\xfe\xff\xff\xff\x0f", "overruns")):
        with pytest.raises(DecodeError, match=reason):
            compiled.decode(run + b"\x00\x00\x00")
    with pytest.raises(DecodeError, match="ascending"):
        CODEC.body(18, "request", 3).decode(b"\x02a\x02b" + b"\x02\x05\x00\x05\x00")
