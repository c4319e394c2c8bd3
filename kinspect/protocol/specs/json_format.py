"""Reading message-definition files: JSON with whole-line // comments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kinspect.protocol.errors import SpecError

# A spec file larger than this is not a message definition (the largest upstream is ~20 KB).
MAX_SPEC_BYTES = 4 * 1024 * 1024


def strip_comments(text: str) -> str:
    """Drop lines whose first non-blank characters are //, as Kafka's generator does."""
    return "\n".join("" if line.lstrip().startswith("//") else line for line in text.split("\n"))


def load_spec_file(path: Path) -> Any:
    """Parse one definition file; errors name the file and the line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: {len(raw)} bytes is too large for a message definition")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(strip_comments(text))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise SpecError(f"{path}: JSON nested too deeply") from None
