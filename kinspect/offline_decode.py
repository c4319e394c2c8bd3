"""Decodes a recorded connection (client->broker and broker->client bytes) into JSON-ready records.

The streams go through the same session pipeline as live traffic (kinspect.session.replay
orders them), so pairing follows the proxy's rules: KIP-511 fallbacks, SASL v0 raw tokens,
acks=0 produces. Each frame yields one dict, a request followed by its response; a frame
that fails carries the error and the rest go on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

from kinspect.protocol.specs.api_keys import PRODUCE
from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError, EncodeError
from kinspect.protocol.framing.framer import DEFAULT_MAX_FRAME_BYTES
from kinspect.protocol.codec.rendering import render_struct
from kinspect.session import ConnectionInfo, Plan, Problem, Request, Response, Session, SessionConfig
from kinspect.session.events import frame_bytes
from kinspect.session.replay import replay


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


def recorded_session(codec: Codec, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Session:
    """A session for recorded traffic: every frame kept whole, nothing forgotten for lack of an answer."""
    config = SessionConfig(max_frame_bytes=max_frame_bytes, inspect_max_bytes=max_frame_bytes,
                           max_inflight=1 << 30, request_timeout=math.inf)
    return Session(codec, ConnectionInfo(0, "recorded", "recorded"), config, Plan(True))


def decode_conversation(
    codec: Codec, requests: bytes, responses: bytes | None = None, *, roundtrip: bool = False,
    stats: DecodeStats | None = None,
) -> Iterator[dict]:
    """Yield one record per frame: each request, then its response when there is one."""
    stats = stats if stats is not None else DecodeStats()
    session = recorded_session(codec)
    acks_zero: dict[int, int] = {}  # correlation id -> version of a Produce with acks=0
    for events in replay(session, requests, responses or b""):
        for event in events:
            kind = type(event)
            if kind is Request:
                record = request_record(event, roundtrip, stats)
                if not event.expects_response:
                    acks_zero[event.correlation_id] = event.api_version
                yield record
            elif kind is Response:
                yield response_record(event, roundtrip, stats)
            elif kind is Problem:
                record = problem_record(codec, event, acks_zero, roundtrip, stats)
                if record is not None:
                    yield record
    for direction, left in zip(("request", "response"), session.buffered):
        if left:
            stats.decode_errors += 1
            stats.errors.append({"direction": direction, "error": f"{left} bytes of an incomplete last frame"})


def problem_record(codec: Codec, problem: Problem, acks_zero: dict, roundtrip: bool, stats: DecodeStats):
    """A record for a frame the session could not pair or read; None for problems that are not a frame."""
    if problem.kind in ("frame_too_large", "tls_on_plaintext") or (problem.kind == "decode_error" and problem.offset is None):
        stats.decode_errors += 1
        stats.errors.append({"direction": problem.direction, "error": problem.detail})
        return None
    if problem.kind == "decode_error":
        stats.frames += 1
        stats.decode_errors += 1
        record = {"direction": problem.direction, "offset": problem.offset, "size": problem.size}
        record["error"] = {"reason": problem.detail}
        return record
    if problem.kind == "sasl_tokens":  # its bytes are credentials: only where and how long
        stats.frames += 1
        return {"direction": problem.direction, "offset": problem.offset, "size": problem.size,
                "raw_sasl_token": True, "error": None}
    if problem.kind != "unpaired_response":
        return None
    frame = problem.frame
    correlation_id = int.from_bytes(frame[:4], "big", signed=True)
    version = acks_zero.get(correlation_id)
    if version is not None:
        # Kafka brokers never answer acks=0; some Kafka-compatible brokers (Tansu) do.
        response = Response(problem.connection, problem.time, problem.offset, PRODUCE, codec.registry.api_name(PRODUCE),
                            True, version, version, correlation_id, codec.response_header_version(PRODUCE, version),
                            0, 0, (), problem.size, frame, True, codec)
        record = response_record(response, roundtrip, stats)
        record["warning"] = "a response to a Produce with acks=0, which expects none"
        return record
    stats.frames += 1
    stats.unpaired_responses += 1
    stats.decode_errors += 1
    return {"direction": "response", "offset": problem.offset, "size": problem.size, "correlation_id": correlation_id,
            "error": {"reason": "no request with this correlation id"}}


def request_record(event: Request, roundtrip: bool, stats: DecodeStats, offset: int | None = None) -> dict:
    """The JSON record of a request event (offset: where the frame is, if not the event's stream offset)."""
    stats.frames += 1
    codec, frame, header = event.codec, frame_bytes(event.frame), event.header
    record = {"direction": "request", "offset": event.offset if offset is None else offset, "size": event.size}
    try:
        record.update(
            api_key=header.api_key, api_name=codec.registry.api_name(header.api_key),
            api_version=header.api_version, correlation_id=header.correlation_id, client_id=header.client_id,
            header_version=header.version, header_size=header.size,
        )
        unknown: list = []
        record["header"] = render_struct(header.fields, codec.header("RequestHeader", header.version).spec.struct, unknown)
        decoded = event.decode()
        body = decoded.body
        record["body"] = render_struct(body, codec.body(header.api_key, "request", header.api_version).spec.struct, unknown)
        record["unknown_tagged_fields"] = unknown
        _trailing(record, decoded.trailing, decoded.size)
        record["error"] = None
        if roundtrip:
            again = codec.encode_request(header.fields, body, decoded.trailing)
            _compare(record, frame, again, stats)
    except (DecodeError, EncodeError) as exc:
        _fail(record, exc, stats)
    return record


def response_record(event: Response, roundtrip: bool, stats: DecodeStats, offset: int | None = None) -> dict:
    """The JSON record of a response event."""
    stats.frames += 1
    codec, frame, api_key, api_version = event.codec, frame_bytes(event.frame), event.api_key, event.api_version
    record = {
        "direction": "response", "offset": event.offset if offset is None else offset, "size": event.size,
        "api_key": api_key,
        "api_name": event.api_name, "api_version": api_version,
    }
    try:
        decoded = event.decode()
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
