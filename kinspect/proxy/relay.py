"""One client connection relayed to one broker: the relay moves bytes, the session says which.

Two asyncio protocols (buffered ones, kinspect.proxy.receiving) share a Relay. Client bytes
are written to the broker as read, then handed to the session. Broker bytes are written as
read too, unless the session holds responses for its transform (rewrite mode): then it says
what to send. Events go to the observers after the bytes are written, so observing never
delays forwarding; write-buffer limits on both transports pause the reading side when the
other cannot keep up.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kinspect.protocol.codec.wire_program import optional_extension
from kinspect.protocol.framing.pieces import FramePieces
from kinspect.proxy.inspection_queue import InspectionQueue
from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.receiving import receiver
from kinspect.session import Request, Session

log = logging.getLogger("kinspect.proxy")

# Reads of at least this many bytes are first offered to the session to pass over (a read inside a
# large frame kept by its head: measured, its inspection cost a consumer of 6 MB responses about 0.05
# ms of CPU per MB, a tenth of what forwarding costs). Smaller reads skip the question: it would cost
# every small request its attribute loads for nothing.
PASS_MIN_BYTES = 64 * 1024
# Each direction buffers at most this much unsent data before its reader is paused.
WRITE_BUFFER_HIGH = 1024 * 1024
WRITE_BUFFER_LOW = 256 * 1024


class _Side(asyncio.BufferedProtocol):
    """One end of the relay; `peer` is the other end's transport.

    A buffered protocol: the event loop reads into the thread's megabyte buffer
    (kinspect.proxy.receiving), whose Receiver hands each read as bytes to the relay's reader of
    this side: Relay.client_read or broker_read, or where built (`native`) the C Reader that does
    the same (kinspect/proxy/_forward.c). get_buffer and buffer_updated are slots holding the
    Receiver's methods (C where built), and `data_received` the reader itself (what a caller with
    bytes in hand calls): no Python method of this class runs per read.
    """

    __slots__ = ("relay", "name", "transport", "data_received", "get_buffer", "buffer_updated")

    def __init__(self, relay: "Relay", name: str, native: bool = True) -> None:
        self.relay = relay
        self.name = name
        self.transport: asyncio.Transport | None = None
        reader = native_reader(relay, name == "client") if native else None
        if reader is None:
            reader = relay.client_read if name == "client" else relay.broker_read
        self.data_received = reader
        reads = receiver(reader, native)
        self.get_buffer, self.buffer_updated = reads.get_buffer, reads.buffer_updated

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.relay.side_made(self)

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

    # Slots: every read touches the relay, and a slot is one load where a __dict__ is a lookup.
    __slots__ = ("server", "upstreams", "session", "dispatcher", "transforms", "queue", "client", "broker", "closed",
                 "client_bytes", "broker_bytes", "_eof", "_failures", "_clock", "_early", "_early_bytes")

    def __init__(self, server, session: Session, dispatcher: Dispatcher, upstreams: list[tuple[str, int]],
                 native: bool = True) -> None:
        self.server = server
        self.upstreams = upstreams
        self.session = session
        self.dispatcher = dispatcher
        self.transforms = session.transform is not None  # broker bytes go out as the session says
        # Where forwarded reads wait to be inspected in a batch (None: inspected at once). Rewrite
        # mode inspects at once: a response is changed before it is sent, so its request must be read.
        self.queue = None if self.transforms else getattr(server, "inspection_queue", None)
        self.client = _Side(self, "client", native)  # native: reads go through the C reader where built
        self.broker = _Side(self, "broker", native)
        self.closed = asyncio.get_running_loop().create_future()
        self.client_bytes = 0  # bytes received from the client
        self.broker_bytes = 0  # bytes received from the broker
        self._eof = set()
        self._failures = 0  # the session's inspection failures already counted
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
            self._write(self.broker.transport, chunk)
        if self.client.transport is not None and not self.client.transport.is_closing():
            self.client.transport.resume_reading()

    def _peer(self, side: _Side) -> _Side:
        return self.broker if side is self.client else self.client

    # Every read of every connection comes to one of these two: written for that (one counter,
    # one write, then the read is inspected: queued for a batch, or at once in rewrite mode; a large
    # read inside a frame read by its head only is passed over). kinspect/proxy/_forward.c does the
    # same for a read of bytes queued for a batch, and calls these for the rest: change both.
    def client_read(self, data: bytes) -> None:
        self.client_bytes += len(data)
        if self._early is not None:
            self._early.append(data)
            self._early_bytes += len(data)
            self.client.transport.pause_reading()
        else:
            broker = self.broker.transport
            if broker is not None and not broker.is_closing():
                broker.write(data)
        if not self.session.client_framed:
            return
        queue = self.queue
        # Passed over only when no read waits to be inspected: the session must be at this read.
        if len(data) >= PASS_MIN_BYTES and not queue and self.session.pass_client(len(data)):
            return
        if queue is not None:
            queue.add(self, True, data, self._clock())
        else:
            self.inspect(True, data, self._clock())

    def broker_read(self, data: bytes) -> None:
        self.broker_bytes += len(data)
        if self.transforms:
            self._transformed(data)
            return
        client = self.client.transport
        if client is not None and not client.is_closing():
            client.write(data)
        if not self.session.broker_framed:
            return
        queue = self.queue
        if len(data) >= PASS_MIN_BYTES and not queue and self.session.pass_broker(len(data)):
            return
        if queue is not None:
            queue.add(self, False, data, self._clock())
        else:
            self.inspect(False, data, self._clock())

    def inspect(self, from_client: bool, data, now: float) -> None:
        """Hand a read that was forwarded to the session, and its events to the observers.

        The reference of kinspect/proxy/_batch.c, which does the same for a queued batch: change both."""
        session = self.session
        try:
            if from_client:
                if not session.client_framed:  # framing was lost since the read was queued
                    return
                events = session.client_data(data, now).events
            else:
                if not session.broker_framed:
                    return
                events = session.broker_data(data, now).events
        except Exception:  # nothing the session raises may reach the event loop
            self._session_failed("client" if from_client else "broker", None)
            return
        if session.failures != self._failures:
            self._count_failures()
        if events:
            self.dispatcher.dispatch(events)

    def _transformed(self, data: bytes) -> None:
        """Broker bytes in rewrite mode: the session says what to send."""
        session = self.session
        client = self.client.transport
        try:
            forward, events = session.broker_data(data, self._clock())
        except Exception:  # a bug in the session: the bytes must still go on, unchanged from here
            self._session_failed("broker", data)
            return
        if forward is None:
            self._write(client, data)
        elif forward and client is not None and not client.is_closing():
            # One call for a held frame's new size prefix and its pieces: uvloop sends them in one writev, where a
            # write each went out in a send each and a reader could see the prefix alone.
            client.writelines(forward)
        self._count_failures()
        if events:
            self.dispatcher.dispatch(events)

    def _count_failures(self) -> None:
        failures = self.session.failures
        if failures != self._failures:
            self.server.inspection_failures += failures - self._failures
            self._failures = failures

    def _session_failed(self, direction: str, unsent: bytes | None) -> None:
        self.server.inspection_failures += 1
        log.exception("connection %s: the session failed; the %s direction is passed on unread",
                      self.session.connection.id, direction)
        if direction == "client":
            self.session.client_framed = False
        else:
            self.session.broker_framed = False
            self.transforms = False  # what the session held is lost with it; the rest passes as read
            if unsent is not None:
                self._write(self.client.transport, unsent)

    def _write(self, transport, data: bytes) -> None:
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def _flush_held(self, side: _Side) -> None:
        """The broker's side ended: bytes the session held (a response cut short) go to the client as they are."""
        if side is self.broker and self.transforms:
            self.transforms = False
            unsent = self.session.broker_ended()
            if unsent:
                self._write(self.client.transport, unsent)

    def eof(self, side: _Side):
        """Half-close: pass the EOF on and keep the other direction open."""
        self._eof.add(side.name)
        self._flush_held(side)
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
        self._flush_held(side)
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
            if self.queue is not None:
                self.queue.flush()  # this connection's reads are inspected before its end is reported
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


_FORWARD: list = []  # [the configured kinspect.proxy._forward module, or None], found once
_BATCH: list = []  # [the configured kinspect.proxy._batch.inspect_reads, or None], found once


def native_inspect_reads():
    """kinspect.proxy._batch.inspect_reads, configured: what an InspectionQueue is given to inspect a batch of
    relays' reads in one C call; None where it is not built or KINSPECT_PURE_PYTHON=1."""
    if not _BATCH:
        inspect_reads = None
        batch = optional_extension("kinspect.proxy._batch")
        if batch is not None:
            try:
                batch.configure(Relay, Dispatcher, Request, FramePieces, Session)
                inspect_reads = batch.inspect_reads
            except TypeError:  # a Relay without the slots it reads: the Python loop inspects
                inspect_reads = None
        _BATCH.append(inspect_reads)
    return _BATCH[0]


def native_reader(relay: Relay, from_client: bool):
    """The C Reader of one side's reads (kinspect/proxy/_forward.c), or None where it is not built or
    KINSPECT_PURE_PYTHON=1: then Relay.client_read or broker_read is called with each read."""
    if not _FORWARD:
        module = optional_extension("kinspect.proxy._forward")
        if module is not None:
            try:
                module.configure(Relay, _Side, InspectionQueue, Session, PASS_MIN_BYTES)
            except TypeError:  # a class without the slots it reads: the Python reads
                module = None
        _FORWARD.append(module)
    module = _FORWARD[0]
    return None if module is None else module.Reader(relay, from_client)
