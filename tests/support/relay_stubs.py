"""What tests of relays without sockets share: a transport that keeps what was written, and an event's facts as a tuple to compare."""

from __future__ import annotations

from kinspect.session import Exchange, Problem, Request, Response
from kinspect.session.events import frame_bytes


class RecordingTransport:
    """A transport stub for Relay: what is written is kept, as bytes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, key):
        return ("127.0.0.1", 1) if key == "peername" else None


def event_fact(event) -> tuple:
    """What an observer can read of an event (a frame let go of after the observers saw it: None)."""
    if isinstance(event, (Request, Response)):
        frame = None if event.frame is None else frame_bytes(event.frame)
        tags = (event.header_tags,) if isinstance(event, Request) else ()
        return (type(event).__name__, event.time, event.offset, event.api_key, event.api_version,
                event.correlation_id, event.size, *tags, event.complete, frame)
    if isinstance(event, Exchange):
        return ("Exchange", event.request.correlation_id, event.latency)
    assert isinstance(event, Problem)
    return ("Problem", event.time, event.kind, event.direction, event.detail)
