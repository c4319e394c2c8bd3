"""What the proxy hands events to: observers, and a dispatcher that never lets one break forwarding."""

from __future__ import annotations

import logging
from typing import Iterable, Protocol

from kinspect.protocol.errors import DecodeError
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.session import Exchange, Problem, Request, Response

EVENT_TYPES = (Request, Response, Exchange, Problem)

log = logging.getLogger("kinspect.proxy")


class Observer(Protocol):
    # Whether the observer decodes or scans bodies (events then keep whole frames up to
    # inspect.inspect_max_bytes). An observer without the attribute is assumed to. An
    # observer may instead say it per frame kind: wants_body(api_key, version, direction).
    # A large request kept in pieces (a Produce) is released once every observer saw it: an
    # Exchange then carries its scan, not its frame (Dispatcher._release).
    needs_bodies: bool
    # The event types it reads (optional): the dispatcher hands it only those.
    event_types: tuple
    # Optional: {event type: method} called instead of on_event for those types (one call per
    # event instead of on_event's call and its own switch on the type).
    handlers: dict

    def on_event(self, event) -> None: ...


class Dispatcher:
    """Calls every observer for every event; an observer that raises is counted, not propagated."""

    # Slots: kinspect/proxy/_batch.c loads the routes at their offsets on every read.
    __slots__ = ("observers", "failures", "_routes", "_routed", "_bodies_later")

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self.observers = list(observers)
        self.failures = 0
        self._route()

    def __bool__(self) -> bool:
        return bool(self.observers)

    def body_predicate(self):
        """For the session plan: True, False, or wants_body(api_key, version, direction) over the observers."""
        predicates = []
        for observer in self.observers:
            wants = getattr(observer, "wants_body", None)
            if wants is not None:
                predicates.append(wants)
            elif getattr(observer, "needs_bodies", True):
                return True
        if not predicates:
            return False
        return lambda api_key, version, direction: any(p(api_key, version, direction) for p in predicates)

    def _route(self) -> dict:
        """Event type -> the observers that take it (`event_types`; an observer that does not say takes all)."""
        routes: dict = {kind: [] for kind in EVENT_TYPES}
        for observer in self.observers:
            handlers = getattr(observer, "handlers", None) or {}
            for kind in getattr(observer, "event_types", EVENT_TYPES):
                routes[kind].append(handlers.get(kind, observer.on_event))
        self._routes, self._routed = routes, list(self.observers)
        # Whether an observer of Exchange events reads bodies (a large request is scanned before it is released).
        self._bodies_later = any(getattr(o, "needs_bodies", True) for o in self.observers
                                 if Exchange in getattr(o, "event_types", EVENT_TYPES))
        return routes

    def _release(self, request: Request) -> None:
        """Every observer saw this request, kept in the reads that brought it (a large Produce): its
        Exchange, which waits for the response, need not hold them. An observer of Exchanges that reads
        bodies (the capture) reads the request's scan then: it is made now, from the reads, if nobody
        made it yet."""
        if self._bodies_later:
            try:
                request.scan()
            except DecodeError:
                pass  # cached on the event: what the observer is told then
        request.release_frame()

    def dispatch(self, events: list) -> None:
        """Every event to the observers routed its type (kinspect/proxy/_batch.c does the same in C: change both)."""
        routes = self._routes
        if self._routed != self.observers:  # observers were added or removed since
            routes = self._route()
        for event in events:
            kind = type(event)
            for on_event in routes.get(kind, ()):
                try:
                    on_event(event)
                except Exception:  # an observer's bug must never reach the relay
                    self._failed(on_event, kind)
            if kind is Request and type(event.frame) is FramePieces:
                self._release(event)

    def _failed(self, on_event, kind: type) -> None:
        """An observer raised (the exception being handled): counted, and the first ten logged."""
        self.failures += 1
        if self.failures <= 10:
            log.exception("observer %r failed on %s", getattr(on_event, "__self__", on_event), kind.__name__)
