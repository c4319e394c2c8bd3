"""Latency runs from the read that completed a request to the read that completed its response."""

from __future__ import annotations

import struct

from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session


def _framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def test_frames_completed_by_one_read_share_its_time(codec: Codec):
    session = Session(codec, ConnectionInfo(1, "c:1", "b:1"))
    header = {"RequestApiKey": 3, "RequestApiVersion": 12, "ClientId": "c"}
    body = {"Topics": None, "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False}
    answer = {"ThrottleTimeMs": 0, "Brokers": [], "ClusterId": "c", "ControllerId": 1, "Topics": []}
    # Three requests in one read at t=1.0, then the third alone completed at t=1.5 (cut across two reads).
    first, second, third = (_framed(codec.encode_request({**header, "CorrelationId": c}, body)) for c in (1, 2, 3))
    session.client_data(first + second + third[:5], 1.0)
    session.client_data(third[5:], 1.5)
    # The answers: two in one read at t=2.0, the last at t=2.25.
    responses = [_framed(codec.encode_response(3, 12, {"CorrelationId": c}, answer)) for c in (1, 2, 3)]
    events = session.broker_data(responses[0] + responses[1], 2.0).events + session.broker_data(responses[2], 2.25).events
    latencies = {e.request.correlation_id: e.latency for e in events if isinstance(e, Exchange)}
    assert latencies == {1: 1.0, 2: 1.0, 3: 0.75}
