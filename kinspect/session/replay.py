"""Replays a recorded connection (its two byte streams, no timing) through a session in a plausible order.

A recording keeps what each side sent but not when. The replay sends the client's frames
one at a time, and after each the broker frames the session is waiting for (a response to
a request in flight, or a raw SASL token), so that the session meets them in the order the
protocol implies, as it would live: KIP-511 fallbacks and SASL v0 raw tokens included.
Only the size prefixes are read here, to cut the client stream at frame ends; the session
frames, pairs and reports as it does for the proxy.
"""

from __future__ import annotations

import struct
from typing import Iterator

from kinspect.session.session import Session

_SIZE = struct.Struct(">i")


def frame_ends(data: bytes) -> Iterator[int]:
    """Offsets just past each whole frame; a bad size or a short tail ends the walk (the session reports it)."""
    pos, end = 0, len(data)
    while end - pos >= 4:
        size = _SIZE.unpack_from(data, pos)[0]
        if size < 0 or end - pos - 4 < size:
            return
        pos += 4 + size
        yield pos


def replay(session: Session, requests: bytes, responses: bytes = b"", now: float = 0.0) -> Iterator[list]:
    """Feed both streams; yield the events of each step, in order."""
    sent_broker = 0
    broker_ends = list(frame_ends(responses))
    next_broker = 0
    sent_client = 0
    for end in frame_ends(requests):
        yield session.client_data(requests[sent_client:end], now).events
        sent_client = end
        while next_broker < len(broker_ends) and session.awaits(responses[sent_broker + 4 : sent_broker + 8]):
            end_b = broker_ends[next_broker]
            yield session.broker_data(responses[sent_broker:end_b], now).events
            sent_broker, next_broker = end_b, next_broker + 1
    if sent_client < len(requests):
        yield session.client_data(requests[sent_client:], now).events
    if sent_broker < len(responses):
        yield session.broker_data(responses[sent_broker:], now).events
