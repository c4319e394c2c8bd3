"""The framer: any chunking gives the same frames; bad sizes are reported, never buffered."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.protocol.framing.framer import FrameError, FrameTooLarge, split_frames
from tests.support.framers import head_framer, whole_framer


def _stream(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), max_size=12), seed=st.integers(0, 2**32))
def test_any_chunking_gives_the_same_frames(payloads, seed):
    data = _stream(payloads)
    rng = random.Random(seed)
    framer = whole_framer()
    got = []
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 64)
        got.extend(framer.feed(data[pos : pos + step]))
        pos += step
    assert got == payloads
    assert framer.buffered == 0


def test_one_byte_at_a_time():
    payloads = [b"a" * 5, b"", b"xyz" * 100]
    framer = whole_framer()
    data = _stream(payloads)
    got = [f for i in range(len(data)) for f in framer.feed(data[i : i + 1])]
    assert got == payloads


def test_partial_frame_is_held():
    framer = whole_framer()
    assert framer.feed(struct.pack(">i", 10) + b"12345") == []
    assert framer.buffered == 9
    assert framer.feed(b"67890\x00\x00") == [b"1234567890"]
    assert framer.buffered == 2


def test_too_large_frame_is_reported_without_buffering():
    framer = whole_framer(max_frame_bytes=1024)
    with pytest.raises(FrameTooLarge) as info:
        framer.feed(struct.pack(">i", 2**31 - 1))
    assert info.value.size == 2**31 - 1 and "exceeds the 1024-byte limit" in str(info.value)
    with pytest.raises(FrameError):
        framer.feed(b"more")


def test_negative_size():
    with pytest.raises(FrameError, match="negative"):
        whole_framer().feed(struct.pack(">i", -5))


def test_split_frames_counts_trailing_bytes():
    data = _stream([b"ab", b"cde"]) + b"\x00\x00\x00\x09abc"
    frames, trailing = split_frames(data)
    assert [f for _, f in frames] == [b"ab", b"cde"]
    assert [o for o, _ in frames] == [0, 6]
    assert trailing == 7


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(max_size=400), max_size=10), seed=st.integers(0, 2**32),
       keep=st.integers(0, 300), head=st.integers(1, 64))
def test_splitter_any_chunking_gives_whole_frames_or_heads(payloads, seed, keep, head):

    data = _stream(payloads)
    rng = random.Random(seed)
    splitter = head_framer(keep_limit=keep, head_bytes=head)
    got = []
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 97)
        got.extend(splitter.feed(data[pos : pos + step]))
        pos += step
    expected = [(len(p), p, True) if len(p) <= keep else (len(p), p[:head], False) for p in payloads]
    assert got == expected
    assert splitter.buffered == 0
