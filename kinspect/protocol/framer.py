"""Splits a byte stream into Kafka frames (4-byte big-endian size, then that many bytes); sans-IO.

Bytes may arrive in any chunking. `feed` takes what arrived and returns the frames it
completed; a size above the limit, or negative, raises FrameTooLarge / FrameError and
leaves the framer unusable (the stream cannot be re-synchronised). The frames that the same
`feed` completed before the bad size are not lost: they are the error's `frames`.
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

    frames: list = []


def _failure(size: int, limit: int, frames: list) -> FrameError:
    exc = FrameError(f"negative frame size {size}") if size < 0 else FrameTooLarge(size, limit)
    exc.frames = frames
    return exc


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")


class Framer:
    """Accumulates bytes and yields whole frames (without their size prefix)."""

    __slots__ = ("max_frame_bytes", "_buffer", "_need", "failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._need = -1  # size of the frame being collected, -1 while reading the prefix
        self.failed = False

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buffer)

    @property
    def pending_frame_size(self) -> int | None:
        """Size of the frame being collected, once its prefix has arrived."""
        return self._need if self._need >= 0 else None

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if self.failed:
            raise FrameError("the framer failed earlier; the stream cannot be re-synchronised")
        buf = self._buffer
        buf += data
        frames = []
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                size = _SIZE.unpack_from(buf, pos)[0]
                if size < 0 or size > self.max_frame_bytes:
                    self.failed = True
                    del buf[:pos]
                    raise _failure(size, self.max_frame_bytes, frames)
                pos += 4
                self._need = size
            if end - pos < self._need:
                break
            frames.append(bytes(buf[pos : pos + self._need]))
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames


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


class FrameSplitter:
    """A framer for the forwarding path: whole frames up to keep_limit, heads of larger ones.

    A frame larger than keep_limit is not copied whole: `feed` reports it once its first
    `head_bytes` have arrived (enough for any header) and then only counts the rest, so a
    64 MB Fetch response costs a few hundred bytes of memory. Results are tuples
    (size, data, complete): data is the whole frame when complete, else its head.
    """

    __slots__ = ("max_frame_bytes", "keep_limit", "head_bytes", "_buffer", "_need", "_skip", "failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, keep_limit: int = 1024 * 1024,
                 head_bytes: int = 512) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.keep_limit = keep_limit
        self.head_bytes = head_bytes
        self._buffer = bytearray()
        self._need = -1  # size of the frame being collected, -1 while reading the prefix
        self._skip = 0  # bytes of a large frame still to pass over
        self.failed = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes, bool]]:
        if self.failed:
            raise FrameError("the framer failed earlier; the stream cannot be re-synchronised")
        out = []
        view = memoryview(data)
        if self._skip:
            n = min(self._skip, len(view))
            self._skip -= n
            view = view[n:]
            if not len(view):
                return out
        # Read from the new chunk itself when nothing is held: each frame is copied once.
        buf = self._buffer
        if buf:
            buf += view
            view = memoryview(buf)
        pos = 0
        end = len(view)
        unpack = _SIZE.unpack_from
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                size = unpack(view, pos)[0]
                if size < 0 or size > self.max_frame_bytes:
                    self.failed = True
                    view.release()
                    buf.clear()
                    raise _failure(size, self.max_frame_bytes, out)
                pos += 4
                self._need = size
            size = self._need
            if size <= self.keep_limit:
                if end - pos < size:
                    break
                out.append((size, bytes(view[pos : pos + size]), True))
                pos += size
            else:
                head = min(self.head_bytes, size)
                if end - pos < head:
                    break
                out.append((size, bytes(view[pos : pos + head]), False))
                have = min(end - pos, size)
                pos += have
                if have < size:
                    self._skip = size - have
                    self._need = -1
                    break
            self._need = -1
        if buf:  # the held bytes were extended: drop what was consumed, in place
            view.release()
            if pos:
                del buf[:pos]
        else:  # read straight from the chunk: hold only its unconsumed tail
            if pos < end:
                buf += view[pos:]
            view.release()
        return out
