"""A walk of a decoded message guided by its spec: integer-field sizes, topics with partition counts, compact size.

One pass over the decoded body gathers, per integer field path, what its values take today
and would take as unsigned and zig-zag varints; the topics the message names with how
many partitions of each; and, for a non-flexible version of an api that has flexible
versions, how many bytes the body would gain or lose at the first flexible version's
encoding (KIP-482: compact length prefixes, an empty tag section per struct).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tests.support.varint_sizes import (
    _LENGTH,
    _WIDTH_BYTES,
    uvarint_size,
    zigzag_size,
)
from kinspect.protocol.specs.model import FieldSpec, MessageSpec, StructSpec

INT_BITS = {"int16": 16, "int32": 32, "int64": 64}
_LENGTH_WIDTH = {"string": 2, "bytes": 4, "records": 4}  # non-compact length prefix of one blob
_ARRAY_WIDTH = 4

# Entry kinds of a struct plan.
_INT, _INT_ARRAY, _BLOB, _BLOB_ARRAY, _STRUCT, _STRUCT_ARRAY, _OTHER_ARRAY, _SKIP = range(8)


@dataclass(slots=True)
class _Entry:
    name: str
    kind: int
    path: str
    type: str  # int16/int32/int64 for integer kinds, the element type otherwise
    today: object  # integer kinds: bytes per value today (an int), or a function of the value (KAFKA-9927)
    sub: _Plan | None
    prefix: int | None  # compact walks: the non-compact prefix width that becomes a varint, else None
    element_prefix: int | None  # the same for each element of an array of strings or bytes
    topic: bool  # a string (or array of strings) naming topics


@dataclass(slots=True)
class _Plan:
    entries: list
    topic_field: str | None  # the field naming the struct's topic
    partition_arrays: tuple  # array fields counted as that topic's partitions


@dataclass(slots=True)
class WalkResult:
    """integers: path -> [type, count, fixed, uvarint, zigzag, uvarint_hist, zigzag_hist]; topics: name -> partitions."""

    integers: dict
    topics: Counter
    compact_delta: int | None  # bytes gained at the first flexible version; None when not asked for


def _today(f: FieldSpec, version: int):
    """Bytes one value of this integer field takes on the wire today: a width, or a function of the value."""
    encoding = f.encoding_at(version)
    if encoding is None:
        return INT_BITS[f.element_type] // 8
    bits = int(encoding[-2:])  # (fixed|packed|upacked)(16|32|64), checked by the spec model
    if encoding.startswith("fixed"):
        return bits // 8
    if encoding.startswith("packed"):
        return zigzag_size
    return lambda value: uvarint_size(value, bits)


def _compact_at(f: FieldSpec, version: int, message_flexible: bool) -> bool:
    """Compact length prefixes for this field at a version (the field's own flexibleVersions win)."""
    if f.flexible_versions is not None:
        return version in f.flexible_versions
    return message_flexible


def _is_topic(f: FieldSpec) -> bool:
    return f.entity_type == "topicName" and f.element_type == "string"


class PlanCache:
    """Walk plans per (message spec, version, compact target), built once from the spec model."""

    def __init__(self) -> None:
        self._plans: dict = {}

    def plan(self, spec: MessageSpec, version: int, target: int | None) -> _Plan:
        key = (id(spec), version, target)
        hit = self._plans.get(key)
        if hit is None or hit[0] is not spec:
            flexible = version in spec.flexible_versions
            hit = self._plans[key] = (spec, self._struct(spec.struct, version, flexible, target, ""))
        return hit[1]

    def _struct(self, struct: StructSpec, version: int, flexible: bool, target: int | None, path: str) -> _Plan:
        entries, topic_field, partitions = [], None, []
        for f in struct.fields:
            if version not in f.versions:
                continue
            where = f"{path}.{f.name}" if path else f.name
            element = f.element_type
            prefix = element_prefix = None
            if target is not None and not _compact_at(f, version, flexible) and _compact_at(f, target, True):
                if f.is_array:
                    prefix = _ARRAY_WIDTH
                    element_prefix = _LENGTH_WIDTH.get(element)
                elif element in _LENGTH_WIDTH:
                    prefix = _LENGTH_WIDTH[element]
            sub = self._struct(f.struct, version, flexible, target, where) if f.struct is not None else None
            if f.is_array:
                if sub is not None:
                    kind = _STRUCT_ARRAY
                elif element in INT_BITS:
                    kind = _INT_ARRAY
                elif element in _LENGTH_WIDTH:
                    kind = _BLOB_ARRAY
                else:
                    kind = _OTHER_ARRAY
                if "Partition" in f.name:
                    partitions.append(f.name)
            elif sub is not None:
                kind = _STRUCT
            elif element in INT_BITS:
                kind = _INT
            elif element in _LENGTH_WIDTH:
                kind = _BLOB
            else:
                kind = _SKIP
            if kind == _SKIP:
                continue
            if not f.is_array and _is_topic(f) and topic_field is None:
                topic_field = f.name
            today = _today(f, version) if kind in (_INT, _INT_ARRAY) else None
            entries.append(_Entry(f.name, kind, where, element, today, sub, prefix, element_prefix,
                                  _is_topic(f)))
        return _Plan(entries, topic_field, tuple(partitions))


def _count_ints(integers: dict, entry: _Entry, values) -> None:
    """Add values of one integer field to its path's totals and histograms.

    uvarint_size and zigzag_size inlined (this is the writer thread's hottest loop); the
    tests check it against them.
    """
    acc = integers.get(entry.path)
    if acc is None:
        acc = integers[entry.path] = [entry.type, 0, 0, 0, 0, [0] * 10, [0] * 10]
    length, negative = _LENGTH, _WIDTH_BYTES[INT_BITS[entry.type]]
    uh, zh = acc[5], acc[6]
    n = u_total = z_total = 0
    for v in values:
        if v >= 0:
            u = length[v.bit_length()]
            z = length[(v << 1).bit_length()]
        else:
            u = negative
            z = length[((-v << 1) - 1).bit_length()]
        n += 1
        u_total += u
        z_total += z
        uh[u - 1] += 1
        zh[z - 1] += 1
    acc[1] += n
    acc[3] += u_total
    acc[4] += z_total
    width = entry.today
    acc[2] += width * n if type(width) is int else sum(width(v) for v in values)


def _blob_length(value, kind: str) -> int:
    return len(value.encode("utf-8")) if kind == "string" else len(value)


def _walk(plan: _Plan, obj: dict, integers: dict, topics: Counter, compact: bool) -> int:
    """Walk one struct value; return its compact-size delta (0 when not compact)."""
    delta = 1 if compact else 0  # the empty tag section a flexible struct carries
    for e in plan.entries:
        if e.name not in obj:
            continue  # a tagged field that was not on the wire
        value = obj[e.name]
        kind = e.kind
        if value is None:
            if e.prefix is not None:
                delta += 1 - e.prefix  # a null length becomes the single byte 0
            continue
        if e.prefix is not None:
            n = len(value) if kind != _BLOB else _blob_length(value, e.type)
            delta += uvarint_size(n + 1, 32) - e.prefix
        if kind == _INT:
            _count_ints(integers, e, (value,))
        elif kind == _STRUCT_ARRAY:
            for item in value:
                delta += _walk(e.sub, item, integers, topics, compact)
        elif kind == _INT_ARRAY:
            _count_ints(integers, e, value)
        elif kind == _STRUCT:
            delta += _walk(e.sub, value, integers, topics, compact)
        elif kind == _BLOB_ARRAY:
            if e.topic:
                for item in value:
                    topics[item] += 0
            if e.element_prefix is not None:
                for item in value:
                    if item is not None:
                        delta += uvarint_size(_blob_length(item, e.type) + 1, 32) - e.element_prefix
    name_field = plan.topic_field
    if name_field is not None:
        topic = obj.get(name_field)
        if isinstance(topic, str):
            topics[topic] += sum(len(obj.get(a) or ()) for a in plan.partition_arrays)
    return delta


def walk_body(plans: PlanCache, spec: MessageSpec, version: int, body: dict, compact_target: int | None) -> WalkResult:
    """Integer fields and topics of a decoded body; with compact_target, its size change at that version."""
    integers: dict = {}
    topics: Counter = Counter()
    compact = compact_target is not None
    delta = _walk(plans.plan(spec, version, compact_target), body, integers, topics, compact)
    return WalkResult(integers, topics, delta if compact else None)
