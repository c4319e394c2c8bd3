"""Version ranges of the message-definition format: "0+", "3-7", "5", "none"."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^(\d{1,5})(?:(\+)|-(\d{1,5}))?$")
# Versions are int16 on the wire; an open range ends at the largest one.
MAX_VERSION = 0x7FFF


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of versions; the empty range is written "none"."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> "VersionRange":
        if not isinstance(text, str):
            raise ValueError(f"a version range must be a string, not {text!r}")
        text = text.strip()
        if text == "none":
            return NONE
        m = _RANGE.match(text)
        if not m:
            raise ValueError(f"not a version range: {text!r}")
        low = int(m.group(1))
        if m.group(2):
            high = MAX_VERSION
        elif m.group(3) is not None:
            high = int(m.group(3))
        else:
            high = low
        if low > MAX_VERSION or high > MAX_VERSION or high < low:
            raise ValueError(f"not a version range: {text!r}")
        return cls(low, high)

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high

    @property
    def empty(self) -> bool:
        return self.high < self.low

    def intersects(self, other: "VersionRange") -> bool:
        return not self.empty and not other.empty and self.low <= other.high and other.low <= self.high

    def __iter__(self):
        return iter(range(self.low, self.high + 1))

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.high == MAX_VERSION:
            return f"{self.low}+"
        if self.low == self.high:
            return str(self.low)
        return f"{self.low}-{self.high}"


NONE = VersionRange(0, -1)
