"""One connection's pipeline: each direction framed once, one correlation table, the response transform.

Sans-IO, in the manner of h11: the proxy hands over the bytes it read (`client_data`,
`broker_data`) with the time it read them and gets back an Output: the bytes to send on
and the events. Client bytes are never changed (`forward` is None: send them as read).
Broker bytes are changed only by the plan's ResponseTransform (the address rewrite):
a response it wants is held until whole and sent transformed; every other byte passes.

The common reads (whole frames of a known api, a header like the previous one, a paired
response) are read in C (`_one_frame.c`); the methods here read everything else and are the
reference the C reads are tested against, read by read.

Correlation never depends on inspection. A request's api key, version and correlation id
sit at fixed offsets, so the session pairs and plans every response from them; the rest of
the facts (header, client id, tagged fields) are inspection, and if computing them fails
that direction stops being inspected while pairing and rewriting go on. Only a size
prefix out of range loses a direction's framing.

The protocol's special cases, all here in one place:
- Produce with acks=0 expects no response: its Exchange is emitted at once.
- ApiVersions responses use header v0; a broker that does not support the requested
  version answers with a v0 body and error 35 (KIP-511), decoded as v0.
- After a successful SaslHandshake v0, raw SASL tokens (4-byte length, no Kafka header)
  flow until authentication ends: one exchange for PLAIN and OAUTHBEARER, two for
  SCRAM; for other mechanisms, until a client frame reads as a known request again.
- Unknown api keys or versions are forwarded, reported and still paired.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple

from kinspect.protocol.specs.api_keys import API_VERSIONS, PRODUCE, SASL_HANDSHAKE
from kinspect.protocol.codec import Codec, RequestHeader
from kinspect.protocol.codec.wire_program import optional_extension
from kinspect.protocol.errors import DecodeError, UnknownApiError
from kinspect.protocol.framing.framer import DEFAULT_MAX_FRAME_BYTES, FrameError, FrameTooLarge
from kinspect.protocol.wire.peek import api_versions_body_version, leading_error_code, produce_acks
from kinspect.session.client_software import FIRST_SOFTWARE_VERSION, software_of
from kinspect.session.facts import RequestHeaders, response_header_facts
from kinspect.session.events import ConnectionInfo, Exchange, Problem, Request, Response, frame_bytes
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.framing.stream import HOLD, KEEP_WHOLE, FrameStream
from kinspect.session.plan import Plan

# Raw SASL exchanges (client token, server token) after a v0 handshake, by mechanism.
SASL_RAW_EXCHANGES = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
TLS_HANDSHAKE_PREFIX = b"\x16\x03"
HEAD_BYTES = 512  # what is kept of a frame whose body nobody reads: enough for any header
SLIM_ENTRIES_PER_LIMIT = 64  # in-flight entries without facts kept per inspect.max_inflight, at most
_PREFIX = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")
_RAW = object()  # the ticket of a raw SASL token
# What the session reads of a request that came in pieces (a large Produce; see Plan): its
# header and Produce's Acks, in the first bytes unless its ClientId or TransactionalId is long
# (then the pieces are joined).
_PIECES_HEAD = 4096


def _head(frame) -> bytes:
    """A frame's bytes for the session's own reads: the frame, or a FramePieces' first bytes."""
    return frame.head(_PIECES_HEAD) if type(frame) is FramePieces else frame


def _response_head(frame, header_version: int) -> bytes:
    """What the session reads of a response that may be in pieces (a large Fetch; see Plan): its head, unless
    its header has tagged fields (then it is joined: they may run past the head)."""
    if type(frame) is not FramePieces:
        return frame
    head = frame.head(_PIECES_HEAD)
    return frame.join() if header_version >= 1 and len(head) > 4 and head[4] != 0 else head


def _produce_acks(frame, body_offset: int, version: int, flexible: bool) -> int | None:
    """produce_acks of a request that may be in pieces: read from its head, joined only when a
    long TransactionalId puts the Acks past it."""
    if type(frame) is FramePieces:
        acks = produce_acks(frame.head(_PIECES_HEAD), body_offset, version, flexible)
        if acks is not None:
            return acks
        frame = frame.join()
    return produce_acks(frame, body_offset, version, flexible)


@dataclass
class SessionConfig:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # larger sizes are reported (Kafka's socket.request.max.bytes)
    inspect_max_bytes: int = 1024 * 1024  # frames above this are inspected by their header only
    max_inflight: int = 1000  # unanswered requests kept per connection
    request_timeout: float = 300.0  # seconds an unanswered request is kept


class Output(NamedTuple):
    """What one read gives: the bytes to send on (None: the bytes read, unchanged) and the events."""

    forward: list | None
    events: list


class _Pending:
    """What the response to a request in flight needs: its request's facts and the response's plan."""

    __slots__ = ("api_key", "api_version", "correlation_id", "request", "time", "mode", "mechanism", "forgotten")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, request: Request | None, time: float,
                 mode: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.request = request
        self.time = time
        self.mode = mode
        self.mechanism: str | None = None  # of a SaslHandshake v0
        self.forgotten = False  # its facts were dropped (inspect.max_inflight); the response's plan was kept


_ONE_FRAME: list = []  # the configured kinspect.session._one_frame module, or None, once looked for


def _one_frame_classes() -> tuple:
    """The classes kinspect.session._one_frame reads and makes, in the order its configure() takes them."""
    return (Request, Response, Exchange, _Pending, RequestHeader, Output, FrameStream, RequestHeaders,
            ConnectionInfo, FramePieces, Session)


def _one_frame_module():
    """kinspect.session._one_frame, configured; None where it is not built or KINSPECT_PURE_PYTHON=1."""
    if not _ONE_FRAME:
        module = optional_extension("kinspect.session._one_frame")
        if module is not None:
            try:
                module.configure(_one_frame_classes(), software_of)
            except TypeError:  # a class without the slots it reads: Python reads everything
                module = None
        _ONE_FRAME.append(module)
    return _ONE_FRAME[0]


class Session:
    """Frames, pairs, transforms and reports one client<->broker connection."""

    # The flags every read checks are slots, which the C reads (kinspect/session/_one_frame.c, and the proxy's
    # kinspect/proxy/_forward.c and _batch.c) load at their offsets instead of looking them up by name; the
    # rest lives in the instance dict as before (client_data and broker_data are set per session).
    __slots__ = ("client_framed", "broker_framed", "client_inspected", "broker_inspected", "failures",
                 "_client_seen", "_raw_client", "_raw_broker", "__dict__", "__weakref__")

    def __init__(self, codec: Codec, connection: ConnectionInfo, config: SessionConfig | None = None,
                 plan: Plan | None = None, native: bool = True) -> None:
        """native: the whole frames a read starts with are read in C (kinspect.session._one_frame) where it is
        built; client_data and broker_data below read the rest, and every read the C reads give back, and stay
        the reference."""
        self.codec = codec
        self.connection = connection
        self.config = config = config or SessionConfig()
        self.plan = plan = plan or Plan()
        self.transform = plan.transform
        self._specs = plan.spec_facts  # (api key, version) -> what the specs say, shared by the plan's sessions
        self._requests = FrameStream(self._plan_request, config.max_frame_bytes, config.inspect_max_bytes, HEAD_BYTES)
        self._responses = FrameStream(self._plan_response, config.max_frame_bytes, config.inspect_max_bytes,
                                      HEAD_BYTES, forwarding=plan.transform is not None)
        # A read that falls wholly in the unread rest of a frame kept by its head (a request or a response
        # over inspect_max_bytes) changes nothing but the stream's position: the proxy passes it over here
        # instead of handing it to client_data / broker_data (the same change, without the read).
        self.pass_client = self._requests.pass_over
        self.pass_broker = self._responses.pass_over
        self._headers = RequestHeaders(codec)
        self._inflight: OrderedDict[int, _Pending] = OrderedDict()
        self._remembered: deque[_Pending] = deque()  # entries of _inflight that still hold facts, oldest first
        self._acks_zero: deque[int] = deque(maxlen=64)
        self._raw_client = 0  # raw SASL client tokens still expected (-1: until a request reads again)
        self._raw_broker = 0
        self._raw_turns = 0  # raw client tokens not yet answered by a raw broker token
        self._client_seen = False
        self.client_framed = True  # False once a direction's framing is lost: its bytes pass unread
        self.broker_framed = True
        self.client_inspected = True  # False once computing a direction's facts failed: pairing goes on
        self.broker_inspected = True
        self.failures = 0  # inspection failures (bugs), counted by the proxy
        module = _one_frame_module() if native else None
        if module is not None:
            if plan.one_frame is None:
                plan.one_frame = module.Table()
            reads = module.Reads(self, plan.one_frame, type(self).client_data, type(self).broker_data)
            self.client_data = reads.client_data
            if plan.transform is None:  # responses held for a transform are framed by Python
                self.broker_data = reads.broker_data

    def _one_frame_entry(self, api_key: int, version: int) -> tuple:
        """What the C reads need of an (api key, version), asked once per Plan: (request mode, response mode,
        request header version, response header version, flags, api name)."""
        module = _ONE_FRAME[0]
        spec, name, response_known, response_header, request_header = self._spec_facts(api_key, version)
        flags = module.E_RESPONSE_KNOWN if response_known else 0
        if spec is None or api_key == SASL_HANDSHAKE:
            flags |= module.E_REQUEST_PYTHON  # an unknown api's Problem, a SASL mechanism: read by Python
        else:
            flags |= module.E_REQUEST_KNOWN
            if api_key == PRODUCE:
                flags |= module.E_PRODUCE | (module.E_PRODUCE_FLEXIBLE if version in spec.flexible_versions else 0)
            elif api_key == API_VERSIONS and version >= FIRST_SOFTWARE_VERSION:
                flags |= module.E_SOFTWARE
        return (self.plan.request_mode(api_key, version), self.plan.response_mode(api_key, version), request_header,
                response_header, flags, name)

    @property
    def inflight(self) -> int:
        """Requests not yet answered, a response under way included."""
        return len(self._inflight) + (type(self._responses.in_progress) is _Pending)

    @property
    def buffered(self) -> tuple[int, int]:
        """Bytes of an unfinished frame held per direction (client, broker)."""
        return self._requests.buffered, self._responses.buffered

    def awaits(self, first: bytes) -> bool:
        """Whether a broker frame starting with these bytes would be paired (or read as a raw SASL token) now."""
        if self._raw_broker:
            return self._raw_turns > 0  # a server token answers a client token
        return len(first) >= 4 and _CORRELATION.unpack_from(first)[0] in self._inflight

    def _problem(self, now: float, kind: str, direction: str, detail: str, **extra) -> Problem:
        return Problem(self.connection, now, kind, direction, detail, **extra)

    # ------------------------------------------------------------------ client -> broker

    def client_data(self, data, now: float) -> Output:
        """Client bytes as read: they pass unchanged; the events they complete."""
        if not self.client_framed:
            return Output(None, [])
        events: list = []
        if not self._client_seen and data:
            self._client_seen = True
            if bytes(data[:2]) == TLS_HANDSHAKE_PREFIX:
                self.client_framed = self.client_inspected = False
                return Output(None, [self._problem(now, "tls_on_plaintext", "request",
                                                   "the client opened with a TLS ClientHello on a plaintext listener")])
        failure = None
        try:
            _, frames = self._requests.feed(data)
        except FrameError as exc:
            # Frames completed before the bad size are still seen, whatever the TCP segmentation.
            self.client_framed = False
            frames, failure = exc.frames, self._frame_problem(exc, "request", now)
        for offset, size, frame, complete, ticket, _ in frames:
            if ticket is _RAW:
                events.append(self._problem(now, "sasl_tokens", "request", "raw SASL token", size=size, offset=offset))
                continue
            self._request(offset, size, frame, complete, ticket, now, events)
        if failure is not None:
            events.append(failure)
        return Output(None, events)

    def _plan_request(self, first: bytes, size: int):
        """Called as each client frame's first bytes arrive: raw SASL token, or a request to keep whole or by head."""
        if self._raw_client:
            if self._raw_client > 0:
                self._raw_client -= 1
                self._raw_turns += 1
                return 0, _RAW
            # A mechanism of unknown length: raw until a frame reads as a known request again.
            if len(first) < 8 or not self._known(*_PREFIX.unpack_from(first)[:2], "request"):
                self._raw_turns += 1
                return 0, _RAW
            self._raw_client = self._raw_broker = 0
        if len(first) < 8:
            return KEEP_WHOLE, None
        api_key, version, correlation_id = _PREFIX.unpack_from(first)
        return self.plan.request_mode(api_key, version), (api_key, version, correlation_id)

    def _spec_facts(self, api_key: int, version: int) -> tuple:
        """(request spec or None, api name, response known, response header version, request header version),
        once per (api, version); an api the specs do not know has request header v1 (as the codec reads it)."""
        key = (api_key, version)
        facts = self._specs.get(key)
        if facts is None:
            registry = self.codec.registry
            known = registry.message(api_key, "response", version) is not None
            try:
                request_header = self.codec.request_header_version(api_key, version)
            except UnknownApiError:
                request_header = 1
            facts = (registry.message(api_key, "request", version), registry.api_name(api_key), known,
                     self.codec.response_header_version(api_key, version) if known else 0, request_header)
            if len(self._specs) < 4096:  # versions a client invents must not grow it forever
                self._specs[key] = facts
        return facts

    def _known(self, api_key: int, version: int, direction: str) -> bool:
        return self.codec.registry.message(api_key, direction, version) is not None

    def _request(self, offset: int, size: int, frame: bytes, complete: bool, prefix, now: float, events: list) -> None:
        if prefix is None:
            events.append(self._problem(now, "decode_error", "request",
                                        f"a request of {size} bytes is shorter than the 8-byte header prefix", size=size,
                                        offset=offset))
            return
        api_key, version, correlation_id = prefix
        request = None
        expects_response = True
        mechanism = None
        if self.client_inspected:
            try:
                request, expects_response, mechanism = self._inspect_request(offset, size, frame, complete, prefix, now,
                                                                             events)
            except Exception as exc:  # noqa: BLE001 (a bug in inspection must not stop pairing)
                self._inspection_failed("request", exc, now, events)
        elif api_key == PRODUCE and self._known(api_key, version, "request"):
            expects_response = self._acks(frame, version) != 0
        if not expects_response:
            self._acks_zero.append(correlation_id)
            if request is not None:
                events.append(Exchange(request, None, None))
            return
        pending = _Pending(api_key, version, correlation_id, request, now, self.plan.response_mode(api_key, version))
        pending.mechanism = mechanism
        self._forget_beyond_limit(now, events)
        self._inflight[correlation_id] = pending
        self._remembered.append(pending)

    def _forget_beyond_limit(self, now: float, events: list) -> None:
        """Past inspect.max_inflight, the oldest request's facts are dropped; what its response needs is kept
        (a few bytes: the rewrite must not depend on an inspection limit), up to a hard bound."""
        limit = self.config.max_inflight
        remembered = self._remembered
        if len(remembered) < limit:
            return
        while remembered and (remembered[0].forgotten or self._inflight.get(remembered[0].correlation_id)
                              is not remembered[0]):
            remembered.popleft()  # answered or swept since
        if len(remembered) >= limit:
            dropped = remembered.popleft()
            dropped.forgotten, dropped.request = True, None
            events.append(self._problem(
                now, "inflight_overflow", "request",
                f"more than {limit} requests in flight: forgot correlation id {dropped.correlation_id}",
                api_key=dropped.api_key, api_version=dropped.api_version))
        if len(self._inflight) >= SLIM_ENTRIES_PER_LIMIT * limit:  # a client that never waits: bound memory
            _, dropped = self._inflight.popitem(last=False)
            if not dropped.forgotten:
                events.append(self._problem(
                    now, "inflight_overflow", "request",
                    f"more than {limit} requests in flight: forgot correlation id {dropped.correlation_id}",
                    api_key=dropped.api_key, api_version=dropped.api_version))

    def _acks(self, frame, version: int) -> int | None:
        """A Produce's acks while this direction is not inspected (pairing needs it); None if it cannot be read
        (a header longer than a FramePieces' head included)."""
        try:
            header = self.codec.decode_request_header(_head(frame))
        except Exception:  # noqa: BLE001 (inspection is broken here: pair as if a response will come)
            return None
        return _produce_acks(frame, header.size, version, self.codec.is_flexible(PRODUCE, "request", version))

    def _inspect_request(self, offset, size, frame, complete, prefix, now, events):
        """The request's facts: its header, its event, whether it expects a response, a SASL mechanism."""
        api_key, version, correlation_id = prefix
        codec = self.codec
        known, name, _, _, header_version = self._spec_facts(api_key, version)
        head = _head(frame)  # a FramePieces is read in place by the scanner; the session reads its head
        try:
            try:
                header, tag_bytes, tags = self._headers.read(head, api_key, version, correlation_id, header_version)
            except DecodeError:
                if head is frame or len(head) == size:
                    raise
                head = frame.join()  # a header longer than the head
                header, tag_bytes, tags = self._headers.read(head, api_key, version, correlation_id, header_version)
        except DecodeError as exc:
            # No api named: what the prefix says cannot be trusted when the header does not read.
            events.append(self._problem(now, "decode_error", "request", str(exc), size=size, offset=offset))
            return None, True, None
        if known is None:
            events.append(self._problem(
                now, "unknown_api", "request", f"api key {api_key} version {version} is not in the specs",
                api_key=api_key, api_version=version, size=size))
        if header.client_id is not None:
            self.connection.client_id = header.client_id
        request = Request(self.connection, now, offset, header, name, known is not None,
                          tag_bytes, tags, size, frame, complete, codec)
        mechanism = None
        if known is not None:
            if api_key == PRODUCE:
                acks = _produce_acks(frame, header.size, version, version in known.flexible_versions)
                request.expects_response = acks != 0
            elif api_key == SASL_HANDSHAKE and version == 0:
                try:
                    mechanism = request.decode().body.get("Mechanism", "")
                except DecodeError:
                    pass
            elif api_key == API_VERSIONS and version >= FIRST_SOFTWARE_VERSION and complete:
                # KIP-511: the client names its software; read from the bytes so that invalid UTF-8 is shown.
                name, software_version = software_of(frame, header.size)
                if name is not None or software_version is not None:
                    self.connection.client_software_name = name
                    self.connection.client_software_version = software_version
        events.append(request)
        return request, request.expects_response, mechanism

    # ------------------------------------------------------------------ broker -> client

    def broker_data(self, data, now: float) -> Output:
        """Broker bytes as read: what to send the client (held responses transformed) and the events."""
        if not self.broker_framed:
            return Output(None, [])
        failure = None
        try:
            forward, frames = self._responses.feed(data)
        except FrameError as exc:
            self.broker_framed = False
            forward, frames, failure = getattr(exc, "forward", None), exc.frames, self._frame_problem(exc, "response", now)
        events: list = []
        held: list = []
        for offset, size, frame, complete, ticket, mode in frames:
            if ticket is _RAW:
                events.append(self._problem(now, "sasl_tokens", "response", "raw SASL token", size=size, offset=offset))
                continue
            out = self._response(offset, size, frame, complete, ticket, mode, now, events)
            if mode == HOLD:
                held.append(out)
        if failure is not None:
            events.append(failure)
        if forward is not None and held:
            sends = iter(held)
            spliced: list = []
            for chunk in forward:
                if chunk is None:
                    spliced += next(sends)  # a held frame: its new size prefix, then its bytes (no joining copy)
                else:
                    spliced.append(chunk)
            forward = spliced
        return Output(forward, events)

    def broker_ended(self) -> bytes:
        """The broker closed its side: what was received of an unfinished frame and not yet sent, to send now."""
        self.broker_framed = False
        return self._responses.end()

    def _plan_response(self, first: bytes, size: int):
        """Called as each broker frame's first bytes arrive: pair it, and keep, hold or pass it as planned."""
        if self._raw_broker:
            if self._raw_broker > 0:
                self._raw_broker -= 1
            self._raw_turns = max(0, self._raw_turns - 1)
            return 0, _RAW
        if len(first) < 4:
            return 0, None
        pending = self._inflight.pop(_CORRELATION.unpack_from(first)[0], None)
        if pending is None:
            return 0, None
        remembered = self._remembered
        if remembered and remembered[0] is pending:  # answers come in order: the oldest is the one answered
            remembered.popleft()
        return pending.mode, pending

    def _response(self, offset, size, frame, complete, pending: _Pending | None, mode, now, events):
        """Report one response; return the chunks to send for a held one (size prefix, frame)."""
        if pending is None:
            if len(frame) < 4:
                events.append(self._problem(now, "decode_error", "response",
                                            f"a {size}-byte response has no correlation id", size=size, offset=offset,
                                            frame=frame))
                return None
            correlation_id = _CORRELATION.unpack_from(frame)[0]
            why = ("answers a Produce with acks=0, which expects no response" if correlation_id in self._acks_zero
                   else "matches no request in flight")
            events.append(self._problem(now, "unpaired_response", "response",
                                        f"correlation id {correlation_id} {why}", size=size, offset=offset, frame=frame))
            return None
        out = frame
        if pending.forgotten:
            events.append(self._problem(
                now, "unpaired_response", "response",
                f"correlation id {pending.correlation_id}: its request was forgotten (inspect.max_inflight)",
                size=size, offset=offset, frame=frame_bytes(frame)))
        if mode == HOLD:
            try:
                out = self.transform.apply(frame, pending.api_key, pending.api_version)
            except Exception as exc:  # noqa: BLE001 (nothing may break the stream: the response goes on as it came)
                events.append(self._problem(
                    now, "transform_failed", "response",
                    f"could not rewrite a response of api {pending.api_key} v{pending.api_version}: "
                    f"{type(exc).__name__}: {exc}", api_key=pending.api_key, api_version=pending.api_version, size=size))
            # a new size prefix, then the bytes (a transform may answer with pieces: no joining copy)
            if type(out) is tuple:
                out = (_CORRELATION.pack(sum(map(len, out))), *out)
            else:
                out = (_CORRELATION.pack(len(out)), out)
        if self.broker_inspected and not pending.forgotten:
            if size > self.config.inspect_max_bytes:  # held whole for the transform; observers get its head
                frame, complete = frame[:HEAD_BYTES], False
            try:
                self._inspect_response(offset, size, frame, complete, pending, now, events)
            except Exception as exc:  # noqa: BLE001
                self._inspection_failed("response", exc, now, events)
        return out

    def _inspect_response(self, offset, size, frame, complete, pending: _Pending, now, events) -> None:
        api_key, version = pending.api_key, pending.api_version
        codec = self.codec
        _, name, known, header_version, _ = self._spec_facts(api_key, version)
        head = _response_head(frame, header_version)
        header_size, tag_bytes, tags = response_header_facts(head, header_version)
        body_version = api_versions_body_version(head, version, header_size) if api_key == API_VERSIONS else version
        response = Response(self.connection, now, offset, api_key, name, known,
                            body_version, version, pending.correlation_id, header_version, header_size, tag_bytes,
                            tags, size, frame, complete, codec)
        events.append(response)
        if pending.request is not None:
            events.append(Exchange(pending.request, response, now - pending.time))
        if pending.mechanism is not None and leading_error_code(head, header_size) == 0:
            exchanges = SASL_RAW_EXCHANGES.get(pending.mechanism.upper(), -1)
            self._raw_client = exchanges
            self._raw_broker = exchanges if exchanges > 0 else -1

    # ------------------------------------------------------------------ housekeeping

    def _inspection_failed(self, direction: str, exc: Exception, now: float, events: list) -> None:
        self.failures += 1
        if direction == "request":
            self.client_inspected = False
        else:
            self.broker_inspected = False
        events.append(self._problem(now, "inspection_failed", direction,
                                    f"{type(exc).__name__}: {exc}; this direction's facts are no longer computed "
                                    "(pairing and rewriting go on)"))

    def _frame_problem(self, exc: FrameError, direction: str, now: float) -> Problem:
        kind = "frame_too_large" if isinstance(exc, FrameTooLarge) else "decode_error"
        size = exc.size if isinstance(exc, FrameTooLarge) else None
        return self._problem(now, kind, direction, f"{exc}; this direction is no longer inspected", size=size)

    def sweep(self, now: float) -> list:
        """Forget requests unanswered for longer than the timeout."""
        events = []
        limit = now - self.config.request_timeout
        while self._inflight:
            correlation_id, pending = next(iter(self._inflight.items()))
            if pending.time > limit:
                break
            del self._inflight[correlation_id]
            if pending.forgotten:  # reported when its facts were dropped
                continue
            events.append(self._problem(
                now, "request_timeout", "request",
                f"no response to correlation id {correlation_id} after {self.config.request_timeout:g} s",
                api_key=pending.api_key, api_version=pending.api_version))
        return events

    def close(self, now: float) -> list:
        """The connection ended: requests still in flight will not be answered."""
        pending = [p for p in self._inflight.values() if not p.forgotten]
        cut = self._responses.in_progress
        if type(cut) is _Pending and not cut.forgotten:  # its response had begun
            pending.insert(0, cut)
        events = [
            self._problem(now, "unanswered", "request",
                          f"connection closed before correlation id {p.correlation_id} was answered",
                          api_key=p.api_key, api_version=p.api_version)
            for p in pending
        ]
        self._inflight.clear()
        self._remembered.clear()
        return events
