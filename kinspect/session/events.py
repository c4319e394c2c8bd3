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

    # TEMPORARY fact shim (lead replaces)
    @property
    def client_id(self) -> str | None:
        return self.header.client_id

    @property
    def header_version(self) -> int:
        return self.header.version

    @property
    def header_size(self) -> int:
        return self.header.size

    @property
    def header_tag_bytes(self) -> int:
        if self.header.version < 2:
            return 0
        client_id_length = int.from_bytes(self.frame[8:10], "big", signed=True)  # int16 length, always
        return self.header.size - 10 - max(0, client_id_length)

    @property
    def header_tags(self) -> tuple:
        return tuple((tag, len(data)) for tag, data in self.header.fields.get("_unknown_tagged_fields") or ())
    # end of TEMPORARY fact shim

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

    # TEMPORARY fact shim (lead replaces)
    def _header_facts(self) -> tuple:
        if self.header_version < 1:
            return 4, 0, ()
        if len(self.frame) > 4 and self.frame[4] == 0:  # an empty tag section
            return 5, 1, ()
        from kinspect.protocol.peek import tag_section_fields
        from kinspect.protocol.primitives import Malformed

        try:
            fields, size = tag_section_fields(self.frame, 4)
        except (IndexError, Malformed):
            fields, size = (), min(len(self.frame), 5)
        return size, size - 4, tuple(fields)

    @property
    def header_size(self) -> int:
        return self._header_facts()[0]

    @property
    def header_tag_bytes(self) -> int:
        return self._header_facts()[1]

    @property
    def header_tags(self) -> tuple:
        return self._header_facts()[2]
    # end of TEMPORARY fact shim


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
