"""The one adapter between reassembled pcap flows and kinspect's session (pairing as in the proxy)."""

from __future__ import annotations

import struct

from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Plan, Session, SessionConfig

_SIZE = struct.Struct(">i")
_ZEROS = bytes(1024 * 1024)


def shared_plan() -> Plan:
    """One plan for every flow of a capture (it caches its per-api decisions)."""
    return Plan(True)


def session_config(inspect) -> SessionConfig:
    """The proxy's per-connection limits, from a config's [inspect] section (InspectConfig)."""
    return SessionConfig(max_frame_bytes=inspect.max_frame_bytes, inspect_max_bytes=inspect.inspect_max_bytes,
                         max_inflight=inspect.max_inflight, request_timeout=inspect.request_timeout)


class FlowFeeder:
    """Hands one flow's frames to a Session, one whole frame per call, and returns its events.

    The framer upstream never passes a frame cut by a gap, so the session's own framing is
    always at a frame boundary between calls. A frame larger than the inspection limit
    arrives as its head only; the session is given its size prefix, the head and then
    filler for the rest, which it counts and skips as it does for the proxy.
    """

    __slots__ = ("session", "connection")

    def __init__(self, codec: Codec, connection_id: int, client_address: str, broker: str,
                 config: SessionConfig, plan: Plan | None = None) -> None:
        self.connection = ConnectionInfo(connection_id, client_address, broker)
        # Every body is kept (up to the inspection limit): decode and capture read them all.
        self.session = Session(codec, self.connection, config, plan or Plan(True))

    @staticmethod
    def _chunks(size: int, data: bytes, complete: bool):
        yield _SIZE.pack(size) + data
        rest = 0 if complete else size - len(data)
        while rest > 0:
            n = min(rest, len(_ZEROS))
            yield memoryview(_ZEROS)[:n]
            rest -= n

    def request(self, size: int, data: bytes, complete: bool, time: float) -> list:
        events: list = []
        for chunk in self._chunks(size, data, complete):
            events.extend(self.session.client_data(chunk, time).events)  # client bytes are never changed
        return events

    def response(self, size: int, data: bytes, complete: bool, time: float) -> list:
        events: list = []
        for chunk in self._chunks(size, data, complete):
            events.extend(self.session.broker_data(chunk, time).events)  # no transform: nothing held or changed
        return events

    def close(self, time: float) -> list:
        return self.session.close(time)
