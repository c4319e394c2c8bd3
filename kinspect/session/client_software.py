"""The client's software name and version (KIP-511, ApiVersions v3+), read from the wire and made safe to show.

The two strings come from whoever connects: they may hold control characters, invalid
UTF-8 or 64 KB of text. sanitize() escapes the first two and truncates, so that what
reaches logs, labels and tables is printable and at most MAX_CHARS characters long.
"""

from __future__ import annotations

from kinspect.protocol.wire.primitives import Malformed, read_uvarint

MAX_CHARS = 64
ELLIPSIS = "…"
FIRST_SOFTWARE_VERSION = 3  # ApiVersions v3 is the first with ClientSoftwareName/Version
# Bytes of a name read at most: 4 escaped bytes ("\\xff") per shown character is the worst case.
_READ_LIMIT = MAX_CHARS * 4 + 4


def _escape(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (decoded with surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    # Control, format (bidi overrides, zero-width), separator and unassigned characters.
    short = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch)
    if short:
        return short
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def sanitize(text: str | bytes | bytearray | memoryview) -> str:
    """Control characters and invalid UTF-8 escaped (\\x1b, \\xff), cut to MAX_CHARS with a trailing "…"."""
    if type(text) is bytes and len(text) <= MAX_CHARS and text.isascii():
        plain = text.decode("ascii")
        if plain.isprintable():  # the common case: nothing to escape or cut
            return plain
    longer = False
    if not isinstance(text, str):
        longer = len(text) > _READ_LIMIT
        text = bytes(text[:_READ_LIMIT]).decode("utf-8", "surrogateescape")
    out: list[str] = []
    length = 0
    for ch in text[:_READ_LIMIT]:
        piece = _escape(ch)
        if length + len(piece) > MAX_CHARS:
            return "".join(out) + ELLIPSIS
        out.append(piece)
        length += len(piece)
    if longer or len(text) > _READ_LIMIT:
        return "".join(out) + ELLIPSIS
    return "".join(out)


def _compact_string(frame: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_uvarint(frame, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(frame):
        raise Malformed("string runs past the frame")
    return frame[pos:end], end


# The body last read and what it gave: a client sends the same ApiVersions body each time.
_last: tuple = (None, (None, None))
_MEMO_BYTES = 512


def software_of(frame: bytes, body_offset: int) -> tuple[str | None, str | None]:
    """ClientSoftwareName and ClientSoftwareVersion of an ApiVersions v3+ request frame, sanitized.

    Read here rather than with the codec so that invalid UTF-8 is shown, not refused.
    (None, None) when the body is cut short or malformed. The same body as the previous call's
    gives the previous outcome without reading it again.
    """
    global _last
    body = frame[body_offset:]
    last = _last
    if body == last[0]:
        return last[1]
    try:
        name, pos = _compact_string(frame, body_offset)
        version, _ = _compact_string(frame, pos)
    except (IndexError, Malformed):
        outcome = (None, None)
    else:
        outcome = (None if name is None else sanitize(name)), (None if version is None else sanitize(version))
    if len(body) <= _MEMO_BYTES:
        _last = (bytes(body), outcome)
    return outcome


__all__ = ["MAX_CHARS", "sanitize", "software_of"]
