"""One client connection relayed to one broker: bytes forwarded at once, a copy inspected.

Two asyncio Protocols share a Relay. Data is written to the other side first and
inspected after, so inspection never delays forwarding; write-buffer limits on both
transports pause the reading side when the other cannot keep up (bounded memory).
"""

from __future__ import annotations

import asyncio
import logging
import time

from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.rewrite import ResponseRewriter, carries_addresses
from kinspect.session import Request, Session

log = logging.getLogger("kinspect.proxy")

# Each direction buffers at most this much unsent data before its reader is paused.
WRITE_BUFFER_HIGH = 1024 * 1024
WRITE_BUFFER_LOW = 256 * 1024


class _Side(asyncio.Protocol):
    """One end of the relay; `peer` is the other end's transport."""

    def __init__(self, relay: "Relay", name: str) -> None:
        self.relay = relay
        self.name = name
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.relay.side_made(self)

    def data_received(self, data: bytes) -> None:
        self.relay.data(self, data)

    def eof_received(self):
        return self.relay.eof(self)

    def connection_lost(self, exc) -> None:
        self.relay.lost(self, exc)

    # The other side's reading pauses while this side cannot write.
    def pause_writing(self) -> None:
        self.relay.pause_peer_of(self)

    def resume_writing(self) -> None:
        self.relay.resume_peer_of(self)


class Relay:
    """A client<->broker pair of transports with a Session inspecting both directions."""

    def __init__(self, server, session: Session, dispatcher: Dispatcher, rewriter: ResponseRewriter | None,
                 upstreams: list[tuple[str, int]]) -> None:
        self.server = server
        self.upstreams = upstreams
        self.session = session
        self.dispatcher = dispatcher
        self.rewriter = rewriter
        self.client = _Side(self, "client")
        self.broker = _Side(self, "broker")
        self.closed = asyncio.get_running_loop().create_future()
        self.bytes_in = {"client": 0, "broker": 0}
        self.bytes_out = {"client": 0, "broker": 0}
        self._eof = set()
        self._clock = time.monotonic
        # Client bytes that arrive before the broker connection is up (uvloop may deliver
        # data even though reading was paused in connection_made): held, then flushed.
        self._early: list[bytes] | None = []
        self._early_bytes = 0

    # -- lifecycle

    def side_made(self, side: _Side) -> None:
        if side is self.client:
            side.transport.pause_reading()  # until the broker connection is up
            peer = side.transport.get_extra_info("peername")
            self.session.connection.client_address = f"{peer[0]}:{peer[1]}" if peer else "?"
            self.server.client_connected(self)

    def connected(self) -> None:
        early, self._early = self._early, None
        for chunk in early or ():
            self._write(self.broker.transport, chunk, "broker")
        if self.client.transport is not None and not self.client.transport.is_closing():
            self.client.transport.resume_reading()

    def _peer(self, side: _Side) -> _Side:
        return self.broker if side is self.client else self.client

    def data(self, side: _Side, data: bytes) -> None:
        peer = self._peer(side).transport
        self.bytes_in[side.name] += len(data)
        if side is self.client:
            if self._early is not None:
                self._early.append(data)
                self._early_bytes += len(data)
                side.transport.pause_reading()
            else:
                self._write(peer, data, "broker")
            if self.session.client_inspected:
                self._inspect(self.session.client_data, data)
        else:
            if self.rewriter is None:
                self._write(peer, data, "client")
            else:
                for chunk in self.rewriter.feed(data):
                    self._write(peer, chunk, "client")
                if self.rewriter.errors:
                    for problem in self.rewriter.errors:
                        log.warning("connection %s: %s", self.session.connection.id, problem)
                    self.rewriter.errors.clear()
            if self.session.broker_inspected:
                self._inspect(self.session.broker_data, data)

    def _inspect(self, feed, data: bytes) -> None:
        """Inspection runs after forwarding, and nothing it raises may reach the relay."""
        try:
            events = feed(data, self._clock())
            if events:
                if self.rewriter is not None:
                    for e in events:
                        if (type(e) is Request and e.expects_response
                                and carries_addresses(e.api_key, e.api_version, self.rewriter.node_endpoints)):
                            self.rewriter.expect(e.correlation_id, e.api_key, e.api_version)
                self.dispatcher.dispatch(events)
        except Exception:
            self.server.inspection_failures += 1
            log.exception("connection %s: inspection failed; this direction is no longer inspected",
                          self.session.connection.id)
            if feed == self.session.client_data:
                self.session.client_inspected = False
            else:
                self.session.broker_inspected = False

    def _write(self, transport, data: bytes, to: str) -> None:
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self.bytes_out[to] += len(data)

    def eof(self, side: _Side):
        """Half-close: pass the EOF on and keep the other direction open."""
        self._eof.add(side.name)
        if self._early is not None:  # no broker yet: nothing to pass the EOF to
            self.close()
            return False
        peer = self._peer(side).transport
        if peer is not None and not peer.is_closing() and peer.can_write_eof():
            peer.write_eof()
        if len(self._eof) == 2:
            self.close()
            return False
        return True

    def lost(self, side: _Side, exc) -> None:
        peer = self._peer(side).transport
        if peer is not None and not peer.is_closing():
            peer.close()  # flushes what is buffered, then closes
        if side.transport is not None and not side.transport.is_closing():
            side.transport.close()
        if all(s.transport is None or s.transport.is_closing() for s in (self.client, self.broker)):
            self._finish()

    def close(self) -> None:
        for side in (self.client, self.broker):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()
        self._finish()

    def abort(self) -> None:
        for side in (self.client, self.broker):
            if side.transport is not None:
                side.transport.abort()
        self._finish()

    def _finish(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
            events = self.session.close(self._clock())
            if events:
                self.dispatcher.dispatch(events)

    # -- backpressure

    def pause_peer_of(self, side: _Side) -> None:
        peer = self._peer(side).transport
        if peer is not None and not peer.is_closing():
            peer.pause_reading()

    def resume_peer_of(self, side: _Side) -> None:
        peer = self._peer(side).transport
        if peer is not None and not peer.is_closing():
            peer.resume_reading()
