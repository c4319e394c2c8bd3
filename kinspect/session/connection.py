"""One connection's inspection state: framing both directions, correlation, the protocol's special cases.

Sans-IO: the proxy hands over bytes as they cross (`client_data`, `broker_data`) with
the time it saw them, and gets events back. Nothing here can stop or alter the stream:
whatever cannot be followed becomes a Problem event, and a direction whose framing is
lost (a bad size prefix) is no longer inspected while its bytes keep flowing.

The special cases, all here in one place:
- Produce with acks=0 expects no response: its Exchange is emitted at once.
- ApiVersions responses use header v0; a broker that does not support the requested
  version answers with a v0 body and error 35 (KIP-511), decoded as v0.
- After a successful SaslHandshake v0, raw SASL tokens (4-byte length, no Kafka header)
  flow until authentication ends: one exchange for PLAIN and OAUTHBEARER, two for
  SCRAM; for other mechanisms, until a client frame reads as a known request again.
- Unknown api keys or versions are forwarded, reported and still paired.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.framer import DEFAULT_MAX_FRAME_BYTES, FrameError, FrameSplitter, FrameTooLarge
from kinspect.protocol.peek import leading_error_code, produce_acks, tag_section_fields
from kinspect.protocol.primitives import Malformed
from kinspect.session.client_software import FIRST_SOFTWARE_VERSION, software_of
from kinspect.session.events import ConnectionInfo, Exchange, Problem, Request, Response

PRODUCE, SASL_HANDSHAKE, API_VERSIONS = 0, 17, 18
UNSUPPORTED_VERSION = 35
# Raw SASL exchanges (client token, server token) after a v0 handshake, by mechanism.
SASL_RAW_EXCHANGES = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
TLS_HANDSHAKE_PREFIX = b"\x16\x03"


@dataclass
class SessionConfig:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # larger sizes are reported (Kafka's socket.request.max.bytes)
    inspect_max_bytes: int = 1024 * 1024  # frames above this are inspected by their header only
    max_inflight: int = 1000  # unanswered requests kept per connection
    request_timeout: float = 300.0  # seconds an unanswered request is kept


class Session:
    """Frames, pairs and reports one client<->broker connection."""

    def __init__(self, codec: Codec, connection: ConnectionInfo, config: SessionConfig | None = None) -> None:
        self.codec = codec
        self.connection = connection
        self.config = config = config or SessionConfig()
        self._requests = FrameSplitter(config.max_frame_bytes, config.inspect_max_bytes)
        self._responses = FrameSplitter(config.max_frame_bytes, config.inspect_max_bytes)
        self._inflight: OrderedDict[int, Request] = OrderedDict()
        self._acks_zero: deque[int] = deque(maxlen=64)
        self._handshakes: dict[int, str] = {}  # correlation id -> mechanism of a v0 SaslHandshake
        self._raw_client = 0  # raw SASL client tokens still expected (-1: until a request reads again)
        self._raw_broker = 0
        self._client_seen = False
        self.client_inspected = True
        self.broker_inspected = True

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def _problem(self, now: float, kind: str, direction: str, detail: str, **extra) -> Problem:
        return Problem(self.connection, now, kind, direction, detail, **extra)

    # ------------------------------------------------------------------ client -> broker

    def client_data(self, data: bytes, now: float) -> list:
        if not self.client_inspected:
            return []
        events: list = []
        if not self._client_seen and data:
            self._client_seen = True
            if bytes(data[:2]) == TLS_HANDSHAKE_PREFIX:
                self.client_inspected = False
                return [self._problem(now, "tls_on_plaintext", "request",
                                      "the client opened with a TLS ClientHello on a plaintext listener")]
        failure = None
        try:
            frames = self._requests.feed(data)
        except FrameError as exc:
            # Frames completed before the bad size are still seen, whatever the TCP segmentation.
            self.client_inspected = False
            frames, failure = exc.frames, self._frame_problem(exc, "request", now)
        for size, frame, complete in frames:
            if self._raw_client > 0:
                self._raw_client -= 1
                events.append(self._problem(now, "sasl_tokens", "request", "raw SASL token", size=size))
                continue
            if self._raw_client < 0:  # a mechanism of unknown length: raw until a request reads again
                if not self._reads_as_request(frame):
                    events.append(self._problem(now, "sasl_tokens", "request", "raw SASL token", size=size))
                    continue
                self._raw_client = self._raw_broker = 0
            events.extend(self._request(size, frame, complete, now))
        if failure is not None:
            events.append(failure)
        return events

    def _reads_as_request(self, frame: bytes) -> bool:
        try:
            header = self.codec.decode_request_header(frame)
        except DecodeError:
            return False
        return self.codec.registry.message(header.api_key, "request", header.api_version) is not None

    def _request(self, size: int, frame: bytes, complete: bool, now: float) -> list:
        try:
            header: RequestHeader = self.codec.decode_request_header(frame)
        except DecodeError as exc:
            return [self._problem(now, "decode_error", "request", str(exc), size=size)]
        events: list = []
        codec = self.codec
        known = codec.registry.message(header.api_key, "request", header.api_version)
        if known is None:
            events.append(self._problem(
                now, "unknown_api", "request", f"api key {header.api_key} version {header.api_version} is not in the specs",
                api_key=header.api_key, api_version=header.api_version, size=size))
        if header.client_id is not None:
            self.connection.client_id = header.client_id
        if header.api_key == API_VERSIONS and header.api_version >= FIRST_SOFTWARE_VERSION and complete and known:
            # KIP-511: the client names its software; read once per ApiVersions (a small body), kept sanitized.
            # A version the specs lack may be laid out otherwise: not read.
            name, version = software_of(frame, header.size)
            if name is not None or version is not None:
                self.connection.client_software_name = name
                self.connection.client_software_version = version
        request = Request(self.connection, now, header, codec.registry.api_name(header.api_key), size, frame,
                          complete, codec)
        if known is not None and header.api_key == PRODUCE:
            acks = produce_acks(frame, header.size, header.api_version, header.api_version in known.flexible_versions)
            request.expects_response = acks != 0
        if known is not None and header.api_key == SASL_HANDSHAKE and header.api_version == 0:
            try:
                self._handshakes[header.correlation_id] = request.decode().body.get("Mechanism", "")
            except DecodeError:
                pass
        events.append(request)
        if not request.expects_response:
            self._acks_zero.append(header.correlation_id)
            events.append(Exchange(request, None, None))
            return events
        if len(self._inflight) >= self.config.max_inflight:
            _, dropped = self._inflight.popitem(last=False)
            events.append(self._problem(
                now, "inflight_overflow", "request",
                f"more than {self.config.max_inflight} requests in flight: forgot correlation id {dropped.correlation_id}",
                api_key=dropped.api_key, api_version=dropped.api_version))
        self._inflight[header.correlation_id] = request
        return events

    # ------------------------------------------------------------------ broker -> client

    def broker_data(self, data: bytes, now: float) -> list:
        if not self.broker_inspected:
            return []
        failure = None
        try:
            frames = self._responses.feed(data)
        except FrameError as exc:
            self.broker_inspected = False
            frames, failure = exc.frames, self._frame_problem(exc, "response", now)
        events: list = []
        for size, frame, complete in frames:
            if self._raw_broker:
                if self._raw_broker > 0:
                    self._raw_broker -= 1
                events.append(self._problem(now, "sasl_tokens", "response", "raw SASL token", size=size))
                continue
            events.extend(self._response(size, frame, complete, now))
        if failure is not None:
            events.append(failure)
        return events

    def _response(self, size: int, frame: bytes, complete: bool, now: float) -> list:
        if len(frame) < 4:
            return [self._problem(now, "decode_error", "response", f"a {size}-byte response has no correlation id", size=size)]
        correlation_id = int.from_bytes(frame[:4], "big", signed=True)
        request = self._inflight.pop(correlation_id, None)
        if request is None:
            why = ("answers a Produce with acks=0, which expects no response" if correlation_id in self._acks_zero
                   else "matches no request in flight")
            return [self._problem(now, "unpaired_response", "response", f"correlation id {correlation_id} {why}", size=size)]
        api_key, version = request.api_key, request.api_version
        known = self.codec.registry.message(api_key, "response", version) is not None
        header_version = self.codec.response_header_version(api_key, version) if known else 0
        body_version = version
        if api_key == API_VERSIONS and version > 0:
            if leading_error_code(frame, self._header_size(frame, header_version)) == UNSUPPORTED_VERSION:
                body_version = 0  # KIP-511: the broker answered with a v0 body
        response = Response(self.connection, now, api_key, request.api_name, body_version, version, correlation_id,
                            header_version, size, frame, complete, self.codec)
        events: list = [response, Exchange(request, response, now - request.time)]
        mechanism = self._handshakes.pop(correlation_id, None)
        if mechanism is not None and leading_error_code(frame, self._header_size(frame, header_version)) == 0:
            exchanges = SASL_RAW_EXCHANGES.get(mechanism.upper(), -1)
            self._raw_client = exchanges
            self._raw_broker = exchanges if exchanges > 0 else -1
        return events

    @staticmethod
    def _header_size(frame: bytes, header_version: int) -> int:
        if header_version == 0:
            return 4
        try:
            return tag_section_fields(frame, 4)[1]
        except (IndexError, Malformed):
            return len(frame)

    # ------------------------------------------------------------------ housekeeping

    def _frame_problem(self, exc: FrameError, direction: str, now: float) -> Problem:
        kind = "frame_too_large" if isinstance(exc, FrameTooLarge) else "decode_error"
        size = exc.size if isinstance(exc, FrameTooLarge) else None
        return self._problem(now, kind, direction, f"{exc}; this direction is no longer inspected", size=size)

    def sweep(self, now: float) -> list:
        """Forget requests unanswered for longer than the timeout."""
        events = []
        limit = now - self.config.request_timeout
        while self._inflight:
            correlation_id, request = next(iter(self._inflight.items()))
            if request.time > limit:
                break
            del self._inflight[correlation_id]
            events.append(self._problem(
                now, "request_timeout", "request",
                f"no response to correlation id {correlation_id} after {self.config.request_timeout:g} s",
                api_key=request.api_key, api_version=request.api_version))
        return events

    def close(self, now: float) -> list:
        """The connection ended: requests still in flight will not be answered."""
        events = [
            self._problem(now, "unanswered", "request", f"connection closed before correlation id {cid} was answered",
                          api_key=r.api_key, api_version=r.api_version)
            for cid, r in self._inflight.items()
        ]
        self._inflight.clear()
        return events
