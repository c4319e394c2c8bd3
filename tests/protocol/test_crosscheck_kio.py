"""Cross-check kinspect's codec against kio, an independent codec generated from the same specs.

For every (api, version, direction) that both know (all 604 bodies kio 0.6.5 defines),
random values from kinspect's own strategy (tests/spec_values.py) are encoded by kinspect
and read by kio's native reader, and the two results are compared field by field; kio's
writer then re-encodes the entity it read, and kinspect must decode those bytes to the same
value and encode that value back to the very same bytes. The other way round, entities
from kio's own hypothesis strategies (st.from_type) are written by kio and read by kinspect.
No (api, version) disagrees: nothing is excluded. What kio cannot represent is kept out
value by value (see _fit), each with the reason.

kio's model differs from kinspect's in ways the normaliser below undoes:
- field names are snake_case of the spec names, with `Ms` dropped where kio maps the
  field to a duration or a timestamp (ThrottleTimeMs -> throttle_time) and a trailing
  underscore on Python builtins (Id -> id_). Fields are paired by position, which both
  take from the spec, and the names are checked too;
- int16 `*ErrorCode` fields are `kio.schema.errors.ErrorCode` members (IntEnum);
- some int32/int64 fields are `datetime.timedelta` (kafka_type timedelta_i32/_i64) and
  some int64 fields are tz-aware `datetime` (datetime_i64; the nullable ones map -1 to None);
- a zero uuid reads as None;
- arrays are tuples; a tagged field missing from the wire holds its default, and the
  writer leaves out tagged fields that hold their default.

Values kio cannot represent are mapped into its range before encoding (see _fit): error
codes it has no enum member for (kio raises ValueError), negative timestamps (OutOfBoundValue),
timestamps and i64 durations past 2**42 ms (kio converts them through a float of seconds and
is off by a millisecond now and then), and tagged fields present on the wire with a null
value (UnexpectedNull: kio reads tagged fields with the non-null reader). Unknown tagged
fields are dropped: kio does not keep them.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import re
import types
import typing
import uuid
from pkgutil import resolve_name

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.static.constants import EntityType
from kio.static.primitive import Records

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.specs.model import FieldSpec, StructSpec
from tests.spec_values import struct_value

CODEC = Codec()
_DIRECTIONS = {"request": EntityType.request, "response": EntityType.response}


def _kio_cases() -> list[tuple[int, str, int, str]]:
    """(api key, kio module name, version, direction) of every body kio and kinspect both define."""
    cases = []
    for key, name in sorted(api_key_map.items()):
        known = set()
        for direction in _DIRECTIONS:
            known.update((v, direction) for v in CODEC.registry.versions(key, direction))
        for version, entities in sorted(schema_name_map[name].items()):
            for direction, entity_type in _DIRECTIONS.items():
                if entity_type in entities and (version, direction) in known:
                    cases.append((key, name, version, direction))
    return cases


CASES = _kio_cases()


def _id(case) -> str:
    key, name, version, direction = case
    return f"{name}-{direction}-v{version}"


@functools.lru_cache(maxsize=None)  # pkgutil's resolve_name imports and walks the path on every call
def _kio_class(name: str, version: int, direction: str) -> type:
    return resolve_name(schema_name_map[name][version][_DIRECTIONS[direction]])


# ------------------------------------------------------------------ pairing the two models


@functools.lru_cache(maxsize=None)  # two regular expressions a name, asked for hundreds of thousands of times a run
def _snake(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()


def _names_match(spec_name: str, kio_name: str) -> bool:
    snake = _snake(spec_name)
    return kio_name in (snake, snake + "_", snake.removesuffix("_ms"))


# (id of the spec, kio class, version) -> (the spec, its pairs): the pairing of a struct at a version never
# changes, and every value of it pairs its fields again (64,000 times in a run of the module).
_PAIRED: dict[tuple[int, type, int], tuple[StructSpec, tuple]] = {}


def _pairs(spec: StructSpec, kio_cls: type, version: int) -> tuple[tuple[FieldSpec, dataclasses.Field], ...]:
    """The fields of one struct at one version, paired with kio's (both follow the spec's order)."""
    known = _PAIRED.get((id(spec), kio_cls, version))
    if known is None or known[0] is not spec:
        known = _PAIRED[(id(spec), kio_cls, version)] = (spec, _pair(spec, kio_cls, version))
    return known[1]


def _pair(spec: StructSpec, kio_cls: type, version: int) -> tuple[tuple[FieldSpec, dataclasses.Field], ...]:
    ours = [f for f in spec.fields if version in f.versions]
    theirs = dataclasses.fields(kio_cls)
    assert len(ours) == len(theirs), (spec.name, [f.name for f in ours], [f.name for f in theirs])
    for f, kf in zip(ours, theirs):
        assert _names_match(f.name, kf.name), (spec.name, f.name, kf.name)
    return tuple(zip(ours, theirs))


def _entity_type(kf: dataclasses.Field) -> type:
    """The dataclass inside a struct field's type (T, T | None or tuple[T, ...])."""
    t = kf.type
    if typing.get_origin(t) in (types.UnionType, typing.Union):
        t = next(a for a in typing.get_args(t) if a is not type(None))
    if typing.get_origin(t) is tuple:
        t = typing.get_args(t)[0]
    assert dataclasses.is_dataclass(t), kf
    return t


def _kafka_type(kf: dataclasses.Field) -> str | None:
    return kf.metadata.get("kafka_type")


def _nullable(kf: dataclasses.Field) -> bool:
    return typing.get_origin(kf.type) in (types.UnionType, typing.Union) and type(None) in typing.get_args(kf.type)


# ------------------------------------------------------------------ fitting values to kio's range

_ERROR_CODES = sorted(int(e) for e in ErrorCode)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)
# kio rejects negative timestamps, and builds its datetimes through a float of seconds, so
# past about 2**42 ms (year 2109) it is off by a millisecond now and then (its limitation,
# not a wire difference): timestamps are kept in [0, 2**42).
_MAX_TIMESTAMP_MS = 2**42 - 1
# kio's timedelta_i64 writer goes through a float of seconds too (8866461766385647 ms
# came back one off): durations are kept in [-2**42, 2**42), well inside timedelta's range.
_TIMEDELTA_LIMIT = 2**42


def _fit_scalar(value, kind: str | None, nullable: bool):
    if isinstance(value, list):
        return [_fit_scalar(v, kind, False) for v in value]
    if value is None:
        return None
    if kind == "error_code" and value not in _ERROR_CODES:
        return _ERROR_CODES[value % len(_ERROR_CODES)]
    if kind == "datetime_i64" and not (0 <= value <= _MAX_TIMESTAMP_MS or (nullable and value == -1)):
        return value % (_MAX_TIMESTAMP_MS + 1)
    if kind == "timedelta_i64":
        return (value + _TIMEDELTA_LIMIT) % (2 * _TIMEDELTA_LIMIT) - _TIMEDELTA_LIMIT
    if kind == "float64" and value in (float("inf"), float("-inf")):
        return 0.5 if value > 0 else -0.5  # kio's f64 is finite
    return value


def _fit(value: dict, spec: StructSpec, kio_cls: type, version: int) -> dict:
    """A copy of value that kio can represent (see the module docstring); drops unknown tags."""
    out = {}
    for f, kf in _pairs(spec, kio_cls, version):
        if f.name not in value:
            continue
        v = value[f.name]
        if v is None and version in f.tagged_versions:
            # kio reads a tagged field with the reader of its non-null type (its writer
            # never writes a null there, since null is the default of every nullable
            # tagged field), so a tagged field present with a null value is unreadable
            # to it: UnexpectedNull. The wire allows it (Kafka's own generator writes
            # the null when the default is not null), so kinspect is not at fault.
            continue
        if f.struct is not None and v is not None:
            inner = _entity_type(kf)
            v = [_fit(x, f.struct, inner, version) for x in v] if f.is_array else _fit(v, f.struct, inner, version)
        else:
            v = _fit_scalar(v, _kafka_type(kf), _nullable(kf))
        out[f.name] = v
    return out


# ------------------------------------------------------------------ kio values back to kinspect's


def _normalise_scalar(value, kind: str | None, spec_type: str):
    if isinstance(value, tuple):
        return [_normalise_scalar(v, kind, spec_type) for v in value]
    if kind in ("timedelta_i32", "timedelta_i64"):
        return value // _MS
    if kind == "datetime_i64":
        return -1 if value is None else (value - _EPOCH) // _MS
    if value is None:
        return uuid.UUID(int=0) if spec_type == "uuid" else None
    if kind == "error_code":
        assert isinstance(value, ErrorCode)
        return int(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, str):
        return str(value)
    return value


def _normalise(entity, spec: StructSpec, version: int) -> dict:
    """A kio entity as a kinspect value: every field of the version, tagged ones included."""
    out = {}
    for f, kf in _pairs(spec, type(entity), version):
        v = getattr(entity, kf.name)
        if f.struct is not None:
            if v is None:
                out[f.name] = None
            elif f.is_array:
                out[f.name] = [_normalise(x, f.struct, version) for x in v]
            else:
                out[f.name] = _normalise(v, f.struct, version)
        else:
            out[f.name] = _normalise_scalar(v, _kafka_type(kf), f.element_type)
    return out


def _default(kf: dataclasses.Field, f: FieldSpec, version: int):
    """kio's default of a tagged field, as a kinspect value."""
    d = get_tagged_field_default(kf)
    if f.struct is not None:
        if d is None:
            return None
        if f.is_array:
            return [_normalise(x, f.struct, version) for x in d]
        return _normalise(d, f.struct, version)
    return _normalise_scalar(d, _kafka_type(kf), f.element_type)


def _fill_tagged(value: dict, spec: StructSpec, kio_cls: type, version: int) -> dict:
    """value with every tagged field that is not on the wire set to kio's default for it."""
    out = {}
    for f, kf in _pairs(spec, kio_cls, version):
        if f.name not in value:
            assert version in f.tagged_versions, f.name
            out[f.name] = _default(kf, f, version)
            continue
        v = value[f.name]
        if f.struct is not None and v is not None:
            inner = _entity_type(kf)
            v = (
                [_fill_tagged(x, f.struct, inner, version) for x in v]
                if f.is_array
                else _fill_tagged(v, f.struct, inner, version)
            )
        out[f.name] = v
    return out


def _strip_defaults(value: dict, spec: StructSpec, kio_cls: type, version: int) -> dict:
    """value without the tagged fields that hold kio's default: what kio's writer writes."""
    out = {}
    for f, kf in _pairs(spec, kio_cls, version):
        if f.name not in value:
            continue
        v = value[f.name]
        if f.struct is not None and v is not None:
            inner = _entity_type(kf)
            v = (
                [_strip_defaults(x, f.struct, inner, version) for x in v]
                if f.is_array
                else _strip_defaults(v, f.struct, inner, version)
            )
        if version in f.tagged_versions and _filled(v, f, kf, version) == _default(kf, f, version):
            continue
        out[f.name] = v
    return out


def _filled(v, f: FieldSpec, kf: dataclasses.Field, version: int):
    if f.struct is None or v is None:
        return v
    inner = _entity_type(kf)
    if f.is_array:
        return [_fill_tagged(x, f.struct, inner, version) for x in v]
    return _fill_tagged(v, f.struct, inner, version)


def _differences(ours, theirs, path: str = "") -> list[str]:
    """Field paths where two kinspect values differ (floats compared by value, -0.0 == 0.0)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for k in sorted(set(ours) | set(theirs)):
            if k not in ours or k not in theirs:
                out.append(f"{path}.{k}: only in {'kinspect' if k in ours else 'kio'}")
            else:
                out += _differences(ours[k], theirs[k], f"{path}.{k}" if path else k)
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{path}: {len(ours)} elements in kinspect, {len(theirs)} in kio"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in _differences(a, b, f"{path}[{i}]")]
    if ours != theirs:
        return [f"{path}: kinspect {ours!r} != kio {theirs!r}"]
    return []


# ------------------------------------------------------------------ the tests

def test_cases_are_broad():
    """kio 0.6.5 follows Kafka 4.x: all its bodies are ones kinspect knows."""
    assert len(CASES) >= 600
    defined = sum(
        1 for name, versions in schema_name_map.items() if name in api_key_map.values()
        for entities in versions.values() for e in entities if e in _DIRECTIONS.values()
    )
    assert len(CASES) == defined


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(
    max_examples=6, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_kinspect_encodes_what_kio_reads(case, data):
    key, name, version, direction = case
    compiled = CODEC.body(key, direction, version)
    spec = compiled.spec.struct
    kio_cls = _kio_class(name, version, direction)
    value = _fit(data.draw(struct_value(spec, version, compiled.flexible)), spec, kio_cls, version)

    encoded = bytes(compiled.encode(value))
    entity, end = entity_reader(kio_cls)(encoded, 0)
    assert end == len(encoded), f"kio read {end} of {len(encoded)} bytes"
    diffs = _differences(_fill_tagged(value, spec, kio_cls, version), _normalise(entity, spec, version))
    assert not diffs, diffs

    # kio's writer, fed what it read: kinspect reads those bytes and writes them back unchanged.
    out = io.BytesIO()
    entity_writer(kio_cls)(out, entity)
    kio_bytes = out.getvalue()
    expected = _strip_defaults(value, spec, kio_cls, version)
    assert bytes(compiled.encode(expected)) == kio_bytes
    decoded, _ = compiled.decode(kio_bytes)
    diffs = _differences(decoded, expected)
    assert not diffs, diffs
    assert bytes(compiled.encode(decoded)) == kio_bytes


def test_header_and_frame_against_kio():
    """A whole request and response frame: kio's header writer and kinspect's frame decoder agree."""
    import kio.schema.metadata.v12.request as req
    import kio.schema.metadata.v12.response as resp
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.static.primitive import i16, i32

    request = req.MetadataRequest(
        topics=(req.MetadataRequestTopic(topic_id=uuid.uuid4(), name="orders"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    header = RequestHeader(request_api_key=i16(3), request_api_version=i16(12), correlation_id=i32(77), client_id="cx")
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, header)
    entity_writer(req.MetadataRequest)(out, request)
    frame = out.getvalue()
    decoded = CODEC.decode_request(frame)
    assert (decoded.header.api_key, decoded.header.api_version) == (3, 12)
    assert (decoded.header.correlation_id, decoded.header.client_id) == (77, "cx")
    assert decoded.body["Topics"] == [{"TopicId": request.topics[0].topic_id, "Name": "orders"}]
    assert CODEC.encode_request(decoded.header.fields, decoded.body) == frame

    response = resp.MetadataResponse(
        throttle_time=datetime.timedelta(milliseconds=5), brokers=(), cluster_id="c", controller_id=i32(1), topics=(),
    )
    out = io.BytesIO()
    entity_writer(ResponseHeader)(out, ResponseHeader(correlation_id=i32(77)))
    entity_writer(resp.MetadataResponse)(out, response)
    frame = out.getvalue()
    decoded_response = CODEC.decode_response(frame, 3, 12)
    assert decoded_response.correlation_id == 77
    assert decoded_response.body["ThrottleTimeMs"] == 5
    assert decoded_response.body["ClusterId"] == "c"
    assert CODEC.encode_response(3, 12, decoded_response.header, decoded_response.body) == frame


def _tame(entity):
    """entity with its timestamps and i64 durations moved into the range kio converts exactly."""
    changes = {}
    for kf in dataclasses.fields(entity):
        v = getattr(entity, kf.name)
        kind = _kafka_type(kf)
        if dataclasses.is_dataclass(v):
            changes[kf.name] = _tame(v)
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
            changes[kf.name] = tuple(_tame(x) for x in v)
        elif kind == "datetime_i64" and v is not None:
            ms = (v - _EPOCH) // _MS % (_MAX_TIMESTAMP_MS + 1)
            changes[kf.name] = _EPOCH + ms * _MS
        elif kind == "timedelta_i64":
            changes[kf.name] = _fit_scalar(v // _MS, kind, False) * _MS
    return dataclasses.replace(entity, **changes)


# kio registers strategies for its primitive types but none for Records (records fields are
# bytes on the wire, null allowed where the field is nullable); give it one.
st.register_type_strategy(Records, st.binary(max_size=48))


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(
    max_examples=3, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_kinspect_reads_what_kio_builds(case, data):
    """The other way: entities from kio's own strategies (st.from_type), written by kio."""
    key, name, version, direction = case
    compiled = CODEC.body(key, direction, version)
    spec = compiled.spec.struct
    kio_cls = _kio_class(name, version, direction)
    entity = _tame(data.draw(st.from_type(kio_cls)))
    out = io.BytesIO()
    entity_writer(kio_cls)(out, entity)
    kio_bytes = out.getvalue()

    decoded, _ = compiled.decode(kio_bytes)
    again, _ = entity_reader(kio_cls)(kio_bytes, 0)
    diffs = _differences(_fill_tagged(decoded, spec, kio_cls, version), _normalise(again, spec, version))
    assert not diffs, diffs
    assert bytes(compiled.encode(decoded)) == kio_bytes
