"""A large Fetch response reaches the observers in the pieces it came in, and reads as the same response:
header facts, scan (record sets summarized from the pieces), decode, and the metrics counted from it.

The session keeps Fetch responses with KEEP_PIECES (kinspect.session.plan), as it keeps Produce
requests: a consumer's megabyte responses were copied out of each read, or joined from several,
for a scan that reads only their headers and record-batch headers.
"""

from __future__ import annotations

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import native_available
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.session import ConnectionInfo, Plan, Response, Session, SessionConfig
from kinspect.session.events import frame_bytes
from kinspect.session.plan import KEEP_PIECES
from tests.support.proxy_harness import fetch, fetch_response, record_batch

CODEC = Codec()


def _records(n: int) -> list[bytes]:
    """n record sets of about 100 KB, two batches each."""
    return [record_batch([bytes([i]) * 1000] * 50) + record_batch([bytes([i + 1]) * 1000] * 50) for i in range(n)]


def _responses(request: bytes, data: bytes, read: int, native: bool = True, plan: Plan | None = None) -> list[Response]:
    session = Session(CODEC, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(), plan or Plan(True), native=native)
    session.client_data(request, 1.0)
    events = []
    for i in range(0, len(data), read):
        events += session.broker_data(data[i:i + read], 1.1).events
    assert session.inflight == 0
    return [e for e in events if type(e) is Response]


@pytest.mark.parametrize("native", [True, False], ids=["C-reads", "python-reads"])
@pytest.mark.parametrize("version, header_tags", [(4, b""), (12, b""), (12, b"\x01\x07\x02hi")],
                         ids=["header-v0", "header-v1", "header-v1-tagged"])
def test_a_fetch_response_in_pieces_reads_as_the_whole_one(version, header_tags, native):
    request = fetch(CODEC, 5, "orders", version=version)
    data = fetch_response(CODEC, 5, "orders", _records(3) + [None], version=version, error_codes=[0, 0, 6, 3],
                          header_tags=header_tags)
    (whole,) = _responses(request, data, len(data), native)  # one read: one piece, a view of it
    (pieces,) = _responses(request, data, 64 * 1024, native)  # reads of 64 KiB: pieces
    (joined,) = _responses(request, data, 1000, native)  # small reads: joined, as any frame kept whole
    assert type(whole.frame) is FramePieces and len(whole.frame) == 1 and whole.frame[0].obj is data
    assert type(pieces.frame) is FramePieces and len(pieces.frame) > 1
    assert type(joined.frame) is bytes
    assert frame_bytes(pieces.frame) == frame_bytes(whole.frame) == joined.frame == data[4:]
    for e in (whole, pieces):
        assert (e.header_version, e.header_size, e.header_tag_bytes, e.header_tags) == (
            joined.header_version, joined.header_size, joined.header_tag_bytes, joined.header_tags)
        assert e.complete and e.size == joined.size and e.correlation_id == 5
    if header_tags:
        assert joined.header_tags == ((7, 2),)
    scanned, expected = pieces.scan(), joined.scan()
    if native_available():  # the C scanner reads in place; the pure-Python one joins the pieces first
        assert scanned.source is pieces.frame
    assert scanned.to_dict() == whole.scan().to_dict() == expected.to_dict()
    assert [len(s.batches) for s in scanned.records] == [2, 2, 2] and scanned.error_codes == {6: 1, 3: 1}
    assert pieces.decode().body == joined.decode().body == CODEC.decode_response(pieces.frame, 1, version).body


def test_the_plan_keeps_fetch_responses_in_pieces_only_when_their_bodies_are_read():
    assert Plan(True).response_mode(1, 12) == KEEP_PIECES
    assert Plan(True).response_mode(3, 12) != KEEP_PIECES  # Metadata: small, kept whole
    assert Plan(False).response_mode(1, 12) != KEEP_PIECES  # bodies nobody reads: their head
    request = fetch(CODEC, 5, "orders")
    data = fetch_response(CODEC, 5, "orders", _records(1))
    (head,) = _responses(request, data, 64 * 1024, plan=Plan(False))
    assert type(head.frame) is bytes and not head.complete and len(head.frame) == 512


@pytest.mark.parametrize("native", [True, False], ids=["C-reads", "python-reads"])
def test_a_response_whose_request_was_forgotten_is_reported_with_its_bytes(native):
    """inspect.max_inflight dropped the request's facts: the response is an unpaired_response Problem, whose
    frame is bytes (joined) as for any other Problem."""
    session = Session(CODEC, ConnectionInfo(1, "c:1", "b:1"), SessionConfig(max_inflight=1), Plan(True),
                      native=native)
    session.client_data(fetch(CODEC, 5, "orders") + fetch(CODEC, 6, "orders"), 1.0)
    data = fetch_response(CODEC, 5, "orders", _records(1))
    events = []
    for i in range(0, len(data), 32 * 1024):
        events += session.broker_data(data[i:i + 32 * 1024], 1.1).events
    (problem,) = [e for e in events if type(e).__name__ == "Problem" and e.kind == "unpaired_response"]
    assert type(problem.frame) is bytes and problem.frame == data[4:]
