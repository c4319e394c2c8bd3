"""An observer that logs what the inspector could not follow (the bytes flowed on regardless)."""

from __future__ import annotations

import logging

from kinspect.session import Problem

log = logging.getLogger("kinspect.inspect")

# Kinds worth a warning; the others (raw SASL tokens, acks=0 answers...) are routine.
_WARN = {"frame_too_large", "tls_on_plaintext", "decode_error", "unknown_api", "inflight_overflow"}


class ProblemLog:
    event_types = (Problem,)
    needs_bodies = False  # problems carry their own detail

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def on_event(self, event) -> None:
        if type(event) is not Problem:
            return
        self.counts[event.kind] = self.counts.get(event.kind, 0) + 1
        c = event.connection
        log.log(
            logging.WARNING if event.kind in _WARN else logging.DEBUG,
            "%s (%s): %s [connection %d client %s client_id %s broker %s]",
            event.kind, event.direction, event.detail, c.id, c.client_address, c.client_id, c.broker,
        )
