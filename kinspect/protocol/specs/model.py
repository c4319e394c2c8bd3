"""A validated model of Kafka's JSON message definitions (fields, structs, versions).

Spec files are data that may come from users: everything here is checked (names, types,
version ranges, tags, defaults, encodings) and errors point into the file, so that the
code generator can trust what it is given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kinspect.protocol.errors import SpecError
from kinspect.protocol.specs.versions import NONE, VersionRange

PRIMITIVE_TYPES = frozenset(
    {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string", "uuid", "bytes", "records"}
)
INTEGER_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
# Types that may be null on the wire (the others have sentinels instead).
NULLABLE_KINDS = frozenset({"string", "bytes", "records"})
# KAFKA-9927: (fixed|packed|upacked)(16|32|64) on int16/int32/int64 fields.
ENCODING_NAME = re.compile(r"^(fixed|packed|upacked)(16|32|64)$")
ENCODABLE_TYPES = frozenset({"int16", "int32", "int64"})

IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
MESSAGE_TYPES = frozenset({"request", "response", "header", "data"})
MESSAGE_KEYS = frozenset(
    {
        "apiKey", "type", "name", "validVersions", "flexibleVersions", "fields", "commonStructs",
        "listeners", "deprecatedVersions", "latestVersionUnstable", "about",
    }
)
FIELD_KEYS = frozenset(
    {
        "name", "type", "versions", "nullableVersions", "taggedVersions", "tag", "flexibleVersions",
        "default", "entityType", "mapKey", "ignorable", "zeroCopy", "fields", "encoding", "about",
    }
)
STRUCT_KEYS = frozenset({"name", "versions", "fields", "about"})
MAX_TAG = 2**31 - 1
# Deeper nesting than any real message (5 in Kafka 4.3): a guard against hostile spec files.
# The generated decoders nest a block or two per level and Python compiles at most 20
# nested blocks, so a deeper limit would accept files that fail on first use, mid-stream.
MAX_DEPTH = 12


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a struct, as the spec declares it."""

    name: str
    type: str
    versions: VersionRange
    nullable_versions: VersionRange = NONE
    tagged_versions: VersionRange = NONE
    tag: int | None = None
    flexible_versions: VersionRange | None = None
    default: Any = None
    has_default: bool = False
    entity_type: str | None = None
    map_key: bool = False
    ignorable: bool = False
    zero_copy: bool = False
    encoding: tuple[tuple[VersionRange, str], ...] = ()
    struct: "StructSpec | None" = None

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        """The type of one element for arrays, the type itself otherwise."""
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        """True for struct fields and arrays of structs."""
        return self.struct is not None

    def encoding_at(self, version: int) -> str | None:
        """The KAFKA-9927 encoding in force at a version, None for the type's fixed width."""
        for versions, name in self.encoding:
            if version in versions:
                return name
        return None


@dataclass(frozen=True, slots=True)
class StructSpec:
    """A named list of fields: a message body, a nested struct or a common struct."""

    name: str
    fields: tuple[FieldSpec, ...]
    versions: VersionRange | None = None


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One message definition file: a request, response, header or data schema."""

    name: str
    kind: str
    api_key: int | None
    valid_versions: VersionRange
    flexible_versions: VersionRange
    struct: StructSpec
    common_structs: tuple[StructSpec, ...] = ()
    listeners: tuple[str, ...] = ()
    deprecated_versions: VersionRange = NONE
    latest_version_unstable: bool = False
    source: str = ""
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        return self.struct.fields


class _Parser:
    """Turns one parsed JSON document into a MessageSpec, checking as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.common: dict[str, StructSpec] = {}
        self.common_raw: dict[str, dict] = {}

    def fail(self, where: str, problem: str) -> SpecError:
        return SpecError(f"{self.source}: {where}: {problem}")

    def versions(self, value: Any, where: str, key: str) -> VersionRange:
        try:
            return VersionRange.parse(value)
        except ValueError as exc:
            raise self.fail(where, f"{key}: {exc}") from None

    def message(self, doc: Any) -> MessageSpec:
        if not isinstance(doc, dict):
            raise self.fail("top level", "a message definition must be a JSON object")
        unknown = set(doc) - MESSAGE_KEYS
        if unknown:
            raise self.fail("top level", f"unknown keys {sorted(unknown)}")
        name = doc.get("name")
        if not isinstance(name, str) or not IDENTIFIER.match(name):
            raise self.fail("top level", f"name {name!r} is not an identifier")
        kind = doc.get("type")
        if kind not in MESSAGE_TYPES:
            raise self.fail(name, f"type {kind!r} is not one of {sorted(MESSAGE_TYPES)}")
        api_key = doc.get("apiKey")
        if kind in ("request", "response"):
            if not isinstance(api_key, int) or isinstance(api_key, bool) or not 0 <= api_key <= 0x7FFF:
                raise self.fail(name, f"apiKey {api_key!r} must be an integer from 0 to 32767")
        elif api_key is not None:
            raise self.fail(name, f"a {kind} has no apiKey")
        valid = self.versions(doc.get("validVersions"), name, "validVersions")
        flexible = self.versions(doc.get("flexibleVersions", "none"), name, "flexibleVersions")
        deprecated = self.versions(doc.get("deprecatedVersions", "none"), name, "deprecatedVersions")
        listeners = doc.get("listeners", [])
        if not isinstance(listeners, list) or not all(isinstance(x, str) for x in listeners):
            raise self.fail(name, "listeners must be a list of strings")
        unstable = doc.get("latestVersionUnstable", False)
        if not isinstance(unstable, bool):
            raise self.fail(name, "latestVersionUnstable must be a boolean")
        commons = doc.get("commonStructs", [])
        if not isinstance(commons, list):
            raise self.fail(name, "commonStructs must be a list")
        for raw in commons:
            if not isinstance(raw, dict) or set(raw) - STRUCT_KEYS:
                raise self.fail(f"{name}.commonStructs", f"bad common struct {str(raw)[:80]}")
            cname = raw.get("name")
            if not isinstance(cname, str) or not IDENTIFIER.match(cname):
                raise self.fail(f"{name}.commonStructs", f"name {cname!r} is not an identifier")
            if cname in self.common_raw:
                raise self.fail(f"{name}.commonStructs", f"{cname} is defined twice")
            self.common_raw[cname] = raw
        common_specs = tuple(self.common_struct(c, name, ()) for c in self.common_raw)
        body = StructSpec(name, self.fields(doc.get("fields", []), name, (), depth=0))
        return MessageSpec(
            name=name,
            kind=kind,
            api_key=api_key,
            valid_versions=valid,
            flexible_versions=flexible,
            struct=body,
            common_structs=common_specs,
            listeners=tuple(listeners),
            deprecated_versions=deprecated,
            latest_version_unstable=unstable,
            source=self.source,
            raw=doc,
        )

    def common_struct(self, cname: str, where: str, resolving: tuple[str, ...]) -> StructSpec:
        if cname in self.common:
            return self.common[cname]
        if cname in resolving:
            raise self.fail(where, f"struct {cname} contains itself")
        raw = self.common_raw[cname]
        versions = self.versions(raw.get("versions", "0+"), f"{where}.{cname}", "versions")
        spec = StructSpec(
            cname, self.fields(raw.get("fields", []), cname, resolving + (cname,), depth=len(resolving)), versions
        )
        self.common[cname] = spec
        return spec

    def fields(self, raws: Any, where: str, resolving: tuple[str, ...], depth: int) -> tuple[FieldSpec, ...]:
        if depth > MAX_DEPTH:
            raise self.fail(where, f"structs nested deeper than {MAX_DEPTH}")
        if not isinstance(raws, list):
            raise self.fail(where, "fields must be a list")
        out = []
        names: set[str] = set()
        tags: set[int] = set()
        for raw in raws:
            f = self.field(raw, where, resolving, depth)
            if f.name in names:
                raise self.fail(where, f"field {f.name} is defined twice")
            names.add(f.name)
            if f.tag is not None:
                if f.tag in tags:
                    raise self.fail(where, f"tag {f.tag} is used twice")
                tags.add(f.tag)
            out.append(f)
        return tuple(out)

    def field(self, raw: Any, parent: str, resolving: tuple[str, ...], depth: int) -> FieldSpec:
        if not isinstance(raw, dict):
            raise self.fail(parent, f"a field must be an object, not {str(raw)[:80]}")
        name = raw.get("name")
        if not isinstance(name, str) or not IDENTIFIER.match(name):
            raise self.fail(parent, f"field name {name!r} is not an identifier")
        where = f"{parent}.{name}"
        unknown = set(raw) - FIELD_KEYS
        if unknown:
            raise self.fail(where, f"unknown keys {sorted(unknown)}")
        ftype = raw.get("type")
        if not isinstance(ftype, str):
            raise self.fail(where, f"type {ftype!r} is not a string")
        element = ftype[2:] if ftype.startswith("[]") else ftype
        if element not in PRIMITIVE_TYPES and not IDENTIFIER.match(element):
            raise self.fail(where, f"type {ftype!r} is not a valid type")
        if ftype.startswith("[]") and element == "records":
            raise self.fail(where, "an array of records is not a valid type")
        # A tagged field may omit versions (as in KIP-482's example): it exists where it is tagged.
        versions = self.versions(raw.get("versions", raw.get("taggedVersions")), where, "versions")
        nullable = self.versions(raw.get("nullableVersions", "none"), where, "nullableVersions")
        tagged = self.versions(raw.get("taggedVersions", "none"), where, "taggedVersions")
        flexible = raw.get("flexibleVersions")
        flexible = None if flexible is None else self.versions(flexible, where, "flexibleVersions")
        tag = raw.get("tag")
        if isinstance(tag, str) and tag.isdigit() and len(tag) <= 10:
            tag = int(tag)  # some upstream files write the tag as a string ("0")
        if tag is not None:
            if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag <= MAX_TAG:
                raise self.fail(where, f"tag {tag!r} must be an integer from 0 to {MAX_TAG}")
            if tagged.empty:
                raise self.fail(where, "a tagged field needs taggedVersions")
        elif not tagged.empty:
            raise self.fail(where, "taggedVersions without a tag")
        if not tagged.empty and (tagged.low < versions.low or tagged.high > versions.high):
            raise self.fail(where, f"taggedVersions {tagged} are not within versions {versions}")
        is_array = ftype.startswith("[]")
        struct = None
        if element not in PRIMITIVE_TYPES:
            sub = raw.get("fields")
            if sub is not None:
                if element in self.common_raw:
                    raise self.fail(where, f"struct {element} is both a common struct and defined inline")
                struct = StructSpec(element, self.fields(sub, element, resolving, depth + 1))
            elif element in self.common_raw:
                struct = self.common_struct(element, where, resolving)
            else:
                raise self.fail(where, f"struct type {element} has no fields and is not a common struct")
        elif raw.get("fields") is not None:
            raise self.fail(where, f"a {ftype} field has no fields")
        kind = "array" if is_array else ("struct" if struct is not None else element)
        if not nullable.empty and kind not in NULLABLE_KINDS | {"array", "struct"}:
            raise self.fail(where, f"a {ftype} field cannot be nullable")
        encoding = self.encoding(raw.get("encoding"), ftype, versions, where)
        has_default = "default" in raw
        default = self.default(raw["default"], ftype, nullable, versions, where) if has_default else None
        for key in ("mapKey", "ignorable", "zeroCopy"):
            if not isinstance(raw.get(key, False), bool):
                raise self.fail(where, f"{key} must be a boolean")
        entity = raw.get("entityType")
        if entity is not None and (not isinstance(entity, str) or not IDENTIFIER.match(entity)):
            raise self.fail(where, f"entityType {entity!r} is not an identifier")
        return FieldSpec(
            name=name,
            type=ftype,
            versions=versions,
            nullable_versions=nullable,
            tagged_versions=tagged,
            tag=tag,
            flexible_versions=flexible,
            default=default,
            has_default=has_default,
            entity_type=entity,
            map_key=raw.get("mapKey", False),
            ignorable=raw.get("ignorable", False),
            zero_copy=raw.get("zeroCopy", False),
            encoding=encoding,
            struct=struct,
        )

    def encoding(self, raw: Any, ftype: str, versions: VersionRange, where: str) -> tuple:
        if raw is None:
            return ()
        if ftype not in ENCODABLE_TYPES:
            raise self.fail(where, f"encoding is only allowed on int16, int32 and int64 fields, not {ftype}")
        if isinstance(raw, str):
            pairs = [(versions, raw)]
        elif isinstance(raw, dict):
            pairs = [(self.versions(k, where, "encoding"), v) for k, v in raw.items()]
        else:
            raise self.fail(where, "encoding must be a string or an object of version range to encoding")
        for rng, name in pairs:
            if not isinstance(name, str) or not ENCODING_NAME.match(name):
                raise self.fail(where, f"encoding {name!r} is not (fixed|packed|upacked)(16|32|64)")
        for i, (rng, _) in enumerate(pairs):
            for other, _ in pairs[i + 1 :]:
                if rng.intersects(other):
                    raise self.fail(where, f"encoding ranges {rng} and {other} overlap")
        # Compare range bounds rather than expanding open ranges to 32768 versions.
        spans = sorted((r.low, r.high) for r, _ in pairs if not r.empty)
        merged: list[list[int]] = []
        for low, high in spans:
            if merged and low == merged[-1][1] + 1:
                merged[-1][1] = high
            else:
                merged.append([low, high])
        if versions.empty or merged != [[versions.low, versions.high]]:
            raise self.fail(where, f"encoding versions do not cover exactly the field's versions {versions}")
        return tuple(pairs)

    def default(self, value: Any, ftype: str, nullable: VersionRange, versions: VersionRange, where: str) -> Any:
        if value == "null":
            if ftype in ("bool", "float64", "uuid") or ftype in INTEGER_RANGES:
                raise self.fail(where, f"a {ftype} field cannot default to null")
            if versions.empty or nullable.low > versions.low or nullable.high < versions.high:
                raise self.fail(where, "a null default needs the field nullable in all its versions")
            return None
        if ftype in INTEGER_RANGES:
            if isinstance(value, bool):
                raise self.fail(where, f"default {value!r} is not an integer")
            if isinstance(value, int):
                number = value
            elif isinstance(value, str):
                text = value.strip()
                try:
                    if re.fullmatch(r"-?0[xX][0-9a-fA-F]+", text):
                        number = int(text, 16)
                    elif re.fullmatch(r"-?0[0-7]+", text):
                        number = int(text, 8)
                    elif re.fullmatch(r"-?\d{1,20}", text):
                        number = int(text, 10)
                    else:
                        raise ValueError
                except ValueError:
                    raise self.fail(where, f"default {value!r} is not an integer") from None
            else:
                raise self.fail(where, f"default {value!r} is not an integer")
            low, high = INTEGER_RANGES[ftype]
            if not low <= number <= high:
                raise self.fail(where, f"default {value!r} does not fit in {ftype}")
            return number
        if ftype == "bool":
            if isinstance(value, bool):
                return value
            if value in ("true", "false"):
                return value == "true"
            raise self.fail(where, f"default {value!r} is not a boolean")
        if ftype == "float64":
            try:
                number = float(value) if not isinstance(value, bool) else math.nan
            except (TypeError, ValueError):
                number = math.nan
            if math.isnan(number) and not (isinstance(value, str) and value.strip().lower() == "nan"):
                raise self.fail(where, f"default {value!r} is not a number")
            return number
        if ftype == "string":
            if not isinstance(value, str):
                raise self.fail(where, f"default {value!r} is not a string")
            # JSON escapes can spell lone surrogates: such a default could never be encoded.
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise self.fail(where, f"default {value[:40]!r} is not valid UTF-8 text ({exc.reason})") from None
            if size > 0x7FFF:
                raise self.fail(where, f"default of {size} bytes is longer than a string can be (32767)")
            return value
        if ftype in ("bytes", "records", "uuid") or ftype.startswith("[]"):
            # The format allows only "null" (handled above) for these; an empty string
            # means the type's own default.
            if value == "":
                return None
            raise self.fail(where, f"a {ftype} field cannot have a custom default")
        raise self.fail(where, f"a {ftype} field cannot have a custom default")


def parse_message(doc: Any, source: str = "<spec>") -> MessageSpec:
    """Validate one parsed JSON message definition and return its model."""
    return _Parser(source).message(doc)
