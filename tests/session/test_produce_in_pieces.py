"""A large Produce request that spans reads reaches the observers in the pieces it came in, and
reads as the same request: header, acks, scan (record batches included) and decode.

The session keeps Produce requests with KEEP_PIECES (kinspect.session.plan): the C scanner
reads them where they lie, so the request is never joined for the metrics' scan. Whatever
reads them whole (a decode) joins them once.
"""

from __future__ import annotations

import random
import struct

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import native_available
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.protocol.framing.stream import KEEP_PIECES, FrameStream
from kinspect.session import ConnectionInfo, Plan, Request, Session, SessionConfig
from kinspect.session.events import frame_bytes
from tests.support.proxy_harness import record_batch

CODEC = Codec()


def _produce(version: int, acks: int, client_id: str = "pieces", transactional_id: str | None = None) -> bytes:
    """A framed Produce request of ~300 KB: three partitions of a few record batches each."""
    batches = [record_batch([bytes([i]) * 3000 for _ in range(30)]) for i in range(3)]
    body = {"TransactionalId": transactional_id, "Acks": acks, "TimeoutMs": 1000,
            "TopicData": [{"Name": "orders", "PartitionData": [{"Index": p, "Records": b"".join(batches)}
                                                               for p in range(3)]}]}
    frame = CODEC.encode_request({"RequestApiKey": 0, "RequestApiVersion": version, "CorrelationId": 7,
                                  "ClientId": client_id}, body)
    return struct.pack(">i", len(frame)) + frame


def _requests(data: bytes, read: int) -> list[Request]:
    session = Session(CODEC, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(inspect_max_bytes=1 << 21), Plan(True))
    events = []
    for i in range(0, len(data), read):
        events += session.client_data(data[i:i + read], 1.0).events
    return [e for e in events if type(e) is Request]


@pytest.mark.parametrize("version, acks, client_id, transactional_id", [
    (9, 1, "pieces", None), (9, 0, "pieces", None), (3, -1, "pieces", "tx"),
    (9, 0, "c" * 6000, "t" * 5000),  # a header and a TransactionalId longer than the session's head
])
def test_a_produce_request_in_pieces_reads_as_the_whole_one(version, acks, client_id, transactional_id):
    data = _produce(version, acks, client_id, transactional_id)
    (whole,) = _requests(data, len(data))  # one read: one piece, a view of it
    (pieces,) = _requests(data, 64 * 1024)  # reads of 64 KiB: pieces
    assert type(whole.frame) is FramePieces and len(whole.frame) == 1 and whole.frame[0].obj is not None
    assert type(pieces.frame) is FramePieces and len(pieces.frame) > 1
    assert frame_bytes(pieces.frame) == frame_bytes(whole.frame) == data[4:]
    assert pieces.header == whole.header and pieces.header.client_id == client_id
    assert pieces.expects_response == whole.expects_response == (acks != 0)
    scanned, expected = pieces.scan(), whole.scan()
    if native_available():  # the C scanner reads in place; the pure-Python one joins the pieces first
        assert scanned.source is pieces.frame
    assert scanned.to_dict() == expected.to_dict() and len(scanned.records[0].batches) == 3
    assert pieces.decode().body == whole.decode().body


def test_small_reads_are_joined():
    """Pieces are handed over only when they average PIECES_MIN_BYTES: a request that came in
    small reads is joined once, as any frame kept whole."""
    data = _produce(9, 1)
    (request,) = _requests(data, 1000)
    assert type(request.frame) is bytes and request.frame == data[4:]


def test_the_stream_hands_over_views_of_bytes_reads_and_copies_of_others():
    """A frame in pieces is views of the bytes reads it began and ended in and the reads between;
    a read that is not bytes is copied, as the caller may reuse it. Nothing is joined."""
    payload = random.Random(1).randbytes(200_000)
    data = struct.pack(">i", len(payload)) + payload
    stream = FrameStream(lambda first, size: (KEEP_PIECES, None), 1 << 21, 1 << 21)
    reused = bytearray(50_000)
    frames = []
    for i in range(0, len(data), 50_000):
        chunk = data[i:i + 50_000]
        if i == 50_000:
            reused[:len(chunk)] = chunk
            chunk = reused
        frames += stream.feed(chunk)[1]
        reused[:] = bytes(len(reused))
    (frame,) = frames
    assert type(frame[2]) is FramePieces and frame[2].join() == payload
    first, copied = frame[2][0], frame[2][1]
    assert type(first) is memoryview and first.obj is not None and type(first.obj) is bytes  # a view, not a copy
    assert type(copied) is bytes  # the reused bytearray read, copied
    assert stream.buffered == 0


def test_a_frame_begun_in_the_buffer_hands_the_buffer_over():
    """A frame whose first bytes came with the end of another in a read that was not bytes starts in
    the stream's buffer: that buffer goes with the frame, and a new one takes its place."""
    payload = random.Random(2).randbytes(100_000)
    data = struct.pack(">i", len(payload)) + payload
    stream = FrameStream(lambda first, size: (KEEP_PIECES, None), 1 << 21, 1 << 21)
    frames = stream.feed(bytearray(data[:30_000]))[1]  # not bytes: its part is copied to the buffer
    for i in range(30_000, len(data), 30_000):
        frames += stream.feed(data[i:i + 30_000])[1]
    (frame,) = frames
    assert type(frame[2][0].obj) is bytearray and frame[2].join() == payload
    assert stream.buffered == 0 and stream.feed(data[:8])[1] == [] and stream.buffered == 8


def test_observed_requests_let_go_of_their_pieces():
    """Once every observer saw a request kept in pieces, the Dispatcher releases its reads: the
    Exchange that follows carries the same scan (records summarized), and no frame; a decode says so.
    An observer of Exchanges that reads bodies (the capture) gets the scan made before the release;
    with none, nothing is scanned."""
    from kinspect.proxy.observers import Dispatcher
    from kinspect.protocol.errors import DecodeError
    from kinspect.session import Exchange

    class Scanning:  # as the metrics: scans each request
        needs_bodies = True
        event_types = (Request,)

        def __init__(self) -> None:
            self.seen = []

        def on_event(self, event) -> None:
            self.seen.append((type(event.frame), event.scan()))

    class Later:  # as the capture: reads the scans of Exchanges
        needs_bodies = True
        event_types = (Exchange,)

        def __init__(self) -> None:
            self.seen = []

        def on_event(self, event) -> None:
            self.seen.append(event.request.scan())

    data = _produce(9, 1)
    answer = CODEC.encode_response(0, 9, {"CorrelationId": 7}, {"Responses": [], "ThrottleTimeMs": 0})
    for observers in ([Scanning()], [Later()], [Scanning(), Later()], []):
        dispatcher = Dispatcher(observers)
        session = Session(CODEC, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(inspect_max_bytes=1 << 21),
                          Plan(True))
        for i in range(0, len(data), 64 * 1024):
            dispatcher.dispatch(session.client_data(data[i:i + 64 * 1024], 1.0).events)
        (pending,) = session._inflight.values()
        request = pending.request
        assert request.frame is None and request.complete
        with pytest.raises(DecodeError, match="released once its request was observed"):
            request.decode()
        if not observers:  # nobody reads its body: released unscanned
            assert request._scanned is None
            with pytest.raises(DecodeError, match="released"):
                request.scan()
            continue
        scan = request.scan()
        assert scan.source is None and len(scan.records[0].batches) == 3
        if type(observers[0]) is Scanning:
            ((frame_type, seen),) = observers[0].seen
            assert frame_type is FramePieces and seen is scan  # observers see the pieces
        dispatcher.dispatch(session.broker_data(struct.pack(">i", len(answer)) + answer, 1.1).events)
        if type(observers[-1]) is Later:
            assert observers[-1].seen == [scan]  # the capture's scan at the Exchange: the one kept


def test_a_request_whole_in_one_read_is_a_view_of_it():
    """A frame kept in pieces that arrives whole in a bytes read (alone, or after another frame) is handed over
    as one view of that read, not copied; one under PIECES_MIN_BYTES, or in a read that is not bytes, is copied."""
    from kinspect.protocol.framing.stream import PIECES_MIN_BYTES

    large, small = random.Random(3).randbytes(50_000), random.Random(4).randbytes(PIECES_MIN_BYTES - 1)
    data = b"".join(struct.pack(">i", len(p)) + p for p in (small, large, large))
    stream = FrameStream(lambda first, size: (KEEP_PIECES, None), 1 << 21, 1 << 21)
    frames = [f[2] for f in stream.feed(data)[1]]
    assert type(frames[0]) is bytes and frames[0] == small
    for frame in frames[1:]:
        assert type(frame) is FramePieces and len(frame) == 1 and frame[0].obj is data and frame.join() == large
    one = struct.pack(">i", len(large)) + large
    (alone,) = [f[2] for f in stream.feed(one)[1]]  # one frame a read: the stream's shortcut
    assert type(alone) is FramePieces and alone[0].obj is one
    (copied,) = [f[2] for f in stream.feed(bytearray(one))[1]]  # the caller may reuse a bytearray
    assert type(copied) is bytes and copied == large


def test_a_produce_in_pieces_is_scanned_by_the_c_scan_at_once(monkeypatch):
    """Once the codec made Produce's C scan, a request in pieces is scanned by it directly (the
    metrics ask every large Produce for its scan), with the facts Codec.scan_request gives."""
    data = _produce(9, 1)
    (first,) = _requests(data, 64 * 1024)
    first.scan()  # the codec makes the scan of Produce v9 requests, and notes it
    (pieces,) = _requests(data, 64 * 1024)
    assert type(pieces.frame) is FramePieces and len(pieces.frame) > 1
    scan_request = CODEC.scan_request
    expected = scan_request(pieces.frame, pieces.header)
    asked = []
    monkeypatch.setattr(CODEC, "scan_request", lambda *args: asked.append(args) or scan_request(*args))
    scanned = pieces.scan()
    assert scanned.to_dict() == expected.to_dict() and len(scanned.records[0].batches) == 3
    assert scanned.records == expected.records
    if native_available():
        assert asked == [] and scanned.source is pieces.frame  # the C scan, reading the pieces in place
    else:
        assert len(asked) == 1  # the pure-Python codec has no C scan to call
