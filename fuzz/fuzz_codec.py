"""Coverage-guided fuzzing (atheris) of the whole frame path: framer, headers, bodies C and Python, scan, records.

Run (see fuzz/README.md):
    .venv/bin/python fuzz/make_corpus.py
    nice .venv/bin/python fuzz/fuzz_codec.py fuzz/corpus -max_total_time=600 -rss_limit_mb=2048

An input is a mode byte (taken modulo 4) and a payload:
  0  a request frame (the bytes after the size prefix)
  1  a response frame: api key and version (two int16) and then the frame; a pair no spec
     defines picks one of the defined response decoders, so mutations keep reaching decoders
  2  the bytes of a records field, for the record-set summary
  3  a byte stream, for the framers (and the frames they cut go down the request path)

Anything but a decoded value or the layer's own error (DecodeError, RecordsError,
FrameError) escaping is a crash, and so is the C path and the Python reference disagreeing
on accept or reject, on the value, or on the scan. `check(data)` is the whole test and
needs no atheris: tests/test_fuzz_regressions.py replays crashes through it.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_instrument = None  # atheris.instrument_func when run under atheris: the generated codecs are instrumented too


def _load():
    from kinspect.protocol import records
    from kinspect.protocol.codec import codegen
    from kinspect.protocol.framing import framer
    from kinspect.protocol.codec.codec import DECODE_FAILURES, Codec, _compile
    from kinspect.protocol.codec.runtime import summarize_spans_python
    from kinspect.protocol.errors import DecodeError
    from kinspect.protocol.wire.primitives import Malformed
    from kinspect.protocol.codec.scan_result import ScanResult

    return codegen, framer, records, DECODE_FAILURES, Codec, _compile, summarize_spans_python, DecodeError, \
        Malformed, ScanResult


if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["kinspect"]):
        (codegen, framer, records, DECODE_FAILURES, Codec, _compile, summarize_spans_python, DecodeError,
         Malformed, ScanResult) = _load()
    _instrument = atheris.instrument_func
else:
    (codegen, framer, records, DECODE_FAILURES, Codec, _compile, summarize_spans_python, DecodeError,
     Malformed, ScanResult) = _load()

MODE_REQUEST, MODE_RESPONSE, MODE_RECORDS, MODE_STREAM = 0, 1, 2, 3
_KEY_VERSION = struct.Struct(">hh")
_RAW_FAILURES = tuple({*DECODE_FAILURES, Malformed})  # what decode_fast / decode_python raise on bad bytes

CODEC = Codec()
RESPONSE_CASES = [(key, v) for key in CODEC.registry.api_keys() for v in CODEC.registry.versions(key, "response")]


class Disagreement(AssertionError):
    """The C path and the Python reference differ on one input."""


class _Reference:
    """The Python reference decoder and scanner of one compiled struct (instrumented under atheris)."""

    _cache: dict = {}

    def __init__(self, compiled) -> None:
        spec, v, flexible, label = compiled.spec.struct, compiled.version, compiled.flexible, compiled.label
        self.decode = compiled.decode_python
        self.scan = _compile(codegen.generate_scanner(spec, v, flexible, label), "scan", label)
        if _instrument is not None:
            self.decode = _instrument(self.decode)
            self.scan = _instrument(self.scan)

    @classmethod
    def of(cls, compiled) -> _Reference:
        ref = cls._cache.get(id(compiled))
        if ref is None:
            ref = cls._cache[id(compiled)] = cls(compiled)
        return ref


def _same(a, b) -> bool:
    """Exact equality, types included (repr tells 0.0 from -0.0 and keeps dict key order)."""
    return type(a) is type(b) and repr(a) == repr(b)


def _try(fn, *args):
    try:
        return fn(*args), None
    except _RAW_FAILURES as exc:
        return None, exc


def agree(compiled, buf: bytes, pos: int) -> None:
    """C and Python decode and scan buf[pos:] alike; then the public calls raise only DecodeError."""
    ref = _Reference.of(compiled)
    c_value, c_exc = _try(compiled.decode_fast, buf, pos)
    py_value, py_exc = _try(ref.decode, buf, pos)
    if (c_exc is None) != (py_exc is None):
        raise Disagreement(f"{compiled.label} decode: C {c_exc!r}, Python {py_exc!r} on {buf.hex()} at {pos}")
    if c_exc is None and not _same(c_value, py_value):
        raise Disagreement(f"{compiled.label} decode: C {c_value!r} != Python {py_value!r} on {buf.hex()} at {pos}")
    c_result, py_result = ScanResult(), ScanResult()
    c_result.source = py_result.source = buf
    c_end, c_exc = _try(compiled._program.scan if compiled.native else ref.scan, buf, pos, c_result)
    py_end, py_exc = _try(ref.scan, buf, pos, py_result)
    if (c_exc is None) != (py_exc is None):
        raise Disagreement(f"{compiled.label} scan: C {c_exc!r}, Python {py_exc!r} on {buf.hex()} at {pos}")
    if c_exc is None:
        if c_end != py_end or not _same(_scan_facts(c_result), _scan_facts(py_result)):
            raise Disagreement(f"{compiled.label} scan differs on {buf.hex()} at {pos}")
        _records_agree(buf, c_result)
    # The public calls: a value or a DecodeError, nothing else.
    for call in (compiled.decode, compiled.scan):
        try:
            call(buf, pos, whole=False)
        except DecodeError:
            pass


def _scan_facts(r) -> tuple:
    return (r.tag_sections, r.tag_section_bytes, list(r.empty_counter), list(r.tagged_fields),
            dict(r.error_codes), sorted(r.topics), list(r.record_spans))


def _records_agree(buf: bytes, result) -> None:
    reference: list = []
    summarize_spans_python(buf, result.record_spans, reference)
    if not _same(result.records, reference):
        raise Disagreement(f"records summaries differ: {result.records!r} != {reference!r}")


def check_request(frame: bytes) -> None:
    header_compiled = None
    if len(frame) >= 8:
        key, version = _KEY_VERSION.unpack_from(frame, 0)
        try:
            hv = CODEC.request_header_version(key, version)
        except DecodeError:
            hv = 1
        header_compiled = CODEC.header("RequestHeader", hv)
        agree(header_compiled, frame, 0)
    try:
        header = CODEC.decode_request_header(frame)
    except DecodeError:
        return
    try:
        body = CODEC.body(header.api_key, "request", header.api_version)
    except DecodeError:  # UnknownApiError: forwarded and reported, nothing to decode
        return
    agree(body, frame, header.size)
    for call in (CODEC.decode_request, CODEC.scan_request):
        try:
            call(frame)
        except DecodeError:
            pass


def check_response(payload: bytes) -> None:
    if len(payload) < 4:
        return
    key, version = _KEY_VERSION.unpack_from(payload, 0)
    frame = payload[4:]
    if version not in CODEC.registry.versions(key, "response"):
        key, version = RESPONSE_CASES[(key * 256 + version) % len(RESPONSE_CASES)]
    hv = CODEC.response_header_version(key, version)
    header_compiled = CODEC.header("ResponseHeader", hv)
    agree(header_compiled, frame, 0)
    try:
        _, end = header_compiled.decode(frame, 0, whole=False)
    except DecodeError:
        end = None
    if end is not None:
        agree(CODEC.body(key, "response", version), frame, end)
    for call in (CODEC.decode_response, CODEC.scan_response):
        try:
            call(frame, key, version)
        except DecodeError:
            pass


def check_records(data: bytes) -> None:
    try:
        c_summary, c_exc = records.summarize_records(data), None
    except records.RecordsError as exc:
        c_summary, c_exc = None, exc
    try:
        py_summary, py_exc = records.summarize_records_python(data), None
    except records.RecordsError as exc:
        py_summary, py_exc = None, exc
    if (c_exc is None) != (py_exc is None) or (c_exc is not None and str(c_exc) != str(py_exc)):
        raise Disagreement(f"records: C {c_exc!r}, Python {py_exc!r} on {data.hex()}")
    if c_exc is None:
        if not _same(c_summary, py_summary):
            raise Disagreement(f"records: C {c_summary!r} != Python {py_summary!r} on {data.hex()}")
        for batch in c_summary.batches:
            records.verify_crc(data, batch)


def _cut(stream: bytes, chunk: int, keep_limit: int, head_bytes: int, forwarding: bool):
    """The pipeline's framing of `stream` fed `chunk` bytes at a time: (frames, bytes forwarded, failure)."""
    from kinspect.protocol.framing.stream import KEEP_WHOLE, FrameStream

    framing = FrameStream(lambda first, size: (KEEP_WHOLE, None), 4096, keep_limit, head_bytes, forwarding=forwarding)
    frames, sent, failed = [], [], None
    for i in range(0, len(stream), chunk):
        try:
            forward, done = framing.feed(stream[i:i + chunk])
        except framer.FrameError as exc:
            failed = exc
            frames += exc.frames  # completed by the failing feed, before the bad size
            sent += exc.forward or ()
            sent.append(stream[i + chunk:])  # as the session does: the rest passes unread
            break
        frames += done
        sent += forward or ()
    else:
        sent.append(framing.end())  # what a frame cut short held back goes out at the end
    return [(f[1], f[2], f[3]) for f in frames], b"".join(sent), failed


def check_stream(data: bytes) -> None:
    if not data:
        return
    chunk = data[0] % 16 + 1
    stream = data[1:]
    limit = 4096
    frames, _, failed = _cut(stream, chunk, limit, 512, False)
    pieces, sent, split_failed = _cut(stream, chunk, 256, 32, True)
    if type(split_failed) is not type(failed):
        raise Disagreement(f"whole {failed!r}, heads {split_failed!r} on {stream.hex()}")
    expected = [(size, f if size <= 256 else f[:32], size <= 256) for size, f, _ in frames]
    if pieces[:len(expected)] != expected:
        raise Disagreement(f"whole and head-keeping framing cut {stream.hex()} differently")
    if sent != stream:
        raise Disagreement(f"a forwarding stream changed the bytes of {stream.hex()}")
    try:
        split, _ = framer.split_frames(stream, limit)
    except framer.FrameError:
        split = None
    whole = [f for _, f, _ in frames]
    if split is not None and [f for _, f in split] != whole:
        raise Disagreement(f"FrameStream and split_frames cut {stream.hex()} differently")
    for frame in whole[:4]:
        check_request(frame)


_MODES = (check_request, check_response, check_records, check_stream)


def check(data: bytes) -> None:
    """One fuzz input: raises only when kinspect misbehaves."""
    if data:
        _MODES[data[0] % 4](bytes(data[1:]))


def prepare_artifact_dirs(argv: list[str]) -> None:
    """Create the folder of -artifact_prefix=DIR/ (libFuzzer writes crashes there but never makes it)."""
    for arg in argv:
        if arg.startswith("-artifact_prefix="):
            prefix = arg.split("=", 1)[1]
            folder = prefix if prefix.endswith("/") else os.path.dirname(prefix)
            if folder:
                os.makedirs(folder, exist_ok=True)


def main() -> None:
    import atheris

    prepare_artifact_dirs(sys.argv)
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
