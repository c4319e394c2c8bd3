"""Programs for the C decoder/scanner (_wire): one struct at one version as nested tuples.

A program says exactly what the decoder codegen generates does for that struct and
version, and nothing else: the C extension interprets it and must match the generated
Python (the reference) byte for byte, dict key for dict key.

Layout (all tuples; strings are interned; nothing holds spec objects)::

    STRUCT = (flexible, fields, tags, path, grows)
        flexible  bool: the struct ends with a tag section (the message version is flexible)
        fields    tuple of FIELD: the inline fields at this version, in spec order
        tags      tuple of (tag, FIELD), ascending by tag: the known tagged fields at this
                  version (their FIELD is decoded within the tagged field's bytes)
        path      str: the struct path scan_tags records ("" for the root, "Topics",
                  "Topics.Partitions", ...), as codegen builds it from field names
        grows     bool: a compact target is set: the struct gains a one-byte tag section

    FIELD = (key, kind, nullable, compact, is_error_code, is_topic_name, arg,
             slot, prefix, element_prefix, role)
        key            str: the dict key (the field name, interned)
        kind           one of KINDS (below)
        nullable       bool: nullable at this version (for "struct": the int8 marker,
                       a byte >= 128 meaning null; for the others a -1 length)
        compact        bool: compact (varint) lengths, codegen._field_flexible
        is_error_code  bool: codegen._is_error_code (int16 *ErrorCode): the scanner counts it
        is_topic_name  bool: codegen._uses_topic_name: the scanner collects the string(s)
        arg            per kind:
            fixed kinds (bool int8 int16 uint16 int32 uint32 int64 float64 uuid),
            "string", "bytes", "records":  None
            "encoded":  (form, bits, low, high): a KAFKA-9927 encoding; form is "fixed"
                        (big-endian signed int of `bits`), "packed" (zig-zag varint) or
                        "upacked" (varint read as a two's complement `bits` value); low and
                        high are the inclusive range the decoder checks, or None for no check
                        (codegen checks only int16/int32 fields with a 64-bit encoding)
            "struct":   STRUCT
            "array":    (element kind, element STRUCT or None, least): element kind is a
                        fixed kind, "string", "bytes" or "struct"; least is the fewest bytes
                        one element takes, used in the check count * least <= bytes left

        slot           None, or for an int16/int32/int64 field or array (the scan's capture facts,
                       codegen.integer_slots): (offset, negative, today, today_negative), offset
                       the slot's first counter in int_stats and the rest as codegen.integer_today
                       and codec_runtime.count_int take them
        prefix         with a compact target: bytes of the length prefix that becomes a varint
                       (codegen.compact_prefixes), else 0
        element_prefix the same for each element of an array of strings or bytes
        role           1: the struct's topic field, 2: one of its partition arrays
                       (codegen.struct_roles), 0: neither (always 0 for tagged fields)

Build one with build_program(struct_spec, version, flexible, compact_target); build_program caches
nothing, so callers keep the program (and what _wire.compile_program makes of it).
"""

from __future__ import annotations

import importlib
import os
import sys

from kinspect.protocol.codec.codegen import (
    INT_TYPES,
    NEGATIVE_UVARINT,
    SLOT_STRIDE,
    _field_flexible,
    _inline_fields,
    _is_error_code,
    _tagged_fields,
    _uses_topic_name,
    compact_prefixes,
    encoded_range,
    integer_slots,
    integer_today,
    min_size,
    struct_roles,
)
from kinspect.protocol.wire.primitives import FIXED_FORMATS
from kinspect.protocol.specs.model import FieldSpec, StructSpec

FIXED_KINDS = frozenset(FIXED_FORMATS)  # bool int8 int16 uint16 int32 uint32 int64 float64 uuid
KINDS = FIXED_KINDS | {"string", "bytes", "records", "struct", "array", "encoded"}
# The environment variable that forces the pure-Python codecs even when _wire is built.
PURE_PYTHON_ENV = "KINSPECT_PURE_PYTHON"

_intern = sys.intern


def build_program(struct_spec: StructSpec, version: int, flexible: bool, compact_target: int | None = None) -> tuple:
    """The program (see the module docstring) of one struct at one version."""
    slots = {path: i for i, (path, _) in enumerate(integer_slots(struct_spec, version))}
    return _Builder(version, flexible, slots, compact_target).struct(struct_spec, "")


class _Builder:
    """Program tuples of one version: the integer slots and compact target travel with it."""

    def __init__(self, version: int, flexible: bool, slots: dict, target: int | None) -> None:
        self.version, self.flexible, self.slots, self.target = version, flexible, slots, target

    def struct(self, spec: StructSpec, path: str) -> tuple:
        version, flexible = self.version, self.flexible
        topic, partitions = struct_roles(spec, version)
        fields = tuple(self.field(f, path, 1 if f.name == topic else (2 if f.name in partitions else 0))
                       for f in _inline_fields(spec, version))
        tags = ()
        if flexible:
            tags = tuple((f.tag, self.field(f, path, 0)) for f in _tagged_fields(spec, version))
        return (bool(flexible), fields, tags, _intern(path), self.target is not None)

    def field(self, f: FieldSpec, path: str, role: int) -> tuple:
        base = _field(f, self.version, self.flexible, path, self)
        slot = None
        index = self.slots.get(f"{path}.{f.name}" if path else f.name)
        if index is not None and f.struct is None and f.element_type in INT_TYPES:
            today, today_negative = integer_today(f, self.version) if not f.is_array else \
                (INT_TYPES[f.element_type] // 8, 0)
            slot = (index * SLOT_STRIDE, NEGATIVE_UVARINT[INT_TYPES[f.element_type]], today, today_negative)
        prefix, element_prefix = compact_prefixes(f, self.version, self.flexible, self.target)
        return base + (slot, prefix, element_prefix, role)


def _field(f: FieldSpec, version: int, flexible: bool, path: str, builder: _Builder) -> tuple:
    nullable = version in f.nullable_versions
    compact = _field_flexible(f, version, flexible)
    sub_path = f"{path}.{f.name}" if path else f.name
    if f.is_array:
        elem = f.element_type
        if f.struct is not None:
            kind_arg = ("struct", builder.struct(f.struct, sub_path),
                        max(1, min_size(f.struct, version, flexible)))
        elif elem in FIXED_FORMATS:
            kind_arg = (elem, None, FIXED_FORMATS[elem][1])
        else:
            kind_arg = (elem, None, 1 if compact else (2 if elem == "string" else 4))
        kind, arg = "array", (_intern(kind_arg[0]), kind_arg[1], kind_arg[2])
    elif f.struct is not None:
        kind, arg = "struct", builder.struct(f.struct, sub_path)
    elif f.type in ("string", "bytes", "records"):
        kind, arg = f.type, None
    else:
        enc = f.encoding_at(version)
        if enc:
            form = enc.rstrip("0123456789")
            bits = int(enc[len(form):])
            low, high = encoded_range(f, enc) or (None, None)  # as codegen._DecoderWriter._scalar
            kind, arg = "encoded", (_intern(form), bits, low, high)
        else:
            kind, arg = f.type, None
    return (
        _intern(f.name), _intern(kind), nullable, compact, _is_error_code(f), _uses_topic_name(f), arg,
    )


def optional_extension(name: str):
    """The C extension module `name` (kinspect's optional ones: _wire, _one_frame, _counting, _inventory,
    _batch, _receive, _forward, _take, _columns, _derive, _count_later, _facts_wire, _pace, _grouping), or None
    where it is not built or KINSPECT_PURE_PYTHON=1 chooses the Python it stands in for: the one place that
    choice is made."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def native_module():
    """The _wire extension module, or None when it is not built or KINSPECT_PURE_PYTHON=1."""
    return optional_extension("kinspect.protocol.codec._wire")


def native_available() -> bool:
    """True when the C decoder/scanner can be used (built, and not disabled by KINSPECT_PURE_PYTHON=1)."""
    return native_module() is not None


__all__ = ["FIXED_KINDS", "KINDS", "PURE_PYTHON_ENV", "build_program", "native_available", "native_module",
           "optional_extension"]
