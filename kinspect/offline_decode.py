"""Decodes a recorded connection (client->broker and broker->client bytes) into JSON-ready records.

Requests are read in order; responses are paired with their request by correlation id
(the request tells the response's api key and version); a Produce with acks=0 has no
response. Each frame yields one dict; a frame that fails carries the error and the
rest go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from kinspect.protocol.codec import Codec, correlation_id_of_response
from kinspect.protocol.errors import DecodeError, EncodeError
from kinspect.protocol.framer import FrameError, split_frames
from kinspect.protocol.rendering import render_struct

PRODUCE_KEY = 0


@dataclass
class DecodeStats:
    frames: int = 0
    decode_errors: int = 0
    roundtrip_mismatches: int = 0
    unpaired_responses: int = 0
    errors: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.decode_errors or self.roundtrip_mismatches)


def _first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _frames(data: bytes, direction: str, stats: DecodeStats) -> list[tuple[int, bytes]]:
    try:
        frames, trailing = split_frames(data)
    except FrameError as exc:
        stats.decode_errors += 1
        stats.errors.append({"direction": direction, "error": str(exc)})
        return []
    if trailing:
        stats.decode_errors += 1
        stats.errors.append({"direction": direction, "error": f"{trailing} bytes of an incomplete last frame"})
    return frames


def decode_conversation(
    codec: Codec, requests: bytes, responses: bytes | None = None, *, roundtrip: bool = False,
    stats: DecodeStats | None = None,
) -> Iterator[dict]:
    """Yield one record per frame: each request, then its response when there is one."""
    stats = stats if stats is not None else DecodeStats()
    response_frames = _frames(responses, "response", stats) if responses else []
    by_correlation: dict[int, list[tuple[int, bytes]]] = {}
    for offset, frame in response_frames:
        try:
            by_correlation.setdefault(correlation_id_of_response(frame), []).append((offset, frame))
        except DecodeError:
            by_correlation.setdefault(-1, []).append((offset, frame))
    for offset, frame in _frames(requests, "request", stats):
        record, expects = _request_record(codec, frame, offset, roundtrip, stats)
        yield record
        corr = record.get("correlation_id")
        if corr is not None and by_correlation.get(corr) and "api_version" in record:
            r_offset, r_frame = by_correlation[corr].pop(0)
            response = _response_record(codec, r_frame, r_offset, record["api_key"], record["api_version"], roundtrip, stats)
            if not expects:
                # Kafka brokers never answer acks=0; some Kafka-compatible brokers (Tansu) do.
                response["warning"] = "a response to a Produce with acks=0, which expects none"
            yield response
    for corr, left in sorted(by_correlation.items()):
        for r_offset, r_frame in left:
            stats.frames += 1
            stats.unpaired_responses += 1
            stats.decode_errors += 1
            yield {
                "direction": "response", "offset": r_offset, "size": len(r_frame), "correlation_id": corr,
                "error": {"reason": "no request with this correlation id"},
            }


def _request_record(codec: Codec, frame: bytes, offset: int, roundtrip: bool, stats: DecodeStats):
    stats.frames += 1
    record = {"direction": "request", "offset": offset, "size": len(frame)}
    expects_response = True
    try:
        header = codec.decode_request_header(frame)
        record.update(
            api_key=header.api_key, api_name=codec.registry.api_name(header.api_key),
            api_version=header.api_version, correlation_id=header.correlation_id, client_id=header.client_id,
            header_version=header.version, header_size=header.size,
        )
        unknown: list = []
        record["header"] = render_struct(header.fields, codec.header("RequestHeader", header.version).spec.struct, unknown)
        decoded = codec.decode_request(frame)
        body = decoded.body
        if header.api_key == PRODUCE_KEY and body.get("Acks") == 0:
            expects_response = False
        record["body"] = render_struct(body, codec.body(header.api_key, "request", header.api_version).spec.struct, unknown)
        record["unknown_tagged_fields"] = unknown
        _trailing(record, decoded.trailing, decoded.size)
        record["error"] = None
        if roundtrip:
            again = codec.encode_request(header.fields, body, decoded.trailing)
            _compare(record, frame, again, stats)
    except (DecodeError, EncodeError) as exc:
        _fail(record, exc, stats)
    return record, expects_response


def _response_record(codec, frame, offset, api_key, api_version, roundtrip, stats):
    stats.frames += 1
    record = {
        "direction": "response", "offset": offset, "size": len(frame), "api_key": api_key,
        "api_name": codec.registry.api_name(api_key), "api_version": api_version,
    }
    try:
        decoded = codec.decode_response(frame, api_key, api_version)
        unknown: list = []
        record.update(
            correlation_id=decoded.correlation_id, header_version=decoded.header_version,
            header_size=decoded.header_size,
            header=render_struct(decoded.header, codec.header("ResponseHeader", decoded.header_version).spec.struct, unknown),
        )
        record["body"] = render_struct(decoded.body, codec.body(api_key, "response", api_version).spec.struct, unknown)
        record["unknown_tagged_fields"] = unknown
        _trailing(record, decoded.trailing, decoded.size)
        record["error"] = None
        if roundtrip:
            again = codec.encode_response(api_key, api_version, decoded.header, decoded.body, decoded.trailing)
            _compare(record, frame, again, stats)
    except (DecodeError, EncodeError) as exc:
        _fail(record, exc, stats)
    return record


def _trailing(record: dict, trailing: bytes, size: int) -> None:
    if trailing:
        record["trailing_bytes"] = len(trailing)
        record["warning"] = f"{len(trailing)} bytes after the end of the message at byte {size - len(trailing)}"


def _compare(record: dict, frame: bytes, again: bytes, stats: DecodeStats) -> None:
    if again != frame:
        stats.roundtrip_mismatches += 1
        record["roundtrip"] = {
            "identical": False, "first_difference": _first_difference(frame, again),
            "original_size": len(frame), "reencoded_size": len(again),
        }
    else:
        record["roundtrip"] = {"identical": True}


def _fail(record: dict, exc: Exception, stats: DecodeStats) -> None:
    if isinstance(exc, EncodeError):  # decoded, but could not be written back
        stats.roundtrip_mismatches += 1
        record["roundtrip"] = {"identical": False, "error": str(exc)}
        return
    stats.decode_errors += 1
    record["error"] = exc.to_dict()
