"""The REFERENCE capture row (a dict keyed by schema.COLUMNS) of an Exchange: decoded again and walked.

This is how capture rows were built before the scan gathered their facts (issue 11): the
frames are decoded and scanned with a codec of their own, and the decoded body walked
guided by its spec (field_walk). kinspect.capture.rows builds rows from the scan's facts
alone; tests/capture/test_capture_rows.py checks that both give the same rows.
"""

from __future__ import annotations

import struct
from collections import Counter

from tests.support.field_walk import PlanCache, walk_body
from kinspect.capture.schema import SCHEMA_VERSION
from tests.support.sample_data import trimmed
from kinspect.protocol.codec import Codec, response_header_version
from kinspect.protocol.error_codes import error_name
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.wire.peek import tag_section_fields
from kinspect.protocol.wire.primitives import Malformed
from kinspect.session.events import Exchange, Request, Response, frame_bytes

_INT16 = struct.Struct(">h")


class _Side:
    """What one direction of an exchange yields: scan, decoded body, walk, and errors."""

    __slots__ = ("body", "error", "scan", "spec", "walk")

    def __init__(self) -> None:
        self.scan = self.body = self.walk = self.error = self.spec = None


def _first_flexible(spec) -> int | None:
    return None if spec is None or spec.flexible_versions.empty else spec.flexible_versions.low


class RowBuilder:
    """Turns Exchange events into capture rows; `wall_offset` maps the events' monotonic times to UTC."""

    def __init__(self, codec: Codec, wall_offset: float) -> None:
        self.codec = codec
        self.wall_offset = wall_offset
        self.plans = PlanCache()

    def _micros(self, monotonic: float) -> int:
        return round((monotonic + self.wall_offset) * 1_000_000)

    # ------------------------------------------------------------------ one direction

    def _inspect(self, event: Request | Response, direction: str, api_key: int, version: int, decode, scan) -> _Side:
        side = _Side()
        spec = side.spec = self.codec.registry.message(api_key, direction, version)
        if not event.complete:
            side.error = (f"the {event.size}-byte frame was larger than the inspection limit; "
                          "only its header was kept")
            return side
        if spec is None:
            name = self.codec.registry.api_name(api_key)
            what = f"version {version} of {name}" if name else f"api key {api_key}"
            side.error = f"unknown {what}: no loaded spec defines it"
            return side
        try:
            side.scan = scan()
            side.body = decode().body
        except DecodeError as exc:
            side.error = str(exc)
            return side
        first = _first_flexible(spec)
        target = first if first is not None and version not in spec.flexible_versions else None
        side.walk = walk_body(self.plans, spec, version, side.body, target)
        return side

    # ------------------------------------------------------------------ the row

    def build(self, exchange: Exchange) -> dict:
        request, response = exchange.request, exchange.response
        header = request.header
        api_key, version = header.api_key, header.api_version
        codec = self.codec
        frame = frame_bytes(request.frame)  # the reference reads a frame in pieces joined

        req = self._inspect(request, "request", api_key, version, lambda: codec.decode_request(frame),
                            lambda: codec.scan_request(frame, header))
        flexible = req.spec is not None and version in req.spec.flexible_versions
        tagged: list[dict] = []
        request_tag_bytes = 0
        if header.version >= 2:  # flexible header: ClientId (int16 length, always), then a tag section
            client_id_length = _INT16.unpack_from(frame, 8)[0]
            request_tag_bytes = header.size - 10 - max(0, client_id_length)
            for tag, data in header.fields.get("_unknown_tagged_fields") or ():
                tagged.append(_tagged("request_header", "", tag, None, len(data)))
        if req.scan is not None:
            request_tag_bytes += req.scan.tag_section_bytes
            tagged.extend(_tagged("request_body", p, t, n, s) for p, t, n, s in req.scan.tagged_fields)

        row = {
            "schema_version": SCHEMA_VERSION,
            "request_time": self._micros(request.time),
            "response_time": None,
            "latency_us": None if exchange.latency is None else round(exchange.latency * 1_000_000),
            "connection_id": request.connection.id,
            "client_address": request.connection.client_address,
            "client_id": header.client_id,
            "broker": request.connection.broker,
            "node_id": request.connection.node_id,
            "api_key": api_key,
            "api_name": request.api_name,
            "request_version": version,
            "response_version": None,
            "request_header_version": header.version,
            "response_header_version": None,
            "flexible": flexible,
            "correlation_id": header.correlation_id,
            "request_size": request.size,
            "response_size": None,
            "request_header_size": header.size,
            "response_header_size": None,
            "request_inspected": request.complete,
            "response_inspected": None,
            "request_decode_error": req.error,
            "response_decode_error": None,
            "request_tag_section_bytes": request_tag_bytes,
            "response_tag_section_bytes": None,
            "first_flexible_version": _first_flexible(req.spec),
            "request_compact_size": None,
            "response_compact_size": None,
            "client_software_name": request.connection.client_software_name,
            "client_software_version": request.connection.client_software_version,
            "record_magics": _magics(req.scan) if api_key == 0 else [],
        }
        if req.walk is not None and req.walk.compact_delta is not None:
            # The header at its flexible version: ClientId keeps its int16 length, plus a tag section.
            client_id = header.client_id.encode("utf-8") if header.client_id is not None else b""
            flexible_header = 8 + 2 + len(client_id) + 1
            row["request_compact_size"] = request.size + req.walk.compact_delta + flexible_header - header.size

        resp = None
        if response is not None:
            resp = self._response(row, response, tagged)
        scans = [s.scan for s in (req, resp) if s is not None and s.scan is not None]
        row["tagged_fields"] = tagged
        row["error_codes"] = [] if resp is None or resp.scan is None else [
            {"code": code, "name": error_name(code), "count": count}
            for code, count in sorted(resp.scan.error_codes.items())
        ]
        row["topic_partitions"] = _topic_partitions(req, resp)
        _records(row, scans)
        row["integer_fields"] = _integer_fields("request", req) + (_integer_fields("response", resp) if resp else [])
        return row

    def _response(self, row: dict, response: Response, tagged: list) -> _Side:
        codec = self.codec
        frame = frame_bytes(response.frame)
        api_key, version = response.api_key, response.api_version
        resp = self._inspect(response, "response", api_key, version,
                             lambda: codec.decode_response(frame, api_key, version),
                             lambda: codec.scan_response(frame, api_key, version))
        header_size, tag_bytes = 4, 0
        if response.header_version >= 1:
            try:
                fields, header_size = tag_section_fields(frame, 4)
            except (IndexError, Malformed):
                fields, header_size = (), min(len(frame), 5)
            tag_bytes = header_size - 4
            for tag, size in fields:
                tagged.append(_tagged("response_header", "", tag, None, size))
        if resp.scan is not None:
            tag_bytes += resp.scan.tag_section_bytes
            tagged.extend(_tagged("response_body", p, t, n, s) for p, t, n, s in resp.scan.tagged_fields)
        row.update({
            "response_time": self._micros(response.time),
            "response_version": version,
            "response_header_version": response.header_version,
            "response_size": response.size,
            "response_header_size": header_size,
            "response_inspected": response.complete,
            "response_decode_error": resp.error,
            "response_tag_section_bytes": tag_bytes,
        })
        if resp.walk is not None and resp.walk.compact_delta is not None:
            grows = response_header_version(api_key, True) > response.header_version  # header v0 -> v1: +1 tag byte
            row["response_compact_size"] = response.size + resp.walk.compact_delta + (1 if grows else 0)
        return resp


def _tagged(location: str, path: str, tag: int, name: str | None, size: int) -> dict:
    return {"location": location, "path": path, "tag": tag, "name": name, "size": size, "known": name is not None}


def _topic_partitions(req: _Side, resp: _Side | None) -> list[dict]:
    """Topics of both directions; a topic named by both counts the larger number of partitions (not their sum)."""
    merged: Counter = Counter()
    for side in (req, resp):
        if side is not None and side.walk is not None:
            for topic, partitions in side.walk.topics.items():
                merged[topic] = max(merged.get(topic, 0), partitions)
    return [{"topic": t, "partitions": n} for t, n in sorted(merged.items())]


def _magics(scan) -> list[int]:
    """Distinct magic values of a Produce request's record batches, ascending."""
    if scan is None or not scan.record_spans:
        return []
    return sorted({batch.magic for summary in scan.records if summary is not None for batch in summary.batches})


def _records(row: dict, scans: list) -> None:
    """Record batches, records and per-codec figures from the scans' batch summaries (headers only)."""
    batches = records = 0
    codecs: dict[str, list[int]] = {}
    for scan in scans:
        if not scan.record_spans:
            continue
        for summary in scan.records:
            if summary is None:
                continue
            for batch in summary.batches:
                batches += 1
                count = max(batch.record_count, 0)
                records += count
                acc = codecs.get(batch.compression)
                if acc is None:
                    acc = codecs[batch.compression] = [0, 0, 0]
                acc[0] += 1
                acc[1] += count
                acc[2] += batch.batch_length + 12  # the offset and length fields are not in batch_length
    row["record_batches"] = batches
    row["record_count"] = records
    row["compression"] = [{"codec": c, "batches": a[0], "records": a[1], "bytes": a[2]} for c, a in sorted(codecs.items())]


def _integer_fields(location: str, side: _Side) -> list[dict]:
    if side.walk is None:
        return []
    return [
        {"location": location, "path": path, "type": t, "count": n, "fixed_bytes": fixed, "uvarint_bytes": u,
         "zigzag_bytes": z, "uvarint_hist": trimmed(uh), "zigzag_hist": trimmed(zh)}
        for path, (t, n, fixed, u, z, uh, zh) in side.walk.integers.items()
    ]
