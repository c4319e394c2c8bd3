"""What the pipeline keeps of each frame and which responses it holds, decided once per (api, version).

In the spirit of Kroxylicious' decode predicate: at request time the session asks the
plan what the response will need, so the response is kept whole, kept in the pieces it came
in (record-bearing frames: Produce requests, Fetch responses), kept by its head, or held for
a transform (the address rewrite) before its first byte arrives.
"""

from __future__ import annotations

from typing import Callable, Protocol

from kinspect.protocol.specs.api_keys import API_VERSIONS, FETCH, PRODUCE, SASL_HANDSHAKE
from kinspect.protocol.framing.stream import HOLD, KEEP_HEAD, KEEP_PIECES, KEEP_WHOLE

BodyPredicate = Callable[[int, int, str], bool]  # (api key, version, "request"/"response") -> keep the body


class ResponseTransform(Protocol):
    """Changes the bytes of some responses; the only consumer that alters the stream."""

    def wants(self, api_key: int, version: int) -> bool: ...

    def apply(self, frame: bytes, api_key: int, version: int) -> bytes | tuple:
        """The frame to send in its place: bytes, or a tuple of buffers sent one after the other."""


def _session_needs(api_key: int, version: int, direction: str) -> bool:
    """Requests whose bodies the session itself reads: SASL mechanisms and KIP-511 client software."""
    return direction == "request" and (api_key == SASL_HANDSHAKE or (api_key == API_VERSIONS and version >= 3))


class Plan:
    """Shared by the sessions of one server; caches each decision."""

    __slots__ = ("bodies", "transform", "spec_facts", "one_frame", "_requests", "_responses")

    def __init__(self, bodies: bool | BodyPredicate = True, transform: ResponseTransform | None = None) -> None:
        self.bodies = bodies
        self.transform = transform
        self.spec_facts: dict[tuple[int, int], tuple] = {}  # filled by sessions (Session._spec_facts)
        self.one_frame = None  # the C reads' table of (api, version) facts (session._one_frame), made by the first session
        self._requests: dict[tuple[int, int], int] = {}
        self._responses: dict[tuple[int, int], int] = {}

    def _wants_body(self, api_key: int, version: int, direction: str) -> bool:
        bodies = self.bodies
        if bodies is True or _session_needs(api_key, version, direction):
            return True
        return bool(bodies(api_key, version, direction)) if callable(bodies) else False

    def request_mode(self, api_key: int, version: int) -> int:
        key = (api_key, version)
        mode = self._requests.get(key)
        if mode is None:
            mode = KEEP_WHOLE if self._wants_body(api_key, version, "request") else KEEP_HEAD
            if mode == KEEP_WHOLE and api_key == PRODUCE:
                # Its record batches make a Produce request large, and only their headers are read:
                # the scanner reads it in the pieces it came in, never joined (FramePieces).
                mode = KEEP_PIECES
            if len(self._requests) < 4096:  # versions a client invents must not grow the cache forever
                self._requests[key] = mode
        return mode

    def response_mode(self, api_key: int, version: int) -> int:
        key = (api_key, version)
        mode = self._responses.get(key)
        if mode is None:
            if self.transform is not None and self.transform.wants(api_key, version):
                mode = HOLD
            else:
                mode = KEEP_WHOLE if self._wants_body(api_key, version, "response") else KEEP_HEAD
                if mode == KEEP_WHOLE and api_key == FETCH:
                    # A consumer's counterpart of a large Produce: record sets whose headers are all
                    # that is read. Copied or joined, a 1 MB response cost the session 130-220 us
                    # warm, 220-410 cold; in the pieces it came in, what a view costs.
                    mode = KEEP_PIECES
            if len(self._responses) < 4096:
                self._responses[key] = mode
        return mode
