"""The Kafka wire protocol: spec model, compiled codecs, headers, framing and record summaries.

This package is pure: it reads and writes bytes and spec files, and never imports
asyncio, logging or metrics, so it can be used alone to decode a frame from a file.
"""

from kinspect.protocol.errors import DecodeError, EncodeError, SpecError, UnknownApiError

__all__ = ["DecodeError", "EncodeError", "SpecError", "UnknownApiError"]
