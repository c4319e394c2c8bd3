"""What the proxy hands events to: observers, and a dispatcher that never lets one break forwarding."""

from __future__ import annotations

import logging
from typing import Iterable, Protocol

log = logging.getLogger("kinspect.proxy")


class Observer(Protocol):
    # Whether the observer decodes or scans bodies (events then keep whole frames up to
    # inspect.inspect_max_bytes). An observer without the attribute is assumed to.
    needs_bodies: bool

    def on_event(self, event) -> None: ...


class Dispatcher:
    """Calls every observer for every event; an observer that raises is counted, not propagated."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self.observers = list(observers)
        self.failures = 0

    def __bool__(self) -> bool:
        return bool(self.observers)

    @property
    def needs_bodies(self) -> bool:
        return any(getattr(o, "needs_bodies", True) for o in self.observers)

    def dispatch(self, events: list) -> None:
        for event in events:
            for observer in self.observers:
                try:
                    observer.on_event(event)
                except Exception:  # an observer's bug must never reach the relay
                    self.failures += 1
                    if self.failures <= 10:
                        log.exception("observer %r failed on %s", observer, type(event).__name__)


class EventLog:
    """Keeps every event (for tests and the offline tools); bounded by max_events."""

    needs_bodies = True

    def __init__(self, max_events: int = 1_000_000) -> None:
        self.events: list = []
        self.max_events = max_events

    def on_event(self, event) -> None:
        if len(self.events) < self.max_events:
            self.events.append(event)
