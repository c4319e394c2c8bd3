"""The events a session emits for observers: requests, responses, exchanges and problems.

Events carry the frame (whole, or only its head when it was larger than the inspection
limit) and decode or scan it only when an observer asks, once, with the session's codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.scan_result import ScanResult


@dataclass(slots=True)
class ConnectionInfo:
    """Who is talking: the client address, the broker it reaches, and its client id once seen."""

    id: int
    client_address: str
    broker: str
    node_id: int | None = None
    client_id: str | None = None
    # KIP-511 ClientSoftwareName/Version from ApiVersions v3+, sanitized (kinspect/session/client_software.py)
    client_software_name: str | None = None
    client_software_version: str | None = None


class _Lazy:
    """Decode and scan on demand, caching the outcome (a value or the DecodeError)."""

    __slots__ = ()

    def _once(self, slot: str, compute):
        outcome = getattr(self, slot)
        if outcome is None:
            try:
                outcome = compute(self._complete_frame())
            except DecodeError as exc:
                outcome = exc
            setattr(self, slot, outcome)
        if isinstance(outcome, DecodeError):
            raise outcome
        return outcome

    def _complete_frame(self) -> bytes:
        if not self.complete:
            raise DecodeError(
                f"the {self.size}-byte frame was larger than the inspection limit; only its header was kept",
                api_key=self.api_key, version=self.api_version,
            )
        return self.frame


@dataclass(slots=True, eq=False)
class Request(_Lazy):
    connection: ConnectionInfo
    time: float
    header: RequestHeader
    api_name: str | None
    size: int  # frame size, without the 4-byte size prefix
    frame: bytes
    complete: bool
    codec: Codec = field(repr=False)
    expects_response: bool = True
    _decoded: object = field(default=None, repr=False)
    _scanned: object = field(default=None, repr=False)

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id

    def decode(self):
        """The DecodedRequest (raises DecodeError, cached either way)."""
        return self._once("_decoded", self.codec.decode_request)

    def scan(self) -> ScanResult:
        return self._once("_scanned", lambda frame: self.codec.scan_request(frame, self.header))


@dataclass(slots=True, eq=False)
class Response(_Lazy):
    connection: ConnectionInfo
    time: float
    api_key: int
    api_name: str | None
    api_version: int  # the version the body is decoded at (0 for KIP-511's fallback)
    request_version: int
    correlation_id: int
    header_version: int
    size: int
    frame: bytes
    complete: bool
    codec: Codec = field(repr=False)
    _decoded: object = field(default=None, repr=False)
    _scanned: object = field(default=None, repr=False)

    def decode(self):
        """The DecodedResponse (raises DecodeError, cached either way)."""
        return self._once("_decoded", lambda frame: self.codec.decode_response(frame, self.api_key, self.api_version))

    def scan(self) -> ScanResult:
        return self._once("_scanned", lambda frame: self.codec.scan_response(frame, self.api_key, self.api_version))


@dataclass(slots=True, eq=False)
class Exchange:
    """A request and its response, paired by correlation id; acks=0 produces have no response."""

    request: Request
    response: Response | None
    latency: float | None  # seconds from request seen to response seen


@dataclass(slots=True, eq=False)
class Problem:
    """Something the inspector could not follow; the bytes were forwarded all the same.

    kind is one of: decode_error, unknown_api, frame_too_large, tls_on_plaintext,
    unpaired_response, request_timeout, unanswered, inflight_overflow, sasl_tokens.
    """

    connection: ConnectionInfo
    time: float
    kind: str
    direction: str
    detail: str
    api_key: int | None = None
    api_version: int | None = None
    size: int | None = None
