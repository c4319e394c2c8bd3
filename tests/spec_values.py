"""Hypothesis strategies that build message values from the spec model, for round-trip tests."""

from __future__ import annotations

from hypothesis import strategies as st

from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.specs.model import INTEGER_RANGES, FieldSpec, StructSpec

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_SMALL_BYTES = st.binary(max_size=24)


def _encoding_bounds(f: FieldSpec, version: int) -> tuple[int, int]:
    low, high = INTEGER_RANGES[f.type]
    enc = f.encoding_at(version)
    if enc:
        bits = int(enc.lstrip("fixedupacked"))
        low, high = max(low, -(1 << (bits - 1))), min(high, (1 << (bits - 1)) - 1)
    return low, high


def scalar(f: FieldSpec, type_name: str, version: int) -> st.SearchStrategy:
    if type_name == "bool":
        return st.booleans()
    if type_name in INTEGER_RANGES:
        low, high = _encoding_bounds(f, version) if not f.is_array else INTEGER_RANGES[type_name]
        return st.integers(low, high)
    if type_name == "float64":
        return st.floats(allow_nan=False)
    if type_name == "string":
        return _TEXT
    if type_name == "uuid":
        return st.uuids(allow_nil=True)
    if type_name in ("bytes", "records"):
        return _SMALL_BYTES
    raise AssertionError(type_name)


def field_value(f: FieldSpec, version: int, flexible: bool, depth: int) -> st.SearchStrategy:
    if f.is_array:
        if f.struct is not None:
            elem = struct_value(f.struct, version, flexible, depth + 1)
        else:
            elem = scalar(f, f.element_type, version)
        value = st.lists(elem, max_size=2 if depth < 3 else 1)
    elif f.struct is not None:
        value = struct_value(f.struct, version, flexible, depth + 1)
    else:
        value = scalar(f, f.type, version)
    if version in f.nullable_versions:
        value = st.none() | value
    return value


def _unknown_tags(used: frozenset[int]) -> st.SearchStrategy:
    """No unknown tagged fields, or up to two whose tags the struct does not define (in tag order), each a few bytes."""
    free = st.integers(0, 300).filter(lambda t: t not in used)
    some = st.lists(st.tuples(free, _SMALL_BYTES), unique_by=lambda pair: pair[0], max_size=2).map(sorted)
    return st.one_of(st.just([]), some)


# (struct, version, flexible, depth) -> its strategy. Built once: hypothesis validates a strategy
# tree the first time it draws from it, and rebuilding the tree for every example cost most of
# the codec tests' time. The specs live as long as the registry that holds them.
_STRUCTS: dict[tuple[int, int, bool, int], tuple[StructSpec, st.SearchStrategy]] = {}


def struct_value(spec: StructSpec, version: int, flexible: bool, depth: int = 0) -> st.SearchStrategy:
    key = (id(spec), version, flexible, depth)
    known = _STRUCTS.get(key)
    if known is None or known[0] is not spec:
        known = _STRUCTS[key] = (spec, _build_struct_value(spec, version, flexible, depth))
    return known[1]


def _build_struct_value(spec: StructSpec, version: int, flexible: bool, depth: int) -> st.SearchStrategy:
    fixed = {}
    optional = {}
    for f in spec.fields:
        if version not in f.versions:
            continue
        strategy = field_value(f, version, flexible, depth)
        if version in f.tagged_versions:
            optional[f.name] = strategy
        else:
            fixed[f.name] = strategy
    base = st.fixed_dictionaries(fixed, optional=optional)
    if not flexible:
        return base
    # Built once per struct, not per value: Hypothesis validates a new strategy on its first draw, and strategies
    # made inside the draw were a third of the drawing's time (cProfile of three codec modules).
    unknown_tags = _unknown_tags(frozenset(f.tag for f in spec.fields if f.tag is not None))

    @st.composite
    def with_unknown(draw):
        value = draw(base)
        unknown = draw(unknown_tags)
        if unknown:
            value[UNKNOWN_TAGS] = unknown
        return value

    return with_unknown()
