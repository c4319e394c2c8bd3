"""The events a session emits for observers: requests, responses, exchanges and problems.

Each event carries facts the session computed once, as it framed the bytes (api, version,
correlation id, header version, size and tagged fields, sizes, whether the whole frame
was kept). Observers read these facts and never parse bytes themselves. The body is
scanned or decoded only when an observer asks, once, with the session's codec; the
outcome (value or DecodeError) is cached on the event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.codec.codec import DECODE_FAILURES
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.framing.pieces import FramePieces, frame_bytes
from kinspect.protocol.codec.scan_result import ScanResult


@dataclass(slots=True)
class ConnectionInfo:
    """Who is talking: the client address, the broker it reaches, and what the client said of itself."""

    id: int
    client_address: str
    broker: str
    node_id: int | None = None
    client_id: str | None = None
    client_software_name: str | None = None  # KIP-511, from ApiVersions v3+ (sanitized)
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
            # Its old traceback dropped: each raise of one exception object would lengthen it.
            raise outcome.with_traceback(None)
        return outcome

    def adopt_scan(self, scan: ScanResult) -> None:
        """Take the scan of a frame whose scanned bytes equal this one's (an observer's memo of
        repeated bodies), so that every observer asking for this event's scan gets it without a scan."""
        self._scanned = scan

    def _complete_frame(self) -> bytes:
        if self.frame is None:
            raise DecodeError(f"the {self.size}-byte frame was released once its request was observed (its scan kept "
                              "its facts)", api_key=self.api_key, version=self.api_version)
        if not self.complete:
            raise DecodeError(
                f"the {self.size}-byte frame was larger than the inspection limit; only its header was kept",
                api_key=self.api_key, version=self.api_version,
            )
        return frame_bytes(self.frame)


@dataclass(slots=True, eq=False)
class Request(_Lazy):
    """A request frame and the facts of its header."""

    connection: ConnectionInfo
    time: float
    offset: int  # stream offset of the frame's size prefix (client to broker bytes)
    header: RequestHeader
    api_name: str | None  # None for an api the specs do not know
    known: bool  # whether the specs define this api at this version
    header_tag_bytes: int  # bytes of the header's tag section (count included); 0 below header v2
    header_tags: tuple  # (tag, data size) of each tagged field of the header
    size: int  # frame size, without the 4-byte size prefix
    frame: bytes | None  # the whole frame when complete (a large Produce: its FramePieces), else its head;
    # None once released (release_frame)
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

    @property
    def client_id(self) -> str | None:
        return self.header.client_id

    @property
    def header_version(self) -> int:
        return self.header.version

    @property
    def header_size(self) -> int:
        return self.header.size

    def decode(self):
        """The DecodedRequest (raises DecodeError, cached either way)."""
        return self._once("_decoded", self.codec.decode_request)

    def release_frame(self) -> None:
        """Let go of a large frame's bytes once every observer has seen this request (the Dispatcher calls it).

        Only a frame kept in the reads that brought it (a large Produce, FramePieces). Its scan, if
        made, keeps its facts (its record batches summarized now, if they were not), and the event
        waits for its response without holding the reads. Held, a megabyte of reads per Produce in
        flight kept the allocator from reusing them: each read then landed on fresh, cold memory
        (26 page faults per MB forwarded against 5). A decode, or a first scan, after this raises
        DecodeError saying the frame was released.
        """
        if type(self.frame) is not FramePieces:
            return
        scan = self._scanned
        if type(scan) is ScanResult:
            if scan.record_spans:
                scan.records  # noqa: B018 (summarized from the pieces while they are here)
            scan.source = None
        self.frame = None

    def scan(self) -> ScanResult:
        scanned = self._scanned
        if type(scanned) is ScanResult:  # the common case, asked by every observer after the first: no call
            return scanned
        # The first ask: _once's steps, inline. The frame is not held in a local: a DecodeError's
        # traceback (cached on the event) would keep a large request's reads alive past release_frame.
        if scanned is None and self.complete and (type(self.frame) is bytes or type(self.frame) is FramePieces):
            # Codec.scan_request's C scan, called directly once it made it (a small frame, or a large Produce
            # in its reads, which the C scan reads in place); a failure is left to scan_request below, which
            # scans again and raises the DecodeError that says where.
            header = self.header
            codec = self.codec
            fast = codec.fast_scans.get((header.api_key, header.api_version, True))
            if fast is not None:
                try:
                    scanned = self._scanned = fast[0](self.frame, header.size, fast[1] if codec.integer_facts else None,
                                                      fast[2], True)
                    return scanned
                except DECODE_FAILURES:
                    pass
        if scanned is None and self.complete and self.frame is not None:
            try:
                scanned = self._scanned = self.codec.scan_request(self.frame, self.header)
            except DecodeError as exc:
                self._scanned = exc
                raise
            return scanned
        return self._once("_scanned", self._scan_frame)

    def _scan_frame(self, frame: bytes) -> ScanResult:
        return self.codec.scan_request(frame, self.header)


@dataclass(slots=True, eq=False)
class Response(_Lazy):
    """A response frame, paired with its request, and the facts of its header."""

    connection: ConnectionInfo
    time: float
    offset: int  # stream offset of the frame's size prefix (broker to client bytes)
    api_key: int
    api_name: str | None
    known: bool
    api_version: int  # the version the body is read at (0 for KIP-511's fallback)
    request_version: int
    correlation_id: int
    header_version: int
    header_size: int
    header_tag_bytes: int  # bytes of the header's tag section (count included); 0 for header v0
    header_tags: tuple
    size: int
    frame: bytes  # the whole frame when complete (a large Fetch: its FramePieces), else its head
    complete: bool
    codec: Codec = field(repr=False)
    _decoded: object = field(default=None, repr=False)
    _scanned: object = field(default=None, repr=False)

    def decode(self):
        """The DecodedResponse (raises DecodeError, cached either way)."""
        return self._once("_decoded", lambda frame: self.codec.decode_response(frame, self.api_key, self.api_version))

    def scan(self) -> ScanResult:
        scanned = self._scanned
        if type(scanned) is ScanResult:
            return scanned
        frame = self.frame
        if scanned is None and self.complete and (type(frame) is bytes or type(frame) is FramePieces):
            # The first ask (every response the metrics' memo does not know): _once's steps, inline; a
            # FramePieces is scanned in place, never joined. Once the codec made the C scan of this body, a
            # small response whose header need not be read again goes straight to it; a failure is left to
            # the codec, which scans again and raises the DecodeError that says where.
            header_end = self._header_end(frame)
            codec = self.codec
            fast = codec.fast_scans.get((self.api_key, self.api_version, False)) if header_end else None
            if fast is not None and type(frame) is bytes:
                try:
                    scanned = self._scanned = fast[0](frame, header_end, fast[1] if codec.integer_facts else None,
                                                      fast[2], False)
                    return scanned
                except DECODE_FAILURES:
                    pass
            try:
                scanned = self._scanned = codec.scan_response(frame, self.api_key, self.api_version, header_end)
            except DecodeError as exc:
                self._scanned = exc
                raise
            return scanned
        return self._once("_scanned", self._scan_frame)

    def _scan_frame(self, frame) -> ScanResult:
        return self.codec.scan_response(frame, self.api_key, self.api_version, self._header_end(frame))

    def _header_end(self, frame) -> int | None:
        """Where the header ends when the session read it whole: v0 after the correlation id, v1 whose tag
        section is empty (one zero byte) after that byte. None: the codec reads the header again (and fails
        a malformed one)."""
        if self.header_version == 0 and self.size >= 4:
            return 4
        if self.header_size == 5 and self.size > 4 and (frame if type(frame) is bytes else frame.head(5))[4] == 0:
            return 5
        return None


@dataclass(slots=True, eq=False)
class Exchange:
    """A request and its response, paired by correlation id; acks=0 produces have no response."""

    request: Request
    response: Response | None
    latency: float | None  # seconds from the read that completed the request to the one that completed the response


@dataclass(slots=True, eq=False)
class Problem:
    """Something the inspector could not follow; the bytes were forwarded all the same.

    kind is one of: decode_error, unknown_api, frame_too_large, tls_on_plaintext,
    unpaired_response, request_timeout, unanswered, inflight_overflow, sasl_tokens,
    inspection_failed, transform_failed.
    """

    connection: ConnectionInfo
    time: float
    kind: str
    direction: str
    detail: str
    api_key: int | None = None
    api_version: int | None = None
    size: int | None = None
    offset: int | None = None  # stream offset of the frame's size prefix, where one frame is concerned
    frame: bytes | None = field(default=None, repr=False)  # an unpaired response's bytes (whole or head)
