"""The codec: frames of any api and version to fields and back, compiled once per version.

`Codec.decode_request(frame)` and `Codec.decode_response(frame, api_key, version)` take
one frame without its 4-byte size prefix; offsets in errors count from the frame's
first byte. Bodies are dicts keyed by the spec's field names: only the fields of that
version, tagged fields only when they were on the wire, and tagged fields that no spec
names under `_unknown_tagged_fields` as (tag, bytes) so that they re-encode in place.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Callable

from kinspect.protocol.specs.api_keys import API_VERSIONS, CONTROLLED_SHUTDOWN
from kinspect.protocol.codec import codegen
from kinspect.protocol.codec.runtime import namespace
from kinspect.protocol.errors import DecodeError, EncodeError, SpecError, UnknownApiError
from kinspect.protocol.framing.pieces import frame_bytes
from kinspect.protocol.wire.primitives import Malformed
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.protocol.specs.model import MessageSpec
from kinspect.protocol.specs.registry import SpecRegistry
from kinspect.protocol.codec.wire_program import build_program, native_module


# Everything a generated decoder can raise on bad bytes; all become DecodeError.
DECODE_FAILURES = (Malformed, struct.error, IndexError, ValueError, OverflowError, MemoryError, RecursionError)
_ENCODE_FAILURES = (struct.error, TypeError, AttributeError, ValueError, OverflowError, KeyError)
_PREFIX = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")


def request_header_version(api_key: int, api_version: int, flexible: bool) -> int:
    """Request header v2 for flexible versions, v1 otherwise; ControlledShutdown v0 uses v0."""
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    return 2 if flexible else 1


def response_header_version(api_key: int, flexible: bool) -> int:
    """Response header v1 for flexible versions, v0 otherwise; ApiVersions always uses v0 (KIP-511)."""
    if api_key == API_VERSIONS:
        return 0
    return 1 if flexible else 0


def _compile(generated: codegen.Generated, entry: str, label: str) -> Callable:
    ns = namespace()
    ns.update(generated.constants)
    try:
        code = compile(generated.source, f"<kinspect {label}>", "exec")
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise SpecError(f"{label}: cannot compile a codec for this spec: {exc}") from None
    exec(code, ns)  # the source holds no spec text but validated names as string literals
    return ns[entry]


class CompiledStruct:
    """Decoder, encoder and scanner of one struct (a body or a header) at one version."""

    def __init__(self, spec: MessageSpec, version: int, flexible: bool, *, api: str, api_key, direction: str):
        self.spec = spec
        self.version = version
        self.flexible = flexible
        self.api = api
        self.api_key = api_key
        self.direction = direction
        self.label = f"{api} {direction} v{version}"
        # The generated Python decoder is the reference; the C program, when built, is used
        # for speed and tested against it (tests/protocol/test_native_codec.py).
        try:
            self.decode_python = _compile(
                codegen.generate_decoder(spec.struct, version, flexible, self.label), "decode", self.label
            )
        except SpecError as exc:  # e.g. nesting past Python's 20 nested blocks: say which file
            raise SpecError(f"{spec.source}: {exc}" if spec.source else str(exc)) from None
        self._encode = None
        self._scan = None
        self._traced = None
        # Capture facts of a scan: a slot per integer field, and the compact-size target.
        self.int_slots = codegen.integer_slots(spec.struct, version)
        self._zero_stats = array(codegen.COUNTER_TYPECODE, [0]) * (codegen.SLOT_STRIDE * len(self.int_slots))
        self.compact_target = codegen.compact_target(spec, version) if direction in ("request", "response") else None
        native = native_module()
        if native is not None:
            self._program = native.compile_program(build_program(spec.struct, version, flexible, self.compact_target))
            self.decode_fast = self._program.decode
            self._scan = self._program.scan
            # A new, finished ScanResult per call built in C (Codec.scan_request/scan_response).
            self._scan_fresh = self._program.scan_fresh if native.SCAN_RESULT_FAST_PATH else None
        else:
            self._scan_fresh = None
            self._program = None
            self.decode_fast = self.decode_python

    @property
    def native(self) -> bool:
        """True when the C decoder and scanner serve this struct."""
        return self._program is not None

    def _error(self, reason: str, path: str | None = None, offset: int | None = None) -> DecodeError:
        return DecodeError(
            reason, api=self.api, api_key=self.api_key, version=self.version, direction=self.direction,
            path=path, offset=offset,
        )

    def decode(self, buf: bytes, pos: int = 0, *, whole: bool = True) -> tuple[dict, int]:
        """Decode at buf[pos:]; with whole=True the message must end exactly at the end of buf."""
        if type(buf) is not bytes:
            buf = bytes(buf)
        try:
            value, end = self.decode_fast(buf, pos)
        except DECODE_FAILURES as exc:
            raise self.diagnose(buf, pos, exc) from None
        if whole and end != len(buf):
            raise self._error(f"{len(buf) - end} trailing bytes after the message", offset=end)
        return value, end

    def diagnose(self, buf: bytes, pos: int, first: BaseException) -> DecodeError:
        """Re-run a tracing decoder to name the field path and offset of a failure."""
        if self._traced is None:
            self._traced = _compile(
                codegen.generate_decoder(self.spec.struct, self.version, self.flexible, self.label, trace=True),
                "decode", self.label,
            )
        # The path and offset are this call's own (arguments of the traced decoder, not its
        # globals): a codec shared between threads diagnoses in each without interference.
        path: list = []
        offset = [pos]
        try:
            self._traced(buf, pos, path, offset)
        except DECODE_FAILURES as exc:
            return self._error(_reason(exc), _render_path(path), offset[0])
        return self._error(_reason(first))

    def encode(self, value: dict, out: bytearray | None = None) -> bytearray:
        if self._encode is None:
            self._encode = _compile(
                codegen.generate_encoder(self.spec.struct, self.version, self.flexible, self.label), "encode", self.label
            )
        out = bytearray() if out is None else out
        try:
            self._encode(value, out)
        except EncodeError as exc:
            raise EncodeError(f"{self.label}: {exc}") from None
        except _ENCODE_FAILURES as exc:
            raise EncodeError(f"{self.label}: {type(exc).__name__}: {exc}") from None
        return out

    def scan(self, buf: bytes, pos: int = 0, result: ScanResult | None = None, *, whole: bool = True,
             integers: bool = True) -> ScanResult:
        """Walk the message without building values (see ScanResult).

        With whole=True the message must end at the end of buf; otherwise the bytes after
        it are counted in result.trailing_bytes. With integers=False the result gets no
        integer counters (int_stats None): the capture's facts, which the metrics do not need; nor does a buf
        longer than codegen.COUNTED_BYTES_MAX. With integers=codegen.COUNT_LATER a bytes buf is not counted
        (int_stats (buf, pos), into a fresh result only); other buffers are counted. A result scanned again adds to its counters (int32): the bytes
        scanned into one result in all must stay within that bound too.
        """
        size = None
        later = integers is codegen.COUNT_LATER and type(buf) is bytes  # pieces joined here are counted now, as in C
        if type(buf) is not bytes:
            if isinstance(buf, tuple):  # a FramePieces: the C scanner reads it in place
                if self._program is None:
                    buf = b"".join(buf)
                else:
                    size = sum(len(piece) for piece in buf)
            else:
                buf = bytes(buf)
        if size is None:
            size = len(buf)
        if self._scan is None:
            self._scan = _compile(
                codegen.generate_scanner(self.spec.struct, self.version, self.flexible, self.label,
                                         compact_target=self.compact_target), "scan", self.label
            )
        result = ScanResult() if result is None else result
        if integers and self.int_slots and size <= codegen.COUNTED_BYTES_MAX:  # longer: its counters could overflow
            if type(result.int_stats) is tuple:
                raise ValueError(f"{self.label}: the result's counters were left for later; it cannot be scanned into")
            # Left for later: int_stats stays None while scanning (nothing counted), (buf, pos) after it.
            later = later and result.int_stats is None
            if later:
                pass
            elif result.int_stats is None:
                result.int_slots = self.int_slots
                result.int_stats = self._zero_stats[:]  # a copy: one memcpy
            elif result.int_slots is not self.int_slots:
                raise ValueError(f"{self.label}: the result already holds the integer slots of another struct")
        else:
            later = False
        if result.source is not buf and result.record_spans:
            result.settle()  # spans into an earlier buffer: summarize them from it first
        result.source = buf  # the records spans point into buf; result.records reads them lazily
        try:
            end = self._scan(buf, pos, result)
        except DECODE_FAILURES as exc:
            raise self.diagnose(b"".join(buf) if type(buf) is not bytes else buf, pos, exc) from None
        if end != size:
            if whole:
                raise self._error(f"{size - end} trailing bytes after the message", offset=end)
            result.trailing_bytes = size - end
        if later:
            result.int_slots, result.int_stats = self.int_slots, (buf, pos)
        return result

    def scan_fresh(self, buf, pos: int, integers: bool, summarize: bool = False) -> ScanResult:
        """A new, finished ScanResult of the message at buf[pos:] (the bytes after it in trailing_bytes):
        scan(buf, pos, whole=False, integers=integers).finish(), in one C call when the C scanner is built;
        with summarize, its records summarized at once (what .records does on first use)."""
        fresh = self._scan_fresh
        if fresh is None or (type(buf) is not bytes and not isinstance(buf, tuple)):
            return self.scan(buf, pos, whole=False, integers=integers).finish()
        try:
            return fresh(buf, pos, (codegen.COUNT_LATER if integers is codegen.COUNT_LATER else self._zero_stats)
                         if integers and self.int_slots else None, self.int_slots, summarize)
        except DECODE_FAILURES as exc:
            raise self.diagnose(b"".join(buf) if type(buf) is not bytes else buf, pos, exc) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, Malformed):
        return str(exc)
    if isinstance(exc, (struct.error, IndexError)):
        return "truncated: the bytes end inside this field"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 in a string ({exc.reason})"
    if isinstance(exc, ValueError) and "16" in str(exc):
        return "truncated: the bytes end inside this uuid"
    if isinstance(exc, (MemoryError, RecursionError)):
        return f"{type(exc).__name__} while decoding"
    return f"{type(exc).__name__}: {exc}"


def _render_path(parts: list) -> str | None:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text or None


class RequestHeader:
    """A parsed request header: the fields, its version and size.

    `fields` holds every field by its spec name. A header the session made from the connection's
    previous one (same bytes after the correlation id: kinspect.session.facts.RequestHeaders) is given
    that header's fields as `base` instead, and `fields` is built from it when first read: no observer
    on the forwarding path reads it, and a dict copy per request was a measured share of the
    inspection's cache misses (docs/performance.md, "Request headers' fields built when read").
    """

    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "version", "size", "_fields", "_base")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None, version: int,
                 size: int, fields: dict | None = None, *, base: dict | None = None) -> None:
        if (fields is None) == (base is None):
            raise TypeError("RequestHeader: fields or base, one of the two")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.version = version
        self.size = size
        self._fields = fields
        self._base = base  # a header's fields whose ClientId and tags are this one's

    @property
    def fields(self) -> dict:
        fields = self._fields
        if fields is None:  # the base's keys in the base's order, this header's prefix in place
            fields = self._fields = {**self._base, "RequestApiKey": self.api_key,
                                     "RequestApiVersion": self.api_version, "CorrelationId": self.correlation_id}
        return fields

    def __eq__(self, other: object) -> bool:
        if type(other) is not RequestHeader:
            return NotImplemented
        return (self.api_key, self.api_version, self.correlation_id, self.client_id, self.version, self.size,
                self.fields) == (other.api_key, other.api_version, other.correlation_id, other.client_id,
                                 other.version, other.size, other.fields)

    __hash__ = None  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"RequestHeader(api_key={self.api_key!r}, api_version={self.api_version!r}, "
                f"correlation_id={self.correlation_id!r}, client_id={self.client_id!r}, version={self.version!r}, "
                f"size={self.size!r}, fields={self.fields!r})")


@dataclass(slots=True)
class DecodedRequest:
    header: RequestHeader
    api_name: str
    body: dict
    size: int
    # Bytes after a complete body. Brokers ignore them (librdkafka sends 3 with its
    # Metadata v12 "all topics" request); kept so that the frame re-encodes exactly.
    trailing: bytes = b""


@dataclass(slots=True)
class DecodedResponse:
    api_key: int
    api_name: str
    api_version: int
    correlation_id: int
    header_version: int
    header_size: int
    header: dict
    body: dict
    size: int
    trailing: bytes = b""


class Codec:
    """Compiles message specs on first use and decodes, encodes and scans frames."""

    def __init__(self, registry: SpecRegistry | None = None) -> None:
        self.registry = registry or SpecRegistry.default()
        self._bodies: dict[tuple[int, str, int], CompiledStruct | None] = {}
        self._headers: dict[tuple[str, int], CompiledStruct] = {}
        # Whether scans count integer fields (ScanResult.int_stats): set by the capture, the one reader of those
        # counters, so that scans for the metrics alone skip them. False, True (every scan counts them) or
        # codegen.COUNT_LATER (a frame scanned whole from bytes is not counted, its int_stats (frame, pos), but for
        # the keys count_now names; frames in pieces are counted). A plain attribute, read on every first scan (in
        # C too); setting it brings fast_scans' stats arguments in line (__setattr__).
        self.integer_facts = False
        # Under COUNT_LATER, the keys (api key, version, is request) whose whole frames are counted as they are
        # scanned all the same (count_now): the capture's taker asks for it where counting pays on the event loop.
        self._count_now: set = set()
        # (api key, version, is request) -> (C scan, the stats argument for it when integer_facts is on: its
        # zeroed integer counters, COUNT_LATER or None, its integer slots), for the bodies the C scanner takes:
        # Request.scan and Response.scan call it directly (a small Produce exchange's two scans spent about as
        # long in the Python layers above the C as in the C itself, measured with py-spy in the live proxy).
        # Filled by scan_request and scan_response, the reference.
        self.fast_scans: dict[tuple[int, int, bool], tuple] = {}

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        if name == "integer_facts" and "fast_scans" in self.__dict__:  # the fast scans' stats arguments follow it
            for key in self.fast_scans:
                self._refresh_fast_scan(key)

    def count_now(self, api_key: int, version: int, request: bool, now: bool) -> None:
        """Under COUNT_LATER, count the whole frames of this api version and direction as they are scanned (now),
        or leave them for later again: the capture's taker decides (capture.facts)."""
        key = (api_key, version, request)
        if now == (key in self._count_now) or (now and len(self._count_now) >= 4096):
            return
        if now:
            self._count_now.add(key)
        else:
            self._count_now.discard(key)
        if key in self.fast_scans:
            self._refresh_fast_scan(key)

    def _refresh_fast_scan(self, key: tuple) -> None:
        fast = self.fast_scans[key]
        compiled = self.body(key[0], "request" if key[2] else "response", key[1])  # compiled before: cached
        self.fast_scans[key] = (fast[0], self._stats_argument(key, compiled), fast[2])

    def _stats_argument(self, key: tuple, compiled: CompiledStruct):
        """What a scan of this key passes as its stats template while integer_facts is on."""
        if not compiled.int_slots:
            return None
        if self.integer_facts is codegen.COUNT_LATER and key not in self._count_now:
            return codegen.COUNT_LATER
        return compiled._zero_stats

    def _integers(self, key: tuple):
        """integer_facts for a scan of this key (True where count_now named it)."""
        integers = self.integer_facts
        return True if integers is codegen.COUNT_LATER and key in self._count_now else integers

    # -- compiled pieces

    def body(self, api_key: int, direction: str, version: int) -> CompiledStruct:
        """The compiled body of one api version; UnknownApiError if no spec defines it."""
        key = (api_key, direction, version)
        compiled = self._bodies.get(key)
        if compiled is None:
            spec = self.registry.message(api_key, direction, version)
            if spec is None:
                name = self.registry.api_name(api_key)
                what = f"version {version} of {name}" if name else f"api key {api_key}"
                raise UnknownApiError(
                    f"unknown {what}: no loaded spec defines it", api=name, api_key=api_key,
                    version=version, direction=direction,
                )
            compiled = CompiledStruct(
                spec, version, version in spec.flexible_versions, api=self.registry.api_name(api_key) or spec.name,
                api_key=api_key, direction=direction,
            )
            self._bodies[key] = compiled
        return compiled

    def header(self, name: str, version: int) -> CompiledStruct:
        key = (name, version)
        compiled = self._headers.get(key)
        if compiled is None:
            spec = self.registry.header(name, version)
            if spec is None:
                raise DecodeError(f"no spec defines {name} v{version}")
            compiled = CompiledStruct(
                spec, version, version in spec.flexible_versions, api=name, api_key=None, direction="header"
            )
            self._headers[key] = compiled
        return compiled

    def is_flexible(self, api_key: int, direction: str, version: int) -> bool:
        spec = self.registry.message(api_key, direction, version)
        if spec is None:
            raise UnknownApiError(f"unknown version {version} of api key {api_key}", api_key=api_key, version=version)
        return version in spec.flexible_versions

    def request_header_version(self, api_key: int, api_version: int) -> int:
        return request_header_version(api_key, api_version, self.is_flexible(api_key, "request", api_version))

    def response_header_version(self, api_key: int, api_version: int) -> int:
        return response_header_version(api_key, self.is_flexible(api_key, "response", api_version))

    # -- requests

    def decode_request_header(self, frame: bytes) -> RequestHeader:
        """Parse the header of a request frame. An api the specs do not know is read as header v1."""
        if len(frame) < 8:
            raise DecodeError(f"a request of {len(frame)} bytes is shorter than the 8-byte header prefix", offset=0)
        api_key, api_version, correlation_id = _PREFIX.unpack_from(frame, 0)
        try:
            hv = self.request_header_version(api_key, api_version)
        except UnknownApiError:
            hv = 1
        if hv >= 1:
            # The common case read inline, as the compiled header would (every request pays this):
            # a ClientId that is null or valid UTF-8 within the frame, then (v2) an empty tag section.
            length = (frame[8] << 8 | frame[9]) if len(frame) >= 10 else -2
            if length >= 0x8000:
                length -= 0x10000
            end = 10 + max(length, 0)
            if length >= -1 and end <= len(frame) and (hv == 1 or (end < len(frame) and frame[end] == 0)):
                try:
                    client_id = None if length == -1 else frame[10:end].decode("utf-8")
                except UnicodeDecodeError:
                    client_id = False  # let the compiled header say what is wrong
                if client_id is not False:
                    fields = {"RequestApiKey": api_key, "RequestApiVersion": api_version,
                              "CorrelationId": correlation_id, "ClientId": client_id}
                    return RequestHeader(api_key, api_version, correlation_id, client_id, hv, end + (hv == 2), fields)
        compiled = self.header("RequestHeader", hv)
        fields, end = compiled.decode(frame, 0, whole=False)
        return RequestHeader(api_key, api_version, correlation_id, fields.get("ClientId"), hv, end, fields)

    def decode_request(self, frame: bytes) -> DecodedRequest:
        frame = bytes(frame_bytes(frame))  # a FramePieces joined; any buffer as bytes
        header = self.decode_request_header(frame)
        compiled = self.body(header.api_key, "request", header.api_version)
        body, end = compiled.decode(frame, header.size, whole=False)
        return DecodedRequest(header, compiled.api, body, len(frame), frame[end:])

    def encode_request(self, header: dict, body: dict, trailing: bytes = b"") -> bytes:
        """The frame (without size prefix) of a request; header holds the RequestHeader fields."""
        api_key, version = header["RequestApiKey"], header["RequestApiVersion"]
        out = self.header("RequestHeader", self.request_header_version(api_key, version)).encode(header)
        return bytes(self.body(api_key, "request", version).encode(body, out)) + trailing

    # -- responses

    def decode_response_header(self, frame: bytes, api_key: int, api_version: int) -> tuple[dict, int, int]:
        """(header fields, header version, header size) of a response to a known request."""
        hv = self.response_header_version(api_key, api_version)
        fields, end = self.header("ResponseHeader", hv).decode(frame, 0, whole=False)
        return fields, hv, end

    def decode_response(self, frame: bytes, api_key: int, api_version: int) -> DecodedResponse:
        frame = bytes(frame_bytes(frame))
        compiled = self.body(api_key, "response", api_version)
        fields, hv, end = self.decode_response_header(frame, api_key, api_version)
        body, body_end = compiled.decode(frame, end, whole=False)
        return DecodedResponse(
            api_key, compiled.api, api_version, fields["CorrelationId"], hv, end, fields, body, len(frame),
            frame[body_end:],
        )

    def encode_response(self, api_key: int, api_version: int, header: dict, body: dict, trailing: bytes = b"") -> bytes:
        out = self.header("ResponseHeader", self.response_header_version(api_key, api_version)).encode(header)
        return bytes(self.body(api_key, "response", api_version).encode(body, out)) + trailing

    # -- scanning

    def scan_request(self, frame: bytes, header: RequestHeader | None = None) -> ScanResult:
        """Header tag sections and body facts of a request (see ScanResult)."""
        header = header or self.decode_request_header(frame)
        # Summarized at once: every reader of a request's records (metrics, inventory, capture) reads
        # them all; a response's (a Fetch's record sets) are summarized only if someone asks.
        compiled = self.body(header.api_key, "request", header.api_version)
        self._note_fast_scan(compiled, header.api_key, header.api_version, True)
        return compiled.scan_fresh(frame, header.size, self._integers((header.api_key, header.api_version, True)), True)

    def scan_response(self, frame: bytes, api_key: int, api_version: int, header_end: int | None = None) -> ScanResult:
        """Header tag sections and body facts of a response. header_end: where the caller read the response
        header to end, when it read it whole and well formed (v0, or v1 with an empty tag section): the header
        is then not read again; None reads it (and a malformed header fails the scan, as it should)."""
        compiled = self.body(api_key, "response", api_version)
        self._note_fast_scan(compiled, api_key, api_version, False)
        if header_end is None:
            hv = self.response_header_version(api_key, api_version)
            # A FramePieces (a large Fetch response): its header is read from the pieces joined (rare: a header
            # with tagged fields), and its body scanned in place.
            _, header_end = self.header("ResponseHeader", hv).decode(frame_bytes(frame), 0, whole=False)
        return compiled.scan_fresh(frame, header_end, self._integers((api_key, api_version, False)))

    def _note_fast_scan(self, compiled: CompiledStruct, api_key: int, version: int, request: bool) -> None:
        key = (api_key, version, request)
        if key not in self.fast_scans and compiled._scan_fresh is not None and len(self.fast_scans) < 4096:
            self.fast_scans[key] = (compiled._scan_fresh, self._stats_argument(key, compiled), compiled.int_slots)


def correlation_id_of_response(frame: bytes) -> int:
    """Every response header starts with the correlation id."""
    if len(frame) < 4:
        raise DecodeError(f"a response of {len(frame)} bytes has no correlation id", offset=0)
    return _CORRELATION.unpack_from(frame, 0)[0]
