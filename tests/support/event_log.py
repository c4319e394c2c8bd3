"""An observer that keeps every event, for tests that look at what the sessions emitted."""

from __future__ import annotations


class EventLog:
    """Keeps every event; bounded by max_events."""

    needs_bodies = True

    def __init__(self, max_events: int = 1_000_000) -> None:
        self.events: list = []
        self.max_events = max_events

    def on_event(self, event) -> None:
        if len(self.events) < self.max_events:
            self.events.append(event)
