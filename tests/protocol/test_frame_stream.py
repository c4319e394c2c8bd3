"""FrameStream with plans: any chunking gives the frames and the forwarded bytes a plain reading of the stream gives.

The expected outcome is computed from the frames themselves, not by the stream: what each
mode keeps, and the bytes forwarded with a placeholder for each held frame. Large frames
cross many reads (the path that gathers a frame's reads and joins them once), and a
stream cut anywhere gives back, through `end()`, exactly the bytes it did not forward.
"""

from __future__ import annotations

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.framing.stream import HOLD, KEEP_HEAD, KEEP_PIECES, KEEP_WHOLE, FrameStream

MODES = (KEEP_WHOLE, KEEP_HEAD, HOLD, KEEP_PIECES)


def _expected(payloads, modes, keep: int, head: int, forwarding: bool):
    """(frames, forwarded pieces) as the plans say, with None standing for each held frame."""
    frames, pieces, offset = [], [], 0
    for i, (payload, mode) in enumerate(zip(payloads, modes)):
        size = len(payload)
        if mode == HOLD and not forwarding:
            mode_out, data, complete = HOLD, payload, True  # nothing is forwarded: held is kept whole
        elif mode == HOLD:
            mode_out, data, complete = HOLD, payload, True
        elif (mode in (KEEP_WHOLE, KEEP_PIECES) and size > keep) or (mode == KEEP_HEAD and size > head):
            mode_out, data, complete = KEEP_HEAD, payload[:head], False
        else:
            mode_out, data, complete = mode, payload, True
        frames.append((offset, size, data, complete, i, mode_out))
        pieces.append(None if mode == HOLD else struct.pack(">i", size) + payload)
        offset += 4 + size
    return frames, pieces


def _normalised(pieces) -> list:
    """Adjacent byte pieces joined, so that two cuttings of the same bytes compare equal."""
    out: list = []
    for piece in pieces:
        if piece is not None and out and out[-1] is not None:
            out[-1] += bytes(piece)
        elif piece is not None:
            if len(piece):
                out.append(bytes(piece))
        else:
            out.append(None)
    return out


def _stream(modes, keep: int, head: int, forwarding: bool) -> FrameStream:
    plans = iter(enumerate(modes))

    def plan(first: bytes, size: int):
        index, mode = next(plans)
        return mode, index

    return FrameStream(plan, 1 << 20, keep, head, forwarding=forwarding, pieces_min_bytes=1)  # pieces of any size


def _cut(data: bytes, rng: random.Random) -> list:
    out, pos = [], 0
    while pos < len(data):
        step = rng.choice((1, 3, 8, 13, 100, 700, 5000))
        chunk = data[pos : pos + step]
        kind = rng.random()  # reads need not be bytes, and a bytearray read may be reused by the caller
        out.append(chunk if kind < 0.6 else memoryview(chunk) if kind < 0.8 else bytearray(chunk))
        pos += step
    return out


frames_strategy = st.lists(st.tuples(st.integers(0, 12000), st.sampled_from(MODES)), max_size=8)


@settings(max_examples=150, deadline=None)
@given(frames=frames_strategy, seed=st.integers(0, 2**32), keep=st.integers(0, 9000), head=st.integers(1, 600),
       forwarding=st.booleans())
def test_any_chunking_gives_the_planned_frames_and_bytes(frames, seed, keep, head, forwarding):
    rng = random.Random(seed)
    payloads = [rng.randbytes(size) for size, _ in frames]
    modes = [mode for _, mode in frames]
    data = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    stream = _stream(modes, keep, head, forwarding)
    got_frames, got_pieces = [], []
    for chunk in _cut(data, rng):
        forward, new = stream.feed(chunk)
        got_frames += new  # read only at the end: a frame must not change as the caller reuses its reads
        if forwarding:
            got_pieces += [None if p is None else bytes(p) for p in forward]
        else:
            assert forward is None
        if type(chunk) is bytearray:
            chunk[:] = bytes(len(chunk))  # the caller reads into it again
    want_frames, want_pieces = _expected(payloads, modes, keep, head, forwarding)
    # KEEP_PIECES: a frame that spanned reads comes in pieces (bytes or views, the first its own buffer).
    assert all(type(f[2]) is bytes or (type(f[2]) is FramePieces and f[5] == KEEP_PIECES) for f in got_frames)
    assert [(o, s, d.join() if type(d) is FramePieces else bytes(d), c, t, m)
            for o, s, d, c, t, m in got_frames] == want_frames
    if forwarding:
        assert _normalised(got_pieces) == _normalised(want_pieces)
    assert stream.buffered == 0 and stream.in_progress is None


@settings(max_examples=150, deadline=None)
@given(frames=frames_strategy.filter(bool), seed=st.integers(0, 2**32), cut=st.floats(0, 1))
def test_a_stream_cut_short_gives_back_every_byte_not_forwarded(frames, seed, cut):
    """What was forwarded, the held frames completed, and end() make up every byte read, in order."""
    rng = random.Random(seed)
    payloads = [rng.randbytes(size) for size, _ in frames]
    modes = [mode for _, mode in frames]
    data = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    data = data[: int(len(data) * cut)]
    stream = _stream(modes, 1 << 20, 64, forwarding=True)
    sent, held = [], []
    for chunk in _cut(data, rng):
        forward, new = stream.feed(chunk)
        held += [f for f in new if f[5] == HOLD]
        for piece in forward:
            if piece is None:  # a held frame, complete: its bytes as they came
                frame = held.pop(0)
                sent.append(struct.pack(">i", frame[1]) + frame[2])
            else:
                sent.append(bytes(piece))
    buffered = stream.buffered
    unsent = stream.end()
    assert b"".join(sent) + unsent == data
    assert len(unsent) <= buffered


def test_a_large_frame_across_many_reads_is_one_frame_and_passes_as_read():
    payload = random.Random(1).randbytes(1_000_000)
    data = struct.pack(">i", len(payload)) + payload + struct.pack(">i", 3) + b"abc"
    stream = FrameStream(lambda first, size: (KEEP_WHOLE, None), 1 << 21, 1 << 21, forwarding=True)
    frames, sent = [], []
    for pos in range(0, len(data), 65536):
        forward, new = stream.feed(data[pos : pos + 65536])
        frames += new
        sent += forward
        if not new:
            assert stream.buffered == pos + len(data[pos : pos + 65536])
    assert [f[2] for f in frames] == [payload, b"abc"] and all(f[3] for f in frames)
    assert b"".join(sent) == data
