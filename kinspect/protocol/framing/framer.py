"""Kafka framing (4-byte big-endian size, then that many bytes): its errors, its limit, and a whole-buffer splitter.

The live framing, fed in any chunking, is the session pipeline's FrameStream
(kinspect.protocol.framing.stream); `split_frames` cuts a buffer held whole (recordings, tools).
"""

from __future__ import annotations

import struct

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")


class FrameError(ValueError):
    """The stream is not size-prefixed Kafka frames.

    `frames` holds what the failing `feed` completed before the bad size, in the form
    `feed` returns them: whether a valid frame is seen must not depend on whether it
    arrived in the same TCP segment as the bad size that follows it.
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.frames: list = []  # per instance: a class-level list would be shared by every error
        self.forward: list | None = None  # bytes a forwarding stream had not sent yet


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")


def split_frames(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[list[tuple[int, bytes]], int]:
    """Frames of a whole capture as (offset of the size prefix, frame), and the count of trailing bytes."""
    frames = []
    pos = 0
    end = len(data)
    while end - pos >= 4:
        size = _SIZE.unpack_from(data, pos)[0]
        if size < 0 or size > max_frame_bytes:
            raise FrameError(f"bad frame size {size} at byte {pos}")
        if end - pos - 4 < size:
            break
        frames.append((pos, data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return frames, end - pos
