"""Splits one direction's byte stream into Kafka frames once, keeping of each what its plan asks (sans-IO).

A frame is a 4-byte big-endian size and that many bytes. As soon as a frame's size and
its first 8 bytes are in (api key, version and correlation id of a request; correlation
id of a response), `plan(first_bytes, size)` decides what to keep of it:

- KEEP_HEAD: its first `head_bytes` (enough for any header); the rest is only counted;
- KEEP_WHOLE: the whole frame, when it is at most `keep_limit` bytes (else its head);
- HOLD: the whole frame, and in a forwarding stream its bytes are held back so that the
  caller can send a transformed frame in their place;
- KEEP_PIECES: as KEEP_WHOLE, but a frame that spans reads of PIECES_MIN_BYTES on average
  comes as the FramePieces it arrived in, not joined, and one of PIECES_MIN_BYTES or more
  whole in a read that nothing changes (bytes) as a FramePieces of one view of that read, not
  copied: for a consumer that reads it in place (the C scanner). (A copy of a 1 MB request cost
  the session 110-130 us warm, 190-210 cold; the view costs what a gathered request does.)

`plan` returns (mode, ticket); the ticket travels with the frame (the response's request,
for example). A stream made with `forwarding=True` also returns the bytes to send on, in
order: every byte as it arrives, except a frame's first bytes until its plan is known and
the whole of a held frame, which appears as a `None` placeholder at its place.

A frame kept whole that spans several reads is gathered as the reads' chunks and joined
once it is complete: a bytearray grown read by read cost about 1 ms of CPU per MB (each
growth a reallocation onto fresh pages), one join about 25 µs in a hot loop and about
0.1 ms per MB in a busy proxy. KEEP_PIECES skips the join.

A size below zero or above `max_frame_bytes` cannot be followed: `feed` raises
FrameTooLarge / FrameError, carrying what it completed before (`frames`) and, in a
forwarding stream, every byte not yet forwarded (`forward`), so nothing is lost.
"""

from __future__ import annotations

import struct

from kinspect.protocol.framing.framer import FrameError, FrameTooLarge
from kinspect.protocol.framing.pieces import FramePieces

KEEP_HEAD, KEEP_WHOLE, HOLD, KEEP_PIECES = 0, 1, 2, 4
# KEEP_PIECES hands over pieces only when they average this many bytes: many small reads are
# joined (each piece costs the scanner a buffer lookup, and a tiny one is not worth it).
PIECES_MIN_BYTES = 4096
_OVER_LIMIT = 3  # internal: a frame to keep whole that is over keep_limit: its head, never complete
DECIDING_BYTES = 8  # of a frame's own bytes, what `plan` is given (fewer if the frame is shorter)
_SIZE = struct.Struct(">i")


def _immutable(data) -> bool:
    """Whether a read's bytes can never change: bytes, or a view of bytes (a part of a read)."""
    return type(data) is bytes or (type(data) is memoryview and type(data.obj) is bytes)


class FrameStream:
    """One direction of one connection; `feed(data)` returns (forward, frames).

    frames: (offset, size, data, complete, ticket, mode) per frame, in order, where offset
    is the stream offset of its size prefix, data the whole frame when complete, else its
    head. forward: None for a stream that does not forward (the caller sends `data` as it is).
    """

    __slots__ = ("plan", "max_frame_bytes", "keep_limit", "head_bytes", "forwarding", "failed",
                 "_buffer", "_buffer_offset", "_forwarded", "_size", "_mode", "_ticket", "_skip", "_parts", "_parts_bytes", "pieces_min_bytes")

    def __init__(self, plan, max_frame_bytes: int, keep_limit: int, head_bytes: int = 512,
                 forwarding: bool = False, pieces_min_bytes: int = PIECES_MIN_BYTES) -> None:
        self.plan = plan
        self.max_frame_bytes = max_frame_bytes
        self.keep_limit = keep_limit
        self.head_bytes = head_bytes
        self.forwarding = forwarding
        self.pieces_min_bytes = pieces_min_bytes
        self.failed = False
        self._buffer = bytearray()
        self._buffer_offset = 0  # stream offset of the buffer's first byte
        self._forwarded = 0  # bytes at the buffer's start already forwarded
        self._size = -1  # size of the frame at the buffer's start once planned, -1 before
        self._mode = KEEP_HEAD
        self._ticket = None
        self._skip = 0  # bytes of a frame whose head was taken, still to pass over
        # Reads after the buffer of a frame kept whole and not yet complete (None: none under way); the
        # frame's bytes so far are the buffer's, then these.
        self._parts: list | None = None
        self._parts_bytes = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer) + self._parts_bytes

    def _one_frame(self, data: bytes):
        """feed() of a chunk that is exactly one frame of 8 bytes or more, when nothing is held; None otherwise.

        The same outcome as the general loop (tests feed every chunking and compare), in fewer steps.
        """
        end = len(data)
        if end < 4 + DECIDING_BYTES:
            return None
        size = _SIZE.unpack_from(data, 0)[0]
        if size != end - 4 or size > self.max_frame_bytes:
            return None
        mode, ticket = self.plan(data[4:12], size)
        offset = self._buffer_offset
        self._buffer_offset = offset + end
        if (mode == KEEP_WHOLE or mode == KEEP_PIECES) and size > self.keep_limit:
            head = size if size < self.head_bytes else self.head_bytes
            frame = (offset, size, data[4 : 4 + head], False, ticket, KEEP_HEAD)
        elif mode == KEEP_HEAD and size > self.head_bytes:
            frame = (offset, size, data[4 : 4 + self.head_bytes], False, ticket, mode)
        elif mode == KEEP_PIECES and size >= self.pieces_min_bytes:
            frame = (offset, size, FramePieces((memoryview(data)[4:],)), True, ticket, mode)  # a view, not a copy
        else:
            frame = (offset, size, data[4:], True, ticket, mode)
        if self.forwarding:
            return ([None] if mode == HOLD else [data]), [frame]
        return None, [frame]

    def _gather(self, data) -> tuple[list | None, list]:
        """feed() while a frame kept whole is under way: the read is kept as it is, and once the frame is
        complete its bytes are joined in one copy (KEEP_PIECES: handed over as they are); what follows
        it is framed as usual."""
        size, mode = self._size, self._mode
        parts = self._parts
        need = 4 + size - len(self._buffer) - self._parts_bytes  # bytes of the frame still to come
        n = len(data)
        held = mode == HOLD
        forward = [] if self.forwarding else None
        if n < need:
            parts.append(data if type(data) is bytes else bytes(data))
            self._parts_bytes += n
            if forward is not None and not held:  # a planned frame not held is forwarded as it comes
                forward.append(parts[-1])
                self._forwarded += n
            return forward, []
        view = memoryview(data)
        buffer = self._buffer
        # The frame's first bytes: in the buffer, or (a KEEP_PIECES frame begun in a bytes read)
        # parts[0], a view of that read (see feed).
        first, rest = (memoryview(buffer)[4:], parts) if buffer else (parts[0][4:], parts[1:])
        if mode == KEEP_PIECES and size >= self.pieces_min_bytes * (len(rest) + 2):
            # The frame as it came: its first bytes (a buffer is handed over, a new one takes its
            # place), the reads between, and the head of this read (a view when nothing changes it).
            if buffer:
                self._buffer = bytearray()
            last = view[:need] if _immutable(data) else bytes(view[:need])
            frame = FramePieces((first, *rest, last))
        else:
            frame = b"".join((first, *rest, view[:need]))
            if buffer:
                first.release()  # the buffer is cleared below
        offset = self._buffer_offset
        frames = [(offset, size, frame, True, self._ticket, mode)]
        if forward is not None:
            if held:
                forward.append(None)  # the whole frame, for the caller to send transformed
            elif need:
                forward.append(data if need == n and type(data) is bytes else bytes(view[:need]))
        self._buffer.clear()
        self._parts, self._parts_bytes = None, 0
        self._size, self._forwarded = -1, 0
        self._buffer_offset = offset + 4 + size
        if need == n:
            return forward, frames
        try:
            more_forward, more = self.feed(view[need:])
        except FrameError as exc:
            exc.frames = frames + exc.frames
            if forward is not None:
                exc.forward = forward + exc.forward
            raise
        if forward is not None:
            forward += more_forward
        return forward, frames + more

    def end(self) -> bytes:
        """The stream ended: the bytes received but not yet forwarded (a frame cut short), to send as they are."""
        if self._parts:
            self._buffer += b"".join(self._parts)
        self._parts, self._parts_bytes = None, 0
        unsent = bytes(self._buffer[self._forwarded:]) if self.forwarding else b""
        self._buffer.clear()
        self._forwarded = 0
        self.failed = True
        return unsent

    @property
    def in_progress(self):
        """The ticket of a frame begun but not ended, else None."""
        return self._ticket if (self._size >= 0 or self._skip) else None

    def pass_over(self, n: int) -> bool:
        """What feed() does with a read of n bytes that all fall in the unread rest of a frame kept by its head
        (it passes over them), without the read: for a caller that need not hand such reads over. False, and
        nothing changed, when they do not all fall there or the stream forwards (its caller sends what feed says)."""
        skip = self._skip
        if n > skip or self.forwarding or self.failed:
            return False
        self._skip = skip - n
        self._buffer_offset += n
        return True

    def feed(self, data) -> tuple[list | None, list]:
        if self.failed:
            raise FrameError("the stream failed earlier; it cannot be re-synchronised")
        if not self._buffer and self._size < 0 and not self._skip and type(data) is bytes:
            whole = self._one_frame(data)  # the common read: exactly one frame, nothing held
            if whole is not None:
                return whole
        if self._parts is not None:
            return self._gather(data)
        forward = [] if self.forwarding else None
        frames: list = []
        skip = self._skip
        if skip:
            n = min(skip, len(data))
            self._skip = skip - n
            self._buffer_offset += n
            if forward is not None:
                forward.append(data if n == len(data) and type(data) is bytes else bytes(data[:n]))
            if n == len(data):
                return forward, frames
            data = memoryview(data)[n:]
        buf = self._buffer
        held = bool(buf)
        if held:
            buf += data
            view = memoryview(buf)
            sent = self._forwarded
        else:
            view = memoryview(data)
            sent = 0
        base = self._buffer_offset  # stream offset of view[0]
        end = len(view)
        pos = 0  # start of the frame being read
        size, mode, ticket = self._size, self._mode, self._ticket
        plan = self.plan
        head_bytes = self.head_bytes
        try:
            while True:
                if size < 0:
                    if end - pos < 4:
                        break
                    size = _SIZE.unpack_from(view, pos)[0]
                    if size < 0 or size > self.max_frame_bytes:
                        bad, size = size, -1
                        if bad < 0:
                            raise FrameError(f"negative frame size {bad}")
                        raise FrameTooLarge(bad, self.max_frame_bytes)
                    deciding = size if size < DECIDING_BYTES else DECIDING_BYTES
                    if end - pos - 4 < deciding:
                        size = -1
                        break
                    mode, ticket = plan(bytes(view[pos + 4 : pos + 4 + deciding]), size)
                    if (mode == KEEP_WHOLE or mode == KEEP_PIECES) and size > self.keep_limit:
                        mode = _OVER_LIMIT
                    if mode == HOLD and forward is not None and sent < pos:
                        forward.append(bytes(view[sent:pos]))
                        sent = pos
                if (mode == KEEP_HEAD and size > head_bytes) or mode == _OVER_LIMIT:
                    head = size if size < head_bytes else head_bytes
                    if end - pos - 4 < head:
                        break
                    frames.append((base + pos, size, bytes(view[pos + 4 : pos + 4 + head]), False, ticket, KEEP_HEAD))
                    have = end - pos - 4
                    if have < size:  # the frame runs on past this chunk: pass over the rest as it comes
                        self._skip = size - have
                        pos, size = end, -1
                        break
                    pos += 4 + size
                    size = -1
                    continue
                if end - pos - 4 < size:
                    break
                if mode == KEEP_PIECES and size >= self.pieces_min_bytes and not held and _immutable(data):
                    # whole in a read that nothing changes: a view of it, as the one piece it came in
                    frame = FramePieces((memoryview(data)[pos + 4 : pos + 4 + size],))
                else:
                    frame = bytes(view[pos + 4 : pos + 4 + size])
                frames.append((base + pos, size, frame, True, ticket, mode))
                pos += 4 + size
                if mode == HOLD and forward is not None:
                    forward.append(None)
                    sent = pos
                size = -1
        except FrameError as exc:
            self.failed = True
            exc.frames = frames
            if forward is not None:
                if sent < end:
                    forward.append(bytes(view[sent:end]))
                exc.forward = forward
            view.release()
            buf.clear()
            raise
        if forward is not None:
            # Forward what is settled: everything but a frame start not yet planned, or a held frame.
            frontier = pos if (size < 0 or mode == HOLD) else end
            if sent < frontier:
                whole_chunk = not held and sent == 0 and frontier == end and type(data) is bytes
                forward.append(data if whole_chunk else bytes(view[sent:frontier]))
                sent = frontier
        self._size, self._mode, self._ticket = size, mode, ticket
        self._forwarded = sent - pos if sent > pos else 0
        if size >= 0 and mode != _OVER_LIMIT and not (mode == KEEP_HEAD and size > head_bytes):
            self._parts = []  # a frame kept whole is under way: the next reads are gathered (see _gather)
        if held:
            view.release()
            if pos:
                del buf[:pos]
        else:
            if pos < end:
                if mode == KEEP_PIECES and self._parts == [] and _immutable(data):
                    # A frame to hand over in pieces begins in this read, which nothing changes: its
                    # part is kept as a view (not copied to the buffer), the first of its pieces.
                    self._parts.append(memoryview(data)[pos:])
                    self._parts_bytes = end - pos
                else:
                    buf += view[pos:]
            view.release()
        self._buffer_offset = base + pos
        return forward, frames
