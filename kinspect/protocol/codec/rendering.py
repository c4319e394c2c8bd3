"""Decoded messages as JSON-friendly values: uuids as strings, bytes as base64, records as summaries."""

from __future__ import annotations

import base64
import math
from uuid import UUID

from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.records import RecordsError, summarize_records
from kinspect.protocol.specs.model import StructSpec


def _b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _scalar(value):
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _b64(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no NaN or infinity
    return value


def render_records(value):
    """A records field as its batch summary (keys and values are never read)."""
    if value is None:
        return None
    try:
        return summarize_records(value).to_dict()
    except RecordsError as exc:
        return {"error": str(exc), "total_bytes": len(value)}


def render_struct(value: dict, spec: StructSpec, unknown: list, path: str = "") -> dict:
    """A JSON-friendly copy of a decoded struct; unknown tagged fields are moved into `unknown`."""
    out = {}
    fields = {f.name: f for f in spec.fields}
    for name, item in value.items():
        if name == UNKNOWN_TAGS:
            unknown.extend({"path": path, "tag": tag, "data": _b64(data)} for tag, data in item)
            continue
        f = fields.get(name)
        where = f"{path}.{name}" if path else name
        if f is None:
            out[name] = _scalar(item)
        elif item is None:
            out[name] = None
        elif f.type == "records":
            out[name] = render_records(item)
        elif f.struct is not None and f.is_array:
            out[name] = [render_struct(x, f.struct, unknown, f"{where}[{i}]") for i, x in enumerate(item)]
        elif f.struct is not None:
            out[name] = render_struct(item, f.struct, unknown, where)
        elif f.is_array:
            out[name] = [_scalar(x) for x in item]
        else:
            out[name] = _scalar(item)
    return out
