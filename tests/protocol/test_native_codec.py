"""The C decoder/scanner (_wire) agrees exactly with the generated pure-Python codecs, on valid and malformed bytes."""

from __future__ import annotations

import copy
import io
import pickle
import random
import struct
import tracemalloc
import uuid
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec import codegen
from kinspect.protocol.codec.codec import DECODE_FAILURES, Codec, CompiledStruct, _compile
from kinspect.protocol.wire.primitives import Malformed
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.specs.model import parse_message
from kinspect.protocol.codec.wire_program import build_program, native_available
from tests.spec_values import struct_value
from tests.support.native import native_module

_wire, _MISSING = native_module("kinspect.protocol.codec._wire")

CODEC = Codec()
CASES = [
    (key, direction, version)
    for key in CODEC.registry.api_keys()
    for direction in ("request", "response")
    for version in CODEC.registry.versions(key, direction)
]
HEADERS = [(name, v) for name, top in (("RequestHeader", 2), ("ResponseHeader", 1)) for v in range(top + 1)
           if CODEC.registry.header(name, v) is not None]

# Every feature of the format the real specs lack (KAFKA-9927 encodings, float64 and uuid
# arrays, nullable structs, structs and topic names in tagged fields, field-level
# flexibleVersions), in one message.
_SYNTHETIC = {
    "apiKey": 32000, "type": "response", "name": "NativeProbeResponse", "validVersions": "0-3",
    "flexibleVersions": "2+",
    "fields": [
        {"name": "ErrorCode", "type": "int16", "versions": "0+"},
        {"name": "Small", "type": "int8", "versions": "0+"},
        {"name": "Port", "type": "uint16", "versions": "0+"},
        {"name": "Big", "type": "uint32", "versions": "0+"},
        {"name": "Ratio", "type": "float64", "versions": "0+"},
        {"name": "Flag", "type": "bool", "versions": "0+"},
        {"name": "Id", "type": "uuid", "versions": "0+"},
        {"name": "Stamp", "type": "int64", "versions": "0+"},
        {"name": "PackedErrorCode", "type": "int16", "versions": "0+", "encoding": "packed16"},
        {"name": "Wide", "type": "int16", "versions": "0+", "encoding": {"0-1": "packed64", "2+": "upacked64"}},
        {"name": "Loose", "type": "int16", "versions": "0+", "encoding": "upacked32"},
        {"name": "Narrow", "type": "int32", "versions": "0+", "encoding": "fixed16"},
        {"name": "Fixed64", "type": "int32", "versions": "0+", "encoding": "fixed64"},
        {"name": "Unsigned64", "type": "int64", "versions": "0+", "encoding": "upacked64"},
        {"name": "Packed64", "type": "int64", "versions": "0+", "encoding": "packed64"},
        {"name": "Packed32", "type": "int32", "versions": "0+", "encoding": {"0-2": "packed32", "3+": "fixed32"}},
        {"name": "Topic", "type": "string", "versions": "0+", "entityType": "topicName", "nullableVersions": "1+"},
        {"name": "Topics", "type": "[]string", "versions": "0+", "entityType": "topicName"},
        {"name": "Blobs", "type": "[]bytes", "versions": "0+", "nullableVersions": "3+"},
        {"name": "Ids", "type": "[]uuid", "versions": "0+"},
        {"name": "Ratios", "type": "[]float64", "versions": "0+"},
        {"name": "Flags", "type": "[]bool", "versions": "0+"},
        {"name": "Smalls", "type": "[]int8", "versions": "0+"},
        {"name": "Ports", "type": "[]uint16", "versions": "0+"},
        {"name": "Bigs", "type": "[]uint32", "versions": "0+"},
        {"name": "Longs", "type": "[]int64", "versions": "1+"},
        {"name": "Records", "type": "records", "versions": "0+", "nullableVersions": "0+"},
        {"name": "Legacy", "type": "string", "versions": "0+", "flexibleVersions": "none", "nullableVersions": "0+"},
        {"name": "LegacyBlob", "type": "bytes", "versions": "0+", "flexibleVersions": "3+"},
        {"name": "Maybe", "type": "Inner", "versions": "0+", "nullableVersions": "1+"},
        {"name": "Items", "type": "[]Item", "versions": "0+", "nullableVersions": "2+", "fields": [
            {"name": "ErrorCode", "type": "int16", "versions": "0+"},
            {"name": "Name", "type": "string", "versions": "0+", "entityType": "topicName"},
            {"name": "Payload", "type": "bytes", "versions": "0+", "nullableVersions": "0+"},
            {"name": "Child", "type": "Inner", "versions": "1+"},
            {"name": "Hint", "type": "int64", "versions": "2+", "taggedVersions": "2+", "tag": 3},
        ]},
        {"name": "Extra", "type": "int32", "versions": "2+", "taggedVersions": "2+", "tag": 0},
        {"name": "ExtraStruct", "type": "Tagged", "versions": "2+", "taggedVersions": "2+", "tag": 1,
         "nullableVersions": "2+", "fields": [
             {"name": "Inner", "type": "int32", "versions": "0+"},
             {"name": "Deep", "type": "[]string", "versions": "0+", "entityType": "topicName"},
             {"name": "DeepTag", "type": "uuid", "versions": "2+", "taggedVersions": "2+", "tag": 0},
         ]},
        {"name": "ExtraNames", "type": "[]string", "versions": "3+", "taggedVersions": "3+", "tag": 5,
         "entityType": "topicName", "nullableVersions": "3+"},
        {"name": "ExtraCode", "type": "int16", "versions": "3+", "taggedVersions": "3+", "tag": 7,
         "encoding": "packed16"},
    ],
    "commonStructs": [
        {"name": "Inner", "versions": "0+", "fields": [
            {"name": "Value", "type": "int32", "versions": "0+"},
            {"name": "Note", "type": "string", "versions": "1+", "nullableVersions": "1+"},
        ]},
    ],
}
SYNTHETIC = parse_message(_SYNTHETIC, "<native probe>")
SYNTHETIC_CASES = list(range(4))

_MISSING_SENTINEL = object()
_harnesses: dict = {}


def _id(case):
    key, direction, version = case
    return f"{CODEC.registry.api_name(key)}-{direction}-v{version}"


_PLAIN = frozenset({int, str, bytes, bool, type(None)})


def _pickled(value) -> bytes:
    """value's pickle without the memo, so that an object held twice pickles as two equal objects do:
    one C call where _same's walk was 13 million Python calls a run (a third of the module's CPU time).
    Types are kept (bool and int, tuple and list, subclasses), dict order too, floats bit for bit."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, 5)
    pickler.fast = True
    pickler.dump(value)
    return out.getvalue()


def _same(a, b) -> bool:
    """same() as a yes/no without building paths: the common case, so that only a difference pays for
    the walk that names where it is (this comparison was half the module's CPU time)."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _PLAIN:
        return a == b
    if kind is dict or kind is list or kind is tuple:
        try:  # equal pickles: equal structures of equal types (the walk below decides anything else)
            if _pickled(a) == _pickled(b):
                return True
        except Exception:  # not picklable (a memoryview, a cycle, a local class): the walk below decides
            pass
    if kind is dict:
        return list(a) == list(b) and all(map(_same, a.values(), b.values()))
    if kind is list or kind is tuple:
        if len(a) != len(b):
            return False
        kinds = list(map(type, a))
        if kinds != list(map(type, b)):
            return False
        if _PLAIN.issuperset(kinds):  # long lists of counts and spans: compared in C
            return a == b
        return all(map(_same, a, b))
    if kind is float:
        return struct.pack(">d", a) == struct.pack(">d", b)
    try:  # anything else (uuids, sets, subclasses): the full walk decides
        _walk(a, b, "$")
    except AssertionError:
        return False
    return True


def same(a, b, where: str = "$") -> None:
    """Exact equality, types and dict key order included (floats bit for bit)."""
    if not _same(a, b):
        _walk(a, b, where)
        raise AssertionError(f"{where}: {a!r} != {b!r}")  # _same and _walk disagree: a bug here


def _walk(a, b, where: str) -> None:
    """same(), naming the path of the first difference."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            _walk(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, uuid.UUID):
        assert (a.int, a.is_safe) == (b.int, b.is_safe), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (set, frozenset)):
        assert a == b, f"{where}: {a!r} != {b!r}"
        assert sorted(map(type, a), key=str) == sorted(map(type, b), key=str)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


class _Tuple(tuple):
    """A tuple of another class: equal to a tuple alike, but not read in place by capture_side."""


def _changed(part):
    """A part of a SCAN made unequal to itself: a number moved, bytes and tuples grown, None made 0."""
    if part is None:
        return 0
    if type(part) is int:
        return part + 1
    if type(part) is bytes:
        return part + b"\x00" if not part else bytes([part[0] ^ 1]) + part[1:]
    if type(part) is tuple:
        return part[:-1] + (_changed(part[-1]),) if part else ((),)
    return (part,)


def scan_state(r: ScanResult) -> tuple:
    """Everything a scan leaves: the records spans, the summaries ScanResult.records makes of them, and the capture facts."""
    return (r.tag_sections, r.tag_section_bytes, list(r.empty_counter), list(r.tagged_fields),
            dict(r.error_codes), set(r.topics), list(r.record_spans),
            [x.to_dict() if x is not None else None for x in r.records],
            r.int_slots, None if r.int_stats is None else list(r.int_stats), dict(r.topic_partitions), r.compact_delta)


def as_pieces(buf: bytes, rng: random.Random) -> FramePieces:
    """buf cut at random places into bytes, memoryview and bytearray pieces, some of them empty."""
    cuts = sorted(rng.sample(range(len(buf) + 1), min(len(buf) + 1, rng.randint(1, 6)))) if buf else []
    bounds = [0, *cuts, len(buf)]
    kinds = (bytes, memoryview, bytearray)
    return FramePieces(rng.choice(kinds)(buf[a:b]) for a, b in zip(bounds, bounds[1:]))


def fresh_result(compiled: CompiledStruct) -> ScanResult:
    """An empty ScanResult with the integer slots of the struct, as CompiledStruct.scan prepares it."""
    result = ScanResult()
    if compiled.int_slots:
        result.int_slots = compiled.int_slots
        result.int_stats = compiled._zero_stats[:]
    return result


class Harness:
    """The reference decoder and scanner of one struct version next to the C program."""

    def __init__(self, compiled: CompiledStruct) -> None:
        if _wire is None:
            pytest.fail(_MISSING)
        self.compiled = compiled
        spec, v, flexible = compiled.spec.struct, compiled.version, compiled.flexible
        self.py_decode = compiled.decode_python
        target = compiled.compact_target
        self.py_scan = _compile(codegen.generate_scanner(spec, v, flexible, compiled.label, compact_target=target),
                                "scan", compiled.label)
        self.program = build_program(spec, v, flexible, target)
        self.native = _wire.compile_program(self.program)
        self.recent_frozen: list[tuple] = []  # the capture facts of the last inputs: what a new scan is compared with

    def agree(self, buf: bytes, pos: int = 0, *, valid: bool = False) -> None:
        """Both paths succeed or both fail; on success, identical values, positions and scans."""
        try:
            expected = self.py_decode(buf, pos)
        except DECODE_FAILURES as exc:
            assert not valid, f"the reference fails on valid bytes: {exc!r}"
            expected = None
        try:
            actual = self.native.decode(buf, pos)
        except Malformed:
            actual = None
        assert (expected is None) == (actual is None), (
            f"{self.compiled.label}: reference {'fails' if expected is None else 'succeeds'}, C "
            f"{'fails' if actual is None else 'succeeds'} on {buf.hex()} at {pos}"
        )
        if expected is not None:
            same(actual, expected)
        py_result, c_result = fresh_result(self.compiled), fresh_result(self.compiled)
        py_result.source = c_result.source = buf  # what CompiledStruct.scan sets: records are read lazily
        try:
            py_end = self.py_scan(buf, pos, py_result)
        except DECODE_FAILURES as exc:
            assert not valid, f"the reference scanner fails on valid bytes: {exc!r}"
            py_end = None
        try:
            c_end = self.native.scan(buf, pos, c_result)
        except Malformed:
            c_end = None
        # Valid bytes in three random cuttings; each damaged input (hundreds per example: every
        # truncation, flips, junk) in one, so that cuttings still vary across them at a third of the cost.
        self.agree_in_pieces(buf, pos, c_end, c_result, 3 if valid else 1)
        self.agree_fresh(buf, pos, c_end, c_result)
        assert (py_end is None) == (c_end is None), (
            f"{self.compiled.label}: reference scan {'fails' if py_end is None else 'succeeds'}, C scan "
            f"{'fails' if c_end is None else 'succeeds'} on {buf.hex()} at {pos}"
        )
        if py_end is not None:
            assert c_end == py_end
            same(scan_state(c_result), scan_state(py_result))
            assert c_result.finish().to_dict() == py_result.finish().to_dict()

    def agree_in_pieces(self, buf: bytes, pos: int, c_end, c_result: ScanResult, cuttings: int) -> None:
        """The C scan of the same bytes cut into pieces (as FrameStream hands a large frame: bytes,
        memoryviews, a bytearray, empty ones included) ends, fails and finds exactly as of the whole."""
        rng = random.Random(buf)
        for _ in range(cuttings):
            pieces = as_pieces(buf, rng)
            result = fresh_result(self.compiled)
            result.source = pieces
            try:
                end = self.native.scan(pieces, pos, result)
            except Malformed:
                end = None
            assert end == c_end, f"{self.compiled.label}: in pieces {end}, whole {c_end}, on {buf.hex()} at {pos}"
            if end is not None:
                same(scan_state(result), scan_state(c_result))
            self.agree_fresh(pieces, pos, c_end, c_result)

    def agree_fresh(self, buf, pos: int, c_end, c_result: ScanResult) -> None:
        """scan_fresh (a new result built in C, as Codec.scan_request makes it) fails where scan fails and
        otherwise holds, slot by slot, what scan then finish() leave in a ScanResult() (trailing bytes too)."""
        compiled = self.compiled
        template = compiled._zero_stats if compiled.int_slots else None
        try:
            fresh = self.native.scan_fresh(buf, pos, template, compiled.int_slots)
        except Malformed:
            fresh = None
        whole = b"".join(buf) if isinstance(buf, tuple) else buf
        assert (fresh is None) == (c_end is None), f"{compiled.label}: scan_fresh and scan disagree on {whole.hex()} at {pos}"
        if fresh is None:
            return
        assert type(fresh) is ScanResult and fresh.source is buf
        expected = copy.copy(c_result)
        expected.empty_counter, expected.int_stats = list(c_result.empty_counter), copy.copy(c_result.int_stats)
        expected.finish()
        expected.trailing_bytes = len(whole) - c_end  # what scan(whole=False) sets
        same(scan_state(fresh), scan_state(expected))
        assert fresh.trailing_bytes == expected.trailing_bytes
        assert fresh.to_dict() == expected.to_dict()
        # summarize: the records are summarized by the call (ScanResult.records then only reads them)
        eager = self.native.scan_fresh(buf, pos, template, compiled.int_slots, True)
        assert len(eager._summaries) == len(eager.record_spans)
        same(scan_state(eager), scan_state(expected))
        # the capture's frozen facts: built in C, summarizing records not yet summarized, as in Python
        lazy = self.native.scan_fresh(buf, pos, template, compiled.int_slots)
        same(lazy.frozen(), expected.frozen_python())
        same(eager.frozen(), eager.frozen_python())
        self.agree_previous(eager)

    def agree_previous(self, result: ScanResult) -> None:
        """frozen(previous): the C hands back `previous` itself exactly where the reference does (the facts
        equal to it), else facts equal to frozen()'s. Compared with the facts of recent inputs (mutations of
        one encoding: alike but for a counter or a name), with these facts themselves and with each of their
        eight parts changed, and with previous facts the comparison cannot read in place."""
        frozen = result.frozen_python()
        changed = [frozen[:i] + (_changed(part),) + frozen[i + 1:] for i, part in enumerate(frozen)]
        odd = [list(frozen), _Tuple(frozen), frozen[:5] + (list(frozen[5]),) + frozen[6:],
               frozen[:7] + (tuple(list(e) if type(e) is tuple else e for e in frozen[7]),)]
        for previous in [*self.recent_frozen, frozen, tuple(frozen), *changed, *odd]:
            mine, theirs = result.frozen(previous), result.frozen_python(previous)
            assert (mine is previous) == (theirs is previous), f"{self.compiled.label}: {previous!r} against {frozen!r}"
            if mine is previous:
                assert mine == frozen
            else:
                same(mine, frozen)
        assert sum(result.frozen(p) is p for p in changed) == 0
        self.recent_frozen = [frozen, *self.recent_frozen[:2]]

    def exercise(self, data, value: dict) -> None:
        encoded = bytes(self.compiled.encode(value))
        self.agree(encoded, valid=True)
        self.agree(b"\x07\x00\xff" + encoded + b"\x00\x01", 3, valid=True)  # at an offset, with trailing bytes
        rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        cuts = range(len(encoded)) if len(encoded) <= 400 else sorted(rng.sample(range(len(encoded)), 40))
        for cut in cuts:
            self.agree(encoded[:cut])
        for _ in range(8 if encoded else 0):
            mutated = bytearray(encoded)
            for _ in range(rng.randint(1, 3)):
                bit = rng.randrange(len(encoded) * 8)
                mutated[bit // 8] ^= 1 << (bit % 8)
            self.agree(bytes(mutated))
        for _ in range(4):
            prefix = encoded[: rng.randint(0, len(encoded))]
            self.agree(prefix + rng.randbytes(rng.randint(0, 40)))
        self.agree(rng.randbytes(rng.randint(0, 64)))


def harness(key) -> Harness:
    h = _harnesses.get(key, _MISSING_SENTINEL)
    if h is _MISSING_SENTINEL:
        if key[0] == "header":
            compiled = CODEC.header(key[1], key[2])
        elif key[0] == "synthetic":
            v = key[1]
            compiled = CompiledStruct(SYNTHETIC, v, v in SYNTHETIC.flexible_versions, api="NativeProbe",
                                      api_key=32000, direction="response")
        else:
            compiled = CODEC.body(*key)
        h = _harnesses[key] = Harness(compiled)
    return h


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_extension_is_built():
    assert _wire is not None, _MISSING
    assert native_available()


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(max_examples=4, **_SETTINGS)
@given(data=st.data())
def test_native_matches_reference(case, data):
    h = harness(case)
    h.exercise(data, data.draw(struct_value(h.compiled.spec.struct, h.compiled.version, h.compiled.flexible)))


@pytest.mark.parametrize("case", HEADERS, ids=lambda c: f"{c[0]}-v{c[1]}")
@settings(max_examples=20, **_SETTINGS)
@given(data=st.data())
def test_native_headers_match_reference(case, data):
    h = harness(("header", *case))
    h.exercise(data, data.draw(struct_value(h.compiled.spec.struct, h.compiled.version, h.compiled.flexible)))


@pytest.mark.parametrize("version", SYNTHETIC_CASES)
@settings(max_examples=150, **_SETTINGS)
@given(data=st.data())
def test_native_matches_reference_on_every_feature(version, data):
    h = harness(("synthetic", version))
    h.exercise(data, data.draw(struct_value(SYNTHETIC.struct, version, version in SYNTHETIC.flexible_versions)))


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_varint_limits_and_range_checks():
    """Overlong and oversized varints, and the type range checked when an encoding is wider than its type."""
    spec = parse_message({
        "type": "data", "name": "Probe", "validVersions": "0", "flexibleVersions": "none",
        "fields": [
            {"name": "Wide", "type": "int16", "versions": "0+", "encoding": "packed64"},
            {"name": "Loose", "type": "int16", "versions": "0+", "encoding": "upacked32"},
            {"name": "Huge", "type": "int64", "versions": "0+", "encoding": "upacked64"},
            {"name": "Short", "type": "int16", "versions": "0+", "encoding": "packed16"},
        ],
    })
    h = Harness(CompiledStruct(spec, 0, False, api="Probe", api_key=None, direction="data"))
    ok = _uvarint(2) + _uvarint(3) + _uvarint(2**64 - 1) + _uvarint(5)
    h.agree(ok, valid=True)
    assert h.native.decode(ok)[0] == {"Wide": 1, "Loose": 3, "Huge": -1, "Short": -3}
    variants = [
        _uvarint(2 * 40000),  # packed64 40000: outside int16, rejected
        _uvarint(2 * 32767),
        _uvarint(2 * 32768 - 1),  # -32768
        _uvarint(2 * 32768 + 1),  # -32769
    ]
    for wide in variants:
        h.agree(wide + ok[1:])
    for loose in (_uvarint(40000), _uvarint(2**31), _uvarint(2**32 - 1), _uvarint(2**32), b"\x80" * 5 + b"\x00"):
        h.agree(ok[:1] + loose + ok[2:])  # upacked32 on an int16: the int16 range is checked too
    with pytest.raises(Malformed):
        h.native.decode(ok[:1] + _uvarint(40000) + ok[2:])
    assert h.native.decode(ok[:1] + _uvarint(2**32 - 1) + ok[2:])[0]["Loose"] == -1
    for huge in (b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x02", b"\xff" * 10 + b"\x00", b"\x80" * 9 + b"\x00"):
        h.agree(ok[:2] + huge + ok[-1:])
    for short in (_uvarint(0xFFFF), _uvarint(0x10000), b"\xff\xff\x03", b"\x80\x80\x80\x00"):
        h.agree(ok[:-1] + short)


def test_nullable_struct_markers():
    """A marker byte of 128 or more is null; below is present (not just 0 and 1)."""
    spec = parse_message({
        "type": "data", "name": "Probe", "validVersions": "0", "flexibleVersions": "none",
        "fields": [
            {"name": "Maybe", "type": "Inner", "versions": "0+", "nullableVersions": "0+"},
            {"name": "After", "type": "int8", "versions": "0+"},
        ],
        "commonStructs": [{"name": "Inner", "versions": "0+", "fields": [
            {"name": "Value", "type": "int32", "versions": "0+"}]}],
    })
    h = Harness(CompiledStruct(spec, 0, False, api="Probe", api_key=None, direction="data"))
    for marker in (0, 1, 0x7F, 0x80, 0x81, 0xFF):
        for tail in (b"\x00\x00\x00\x05\x09", b"\x09", b""):
            h.agree(bytes([marker]) + tail)
    assert h.native.decode(b"\x80\x09")[0] == {"Maybe": None, "After": 9}
    assert h.native.decode(b"\x7f\x00\x00\x00\x05\x09")[0] == {"Maybe": {"Value": 5}, "After": 9}


def test_tagged_fields_scan_and_unknown_tags():
    """Unknown and known tags, a zero-count section written long, and out-of-order tags."""
    h = harness(("synthetic", 3))
    base = bytes(h.compiled.encode({}))
    assert base[-1] == 0
    known = _uvarint(0) + _uvarint(4) + struct.pack(">i", 7)
    unknown = _uvarint(9) + _uvarint(2) + b"hi"
    for section in (
        _uvarint(2) + known + unknown,
        _uvarint(1) + unknown,
        b"\x80\x00",  # a count of 0 in two bytes: not the empty fast path
        _uvarint(2) + unknown + known,  # descending
        _uvarint(2) + known + known,  # repeated
        _uvarint(1) + _uvarint(0) + _uvarint(3) + b"\x00\x00\x07",  # declares 3, the value takes 4
        _uvarint(1) + _uvarint(0) + _uvarint(5) + b"\x00\x00\x00\x07\x00",  # declares 5, the value takes 4
        _uvarint(200) + unknown,
    ):
        h.agree(base[:-1] + section)
    decoded, _ = h.native.decode(base[:-1] + _uvarint(2) + known + unknown)
    assert list(decoded)[-2:] == ["Extra", "_unknown_tagged_fields"]
    assert decoded["_unknown_tagged_fields"] == [(9, b"hi")]


def test_module_functions_cache_programs_and_reject_bad_ones():
    h = harness((3, "response", 12))
    raw = bytes(h.compiled.encode({"Topics": [{"Name": "a", "Partitions": [{"ErrorCode": 3}]}]}))
    program = build_program(h.compiled.spec.struct, 12, True)
    assert _wire.decode(program, raw, 0) == h.py_decode(raw, 0)
    assert _wire.decode(program, raw) == _wire.decode(h.native, raw, 0)
    result = fresh_result(h.compiled)
    assert _wire.scan(program, raw, 0, result) == len(raw)
    assert result.error_codes == {3: 1} and result.topics == {"a"} and result.topic_partitions == {"a": 1}
    assert h.native.source is program or h.native.source == program
    bare = ScanResult()  # not prepared by CompiledStruct.scan: every fact but the integer counters
    assert _wire.scan(program, raw, 0, bare) == len(raw)
    assert bare.int_stats is None and bare.topic_partitions == {"a": 1} and bare.error_codes == {3: 1}
    with pytest.raises(TypeError, match="int_stats"):  # counters written in place need room for every slot
        short = fresh_result(h.compiled)
        short.int_stats = short.int_stats[:-1]
        _wire.scan(program, raw, 0, short)
    for bad in ((), (True, (), (), 1), (True, (("X", "nope", False, False, False, False, None),), (), ""),
                (True, (("X", "int8", False, False, False, False, None, (0, 5, 4, 0), 0, 0, 0),), (), "", False),
                (True, (("X", "int32", False, False, False, False, None, (-25, 5, 4, 0), 0, 0, 0),), (), "", False),
                (True, (("X", "int32", False, False, False, False, None, None, 9, 0, 0),), (), "", False)):
        with pytest.raises((ValueError, TypeError)):
            _wire.compile_program(bad)
    with pytest.raises(TypeError):
        h.native.decode(bytearray(raw), 0)
    with pytest.raises(ValueError):
        h.native.decode(raw, -1)


def test_no_reference_leaks():
    """Decoding and scanning, valid or not, leaves no Python objects behind."""
    h = harness((3, "response", 12))
    body = {"Brokers": [{"NodeId": 1, "Host": "h", "Rack": None}], "Topics": [
        {"Name": f"t{t}", "TopicId": uuid.uuid4(), "ErrorCode": t % 2,
         "Partitions": [{"PartitionIndex": p, "ReplicaNodes": [1, 2], "IsrNodes": [1]} for p in range(3)]}
        for t in range(4)], "_unknown_tagged_fields": [(4, b"xyz")]}
    raw = bytes(h.compiled.encode(body))
    bad = [raw[:n] for n in range(0, len(raw), 7)] + [raw[:-1] + b"\x01\x05\x00"]

    rng = random.Random(5)
    in_pieces = [as_pieces(raw, rng) for _ in range(4)] + [FramePieces(raw[i:i + 1] for i in range(len(raw)))]
    bad_pieces = [as_pieces(b, rng) for b in bad]

    def run(times: int) -> None:
        for _ in range(times):
            h.native.decode(raw, 0)
            h.native.scan(raw, 0, fresh_result(h.compiled))
            h.native.scan_fresh(raw, 0, h.compiled._zero_stats, h.compiled.int_slots)
            h.native.scan_fresh(in_pieces[0], 0, None, (), True).frozen()
            h.native.scan_fresh(raw, 0, h.compiled._zero_stats, h.compiled.int_slots).frozen()
            for pieces in in_pieces:  # straddling reads use the scratch buffer, grown for the topic names
                h.native.scan(pieces, 0, fresh_result(h.compiled))
            for b in bad + bad_pieces:
                for fn in (lambda: h.native.decode(b, 0), lambda: h.native.scan(b, 0, fresh_result(h.compiled)),
                           lambda: h.native.scan_fresh(b, 0, h.compiled._zero_stats, h.compiled.int_slots)):
                    try:
                        fn()
                    except (Malformed, TypeError):  # decode takes bytes only
                        pass

    run(50)
    tracemalloc.start()
    try:
        run(20)
        before = tracemalloc.get_traced_memory()[0]
        run(300)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} bytes still allocated after 300 rounds"


def test_scan_fresh_fills_every_slot_as_the_python_path():
    """A result built in C has every ScanResult slot set as ScanResult(), scan and finish() leave it, with
    and without integer facts; the fast path is on whenever the extension is built."""
    if _wire is None:
        pytest.fail(_MISSING)
    assert _wire.SCAN_RESULT_FAST_PATH == 1
    compiled = CODEC.body(3, "response", 12)
    raw = bytes(compiled.encode({"Brokers": [], "Topics": [{"Name": "t", "TopicId": uuid.UUID(int=0), "ErrorCode": 3,
                                 "Partitions": []}], "_unknown_tagged_fields": [(4, b"xyz")]})) + b"\x00\x01"
    for integers in (True, False):
        python = compiled.scan(raw, 0, whole=False, integers=integers).finish()
        fresh = compiled.scan_fresh(raw, 0, integers)
        assert type(fresh) is ScanResult and fresh is not python
        for name in ScanResult.__slots__:
            a, b = getattr(fresh, name), getattr(python, name)
            assert a == b and type(a) is type(b), f"{name}: {a!r} != {b!r}"
        assert fresh.trailing_bytes == 2 and fresh.error_codes == {3: 1} and fresh.source is raw
        assert (fresh.int_stats is None) is (not integers)
    with pytest.raises(DecodeError):
        compiled.scan_fresh(raw[:9], 0, True)


def test_a_fresh_scan_s_counters_are_new_bytes_that_the_capture_keeps():
    """scan_fresh writes the counters into a bytes object of its own (the Python reference freezes its array as
    finish() does), and the capture's SCAN holds that object itself, not a copy; a later scan leaves it as it was."""
    if _wire is None:
        pytest.fail(_MISSING)
    compiled = CODEC.body(0, "request", 3)

    def raw(acks: int) -> bytes:
        return bytes(compiled.encode({"TransactionalId": None, "Acks": acks, "TimeoutMs": 5, "TopicData": [
            {"Name": "t", "PartitionData": [{"Index": 7, "Records": None}]}]}))

    fresh = compiled.scan_fresh(raw(1), 0, True)
    kept = bytes(bytearray(fresh.int_stats))  # a copy (bytes() of bytes is the object itself)
    assert type(fresh.int_stats) is bytes and fresh.int_stats == compiled.scan(raw(1), 0, integers=True).finish().int_stats
    side = fresh.frozen()
    assert side[4] is fresh.int_stats and side == fresh.frozen_python()
    other = compiled.scan_fresh(raw(-1), 0, True)  # a negative Acks: other varint lengths
    assert other.int_stats is not fresh.int_stats and other.int_stats != kept and fresh.int_stats == kept
    with pytest.raises(TypeError, match="at least"):  # too short a template: refused, never written past
        compiled._scan_fresh(raw(1), 0, compiled._zero_stats[:-1], compiled.int_slots)


def test_no_integer_counters_for_a_frame_whose_int32_counters_could_overflow(monkeypatch):
    """A buffer longer than codegen.COUNTED_BYTES_MAX (a counter gains at most 10 a byte) gets int_stats None in C
    and in Python, its other facts as usual; the C scanner reads the same limit."""
    if _wire is None:
        pytest.fail(_MISSING)
    assert _wire.COUNTED_BYTES_MAX == codegen.COUNTED_BYTES_MAX and 10 * codegen.COUNTED_BYTES_MAX < 2 ** 31
    compiled = CODEC.body(0, "request", 3)  # Acks, TimeoutMs and Index are counted
    head = bytes(compiled.encode({"TransactionalId": None, "Acks": 1, "TimeoutMs": 5, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 7, "Records": b""}]}]}))[:-4]  # up to the records' length

    def body(records: int) -> FramePieces:
        """The request with `records` bytes of records, in pieces of one shared MiB (a 205 MiB body in 1 MiB)."""
        mib = bytes(1 << 20)
        whole, rest = divmod(records, len(mib))
        return FramePieces((head + struct.pack(">i", records), *[mib] * whole, mib[:rest]))

    small, large = body(1000), body(codegen.COUNTED_BYTES_MAX)
    for pieces, counted in ((small, True), (large, False)):
        fresh = compiled.scan_fresh(pieces, 0, True)
        prepared = compiled.scan(pieces, 0, integers=True)  # Codec.scan's own check, then the C scan
        for result in (fresh, prepared):
            assert (result.int_stats is not None) is counted
            assert result.int_slots == (compiled.int_slots if counted else ())
            assert result.topic_partitions == {"t": 1} and result.spans[0][1] == sum(map(len, pieces)) - len(head) - 4
        if counted:
            counters = array(codegen.COUNTER_TYPECODE, fresh.int_stats)
            assert fresh.int_stats == bytes(prepared.int_stats) and sum(counters[0::codegen.SLOT_STRIDE]) == 3
    # The Python reference, its limit lowered to the small body's length: counted up to it, not past it.
    joined = small.join()
    reference = CompiledStruct(compiled.spec, compiled.version, compiled.flexible, api=compiled.api,
                               api_key=compiled.api_key, direction=compiled.direction)
    reference._program = reference._scan = reference._scan_fresh = None  # the generated Python scanner
    for limit, counted in ((len(joined), True), (len(joined) - 1, False)):
        monkeypatch.setattr(codegen, "COUNTED_BYTES_MAX", limit)
        assert (reference.scan(joined, 0, integers=True).int_stats is not None) is counted


def test_pieces_are_released_after_every_scan():
    """The buffers of a frame in pieces are released whether the scan succeeds or fails: a bytearray
    piece can be resized afterwards (it cannot while a view of it is held)."""
    h = harness((0, "request", 9))
    raw = bytes(h.compiled.encode({"TransactionalId": None, "Acks": 1, "TimeoutMs": 5, "TopicData": [
        {"Name": "t" * 100, "PartitionData": [{"Index": 0, "Records": None}]}]}))
    for frame in (raw, raw[:-3], raw[:20]):
        first, rest = bytearray(frame[:15]), frame[15:]
        try:
            h.native.scan(FramePieces((first, rest)), 0, fresh_result(h.compiled))
        except Malformed:
            assert frame != raw
        first.extend(b"x")  # BufferError if a view were still held
        into: list = []
        _wire.summarize_spans(FramePieces((first, rest)), [len(rest)], into)
        first.extend(b"y")
    with pytest.raises(TypeError):
        h.native.scan(FramePieces((raw, 3)), 0, fresh_result(h.compiled))  # not a buffer
    with pytest.raises(ValueError):
        h.native.scan(FramePieces(()), 0, fresh_result(h.compiled))
