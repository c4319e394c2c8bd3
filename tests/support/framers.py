"""Adapters over the pipeline's FrameStream in the shapes the framer tests use: whole frames, or heads of large ones."""

from __future__ import annotations

from kinspect.protocol.framing.framer import DEFAULT_MAX_FRAME_BYTES, FrameError
from kinspect.protocol.framing.stream import KEEP_WHOLE, FrameStream


class _Adapter:
    def __init__(self, stream: FrameStream, shape) -> None:
        self.stream = stream
        self.shape = shape

    @property
    def failed(self) -> bool:
        return self.stream.failed

    @property
    def buffered(self) -> int:
        return self.stream.buffered

    def feed(self, data) -> list:
        try:
            _, frames = self.stream.feed(data)
        except FrameError as exc:
            exc.frames = [self.shape(f) for f in exc.frames]
            raise
        return [self.shape(f) for f in frames]


def whole_framer(max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> _Adapter:
    """Every frame whole, as bytes."""
    stream = FrameStream(lambda first, size: (KEEP_WHOLE, None), max_frame_bytes, keep_limit=max_frame_bytes)
    return _Adapter(stream, lambda f: f[2])


def head_framer(max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, keep_limit: int = 1024 * 1024,
                head_bytes: int = 512) -> _Adapter:
    """(size, data, complete): whole frames up to keep_limit, the head of larger ones."""
    stream = FrameStream(lambda first, size: (KEEP_WHOLE, None), max_frame_bytes, keep_limit, head_bytes)
    return _Adapter(stream, lambda f: (f[1], f[2], f[3]))
