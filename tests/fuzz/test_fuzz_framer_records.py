"""Hostile streams for the framers and hostile record sets for the records summary, C and Python alike.

The pipeline's framing: frames or FrameError, the same frames whatever the chunking, whole
and head-keeping streams and split_frames agreeing, and no allocation for a size that has not arrived.
The records summary: a summary or RecordsError (the summary's own error, a ValueError),
the C twin equal to the Python reference on every input (message included), through
ScanResult too (None where the records bytes are not a record set).
"""

from __future__ import annotations

import importlib.util
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect.protocol.framing.framer import FrameError, FrameTooLarge, split_frames
from tests.support.framers import head_framer, whole_framer
from kinspect.protocol.records import RecordsError, summarize_records, summarize_records_python
from tests.protocol.test_records import GZIP, NONE, mixed_record_set, v2_batch
from tests.support.paths import ROOT

_spec = importlib.util.spec_from_file_location(
    "fuzz_codec", ROOT / "fuzz" / "fuzz_codec.py")
fuzz_codec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_codec)

pytestmark = pytest.mark.timeout(120)
_BOUNDED = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MIXED = mixed_record_set()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@st.composite
def streams(draw) -> bytes:
    """Valid frames, with now and then a hostile size prefix or garbage between them."""
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["frame", "frame", "frame", "negative", "huge", "garbage", "empty"]))
        if kind == "frame":
            parts.append(frame(draw(st.binary(max_size=300))))
        elif kind == "negative":
            parts.append(struct.pack(">i", draw(st.integers(-(2**31), -1))))
        elif kind == "huge":
            parts.append(struct.pack(">i", draw(st.integers(4097, 2**31 - 1))))
        elif kind == "empty":
            parts.append(frame(b""))
        else:
            parts.append(draw(st.binary(min_size=1, max_size=12)))
    return b"".join(parts)


@settings(max_examples=300, **_BOUNDED)
@given(stream=streams(), chunk=st.integers(0, 40))
def test_framers_agree_on_hostile_streams(stream, chunk):
    """The atheris harness's stream check: the pipeline's FrameStream and split_frames cut alike or fail alike."""
    fuzz_codec.check_stream(bytes([chunk]) + stream)


@settings(max_examples=200, **_BOUNDED)
@given(stream=streams(), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_chunking_never_changes_the_frames(stream, cuts):
    """Fed all at once, one byte at a time, or at random cuts: the same frames, the same failure."""

    def run(pieces):
        framer, frames = whole_framer(4096), []
        try:
            for piece in pieces:
                frames += framer.feed(piece)
        except FrameError as exc:
            return frames + exc.frames, type(exc)  # what the failing feed completed is not lost
        return frames, None

    edges = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    at_once = run([stream])
    assert run([stream[i:i + 1] for i in range(len(stream))]) == at_once
    assert run([stream[a:b] for a, b in zip(edges, edges[1:])]) == at_once


@pytest.mark.parametrize("size", [-1, -(2**31), 4097, 2**31 - 1])
def test_bad_size_fails_and_stays_failed(size):
    for make in (lambda: whole_framer(4096), lambda: head_framer(4096, keep_limit=256)):
        framer = make()
        with pytest.raises(FrameTooLarge if size > 0 else FrameError, match=str(size)):
            framer.feed(frame(b"ok") + struct.pack(">i", size) + b"rest")
        assert framer.failed
        with pytest.raises(FrameError, match="cannot be re-synchronised"):
            framer.feed(frame(b"more"))
    with pytest.raises(FrameError, match=f"bad frame size {size} at byte 6"):
        split_frames(frame(b"ok") + struct.pack(">i", size), 4096)


def test_a_claimed_size_allocates_nothing_until_it_arrives():
    """A 100 MiB size prefix (allowed) followed by a trickle: memory follows the bytes, not the claim."""
    claim = 100 * 1024 * 1024
    tracemalloc.start()
    try:
        framer, splitter = whole_framer(), head_framer()
        for feed in (framer.feed, splitter.feed):
            assert feed(struct.pack(">i", claim)) == []
        for _ in range(64):
            assert framer.feed(b"\x00" * 1024) == []
        out = [splitter.feed(b"\x00" * 1024) for _ in range(64)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out[0] == [(claim, b"\x00" * 512, False)] and not any(out[1:])  # the head, once, then only counting
    assert framer.buffered == 4 + 64 * 1024
    assert splitter.buffered == 0
    assert peak < 1024 * 1024, peak


# ----------------------------------------------------------------------------- records


def summaries_agree(data: bytes) -> None:
    """The atheris harness's records check (C equals Python, same RecordsError), with the outcome checked here too."""
    fuzz_codec.check_records(data)
    try:
        summary = summarize_records(data)
    except RecordsError as exc:
        assert exc.offset is not None and 0 <= exc.offset <= len(data)
        return
    assert summary.total_bytes == len(data)
    assert 0 <= summary.truncated_bytes <= len(data)


HOSTILE_INT32 = [-1, -(2**31), 0, 13, 48, 49, 2**31 - 1, 0x00FFFFFF]
FIELDS = {"length": 8, "magic": 16, "attributes": 21, "count": 57}  # byte offsets inside a batch


@settings(max_examples=300, **_BOUNDED)
@given(data=st.data())
def test_mutated_record_sets(data):
    base = bytes(data.draw(st.sampled_from([MIXED, bytes(v2_batch(NONE, n=2)), bytes(v2_batch(GZIP, n=1))])))
    kind = data.draw(st.sampled_from(["cut", "flip", "field", "insert", "delete", "random"]))
    if kind == "cut":
        mutated = base[:data.draw(st.integers(0, len(base)))]
    elif kind == "flip":
        out = bytearray(base)
        for _ in range(data.draw(st.integers(1, 4))):
            bit = data.draw(st.integers(0, len(base) * 8 - 1))
            out[bit // 8] ^= 1 << (bit % 8)
        mutated = bytes(out)
    elif kind == "field":
        out = bytearray(base)
        where = FIELDS[data.draw(st.sampled_from(sorted(FIELDS)))]
        if where == 16:
            out[where] = data.draw(st.integers(0, 255))
        elif where == 21:
            out[where:where + 2] = struct.pack(">h", data.draw(st.integers(-(2**15), 2**15 - 1)))
        else:
            out[where:where + 4] = struct.pack(">i", data.draw(st.sampled_from(HOSTILE_INT32)))
        mutated = bytes(out)
    elif kind == "insert":
        at = data.draw(st.integers(0, len(base)))
        mutated = base[:at] + data.draw(st.binary(min_size=1, max_size=16)) + base[at:]
    elif kind == "delete":
        at = data.draw(st.integers(0, len(base)))
        mutated = base[:at] + base[at + data.draw(st.integers(1, 16)):]
    else:
        mutated = data.draw(st.binary(max_size=200))
    summaries_agree(mutated)


def test_every_truncation_of_a_mixed_set():
    for cut in range(len(MIXED) + 1):
        summaries_agree(MIXED[:cut])


@pytest.mark.parametrize("length", HOSTILE_INT32)
def test_hostile_batch_lengths(length):
    """Negative and huge batch lengths: RecordsError or a truncated batch; nothing allocated for the claim."""
    data = bytearray(v2_batch(NONE, n=1))
    data[8:12] = struct.pack(">i", length)
    tracemalloc.start()
    try:
        summaries_agree(bytes(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak
    try:
        summary = summarize_records_python(bytes(data))
    except RecordsError as exc:
        if length < 49:  # too small for a v2 batch: the length itself is named
            assert exc.offset == 8 and ("length" in exc.reason or "size" in exc.reason), exc
        else:  # a short length puts the next entry inside this one: rejected there, not at the first
            assert exc.offset > 12 + length, exc
    else:
        first = summary.batches[0]
        assert length >= 49 and first.batch_length == length
        assert first.truncated == (12 + length > len(data))


@settings(max_examples=150, **_BOUNDED)
@given(case=st.sampled_from([(0, v) for v in range(3, 14)]), records=st.binary(max_size=120))
def test_hostile_records_inside_produce_requests(case, records):
    """A Produce request carrying hostile records bytes: the scan's summaries are the reference's (None where invalid)."""
    _, version = case
    compiled = fuzz_codec.CODEC.body(0, "request", version)
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
            "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": records}]}]}
    if version >= 13:
        import uuid

        body["TopicData"][0]["TopicId"] = uuid.UUID(int=1)
        body["TopicData"][0].pop("Name")
    encoded = bytes(compiled.encode(body))
    fuzz_codec.agree(compiled, encoded, 0)
    result = compiled.scan(encoded)
    assert len(result.records) == 1
    try:
        expected = summarize_records_python(records)
    except RecordsError:
        expected = None
    assert result.records[0] == expected
