"""Makes a client's self-description (KIP-511 software name and version) safe to show and to use as a label."""

from __future__ import annotations

MAX_CHARS = 64


def sanitize(text, limit: int = MAX_CHARS) -> str:
    """Control characters and undecodable bytes escaped, at most `limit` characters (then '…')."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    text = str(text)
    out = []
    for ch in text:
        code = ord(ch)
        if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or 0xD800 <= code < 0xE000:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
        if len(out) > limit:
            break
    escaped = "".join(out)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"
