"""An observer that keeps every event, for tests that look at what the sessions emitted."""

from __future__ import annotations

from kinspect.protocol.framing.pieces import FramePieces


class EventLog:
    """Keeps every event; bounded by max_events (keep_frames: every request's bytes too, joined)."""

    needs_bodies = True

    def __init__(self, max_events: int = 1_000_000, keep_frames: bool = False) -> None:
        self.events: list = []
        self.max_events = max_events
        self.keep_frames = keep_frames

    def on_event(self, event) -> None:
        if len(self.events) < self.max_events:
            if self.keep_frames and type(getattr(event, "frame", None)) is FramePieces:
                # A request in the pieces it came in is let go of once the observers saw it (Dispatcher):
                # with keep_frames the log keeps its bytes, for tests that read them afterwards.
                event.frame = event.frame.join()
            self.events.append(event)
