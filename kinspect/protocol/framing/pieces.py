"""A frame kept in the reads that brought it: scanned where it lies, joined only when asked."""

from __future__ import annotations


class FramePieces(tuple):
    """The bytes-like pieces of one frame (without its size prefix), in order.

    FrameStream hands a large frame kept whole this way instead of joining its reads: the
    C scanner and record summarizer read it in place (kinspect.protocol.codec._wire), so the
    frame is never copied whole for them; `join()` gives the bytes to whatever needs them
    contiguous (a full decode, the pure-Python codec).
    """

    __slots__ = ()

    def join(self) -> bytes:
        return b"".join(self)

    def head(self, n: int) -> bytes:
        """The frame's first n bytes (fewer if it is shorter), joining only the pieces they span."""
        out, taken = [], 0
        for piece in self:
            if taken >= n:
                break
            out.append(piece[: n - taken])
            taken += len(out[-1])
        return b"".join(out)


def frame_bytes(frame):
    """A frame as its bytes: a FramePieces (or any tuple of a frame's pieces, as the codec takes them) joined;
    anything else as it is."""
    return b"".join(frame) if isinstance(frame, tuple) else frame
