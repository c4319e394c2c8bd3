"""The flow table: TCP segments to flows, each with its direction, two reassembled and framed streams, and a session."""

from __future__ import annotations

from dataclasses import dataclass, field

from kinspect.pcap.feed import FlowFeeder, shared_plan
from kinspect.pcap.framing import StreamFramer
from kinspect.pcap.reader import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, PacketReader, Segment, address
from kinspect.pcap.reassembly import Reassembler
from kinspect.pcap.resync import HeaderCheck, Resync

REQUEST, RESPONSE = "request", "response"
# A flow whose direction is unknown (no SYN, no --port) holds this much before guessing.
HOLD_SEGMENTS, HOLD_BYTES = 64, 256 * 1024
# A closed flow stays open for this many more packets: a reordered segment may still come.
CLOSE_AFTER_PACKETS = 64
# Segments held back because they acknowledge bytes of the other direction not yet seen (see _apply).
HOLD_CAUSAL = 64
# Resync candidates up to this size are accepted only whole and decoded (resync.HeaderCheck).
WHOLE_CHECK_BYTES = 4 * 1024 * 1024
_OTHER = {"request": "response", "response": "request"}


@dataclass
class PcapStats:
    packets: int = 0
    segments: int = 0
    flows: int = 0
    frames: int = 0
    gaps: int = 0
    gap_bytes: int = 0
    discarded_bytes: int = 0
    resyncs: int = 0
    retransmitted_bytes: int = 0
    ignored_flows: int = 0
    guessed_directions: int = 0


@dataclass(eq=False)
class Flow:
    """One TCP connection: the client side, the broker side and how the direction was found."""

    id: int
    client: tuple[bytes, int]
    broker: tuple[bytes, int]
    first_time: float
    direction_from: str  # "syn", "port", "requests" (which side read as requests), "guess" (higher port)
    feeder: FlowFeeder = field(repr=False)
    streams: dict = field(default_factory=dict, repr=False)  # direction -> (Reassembler, StreamFramer, out)
    fins: set = field(default_factory=set, repr=False)
    closing_at: int | None = None  # packet number after which the flow is finished
    reset: bool = False  # ended by a RST: bytes a side had queued may never have been sent
    held: dict = field(default_factory=lambda: {"request": [], "response": []}, repr=False)
    last_time: float = 0.0

    @property
    def name(self) -> str:
        return f"{_endpoint(self.client)}->{_endpoint(self.broker)}"


def _endpoint(side: tuple[bytes, int]) -> str:
    host = address(side[0])
    return f"[{host}]:{side[1]}" if ":" in host else f"{host}:{side[1]}"


class _Undecided:
    """A flow seen without its SYN and not on a --port: its segments wait until one side reads as requests."""

    __slots__ = ("segments", "bytes", "first_time", "sides", "readers")

    def __init__(self, first_time: float) -> None:
        self.segments: list[Segment] = []
        self.bytes = 0
        self.first_time = first_time
        self.sides: dict[tuple, tuple[bytearray, Resync]] = {}  # side -> its bytes so far, a request search
        self.readers: list[tuple] = []  # sides whose bytes read as requests


class FlowTable:
    """Feeds segments to flows; calls sink.frame_events / sink.stream_note / sink.flow_closed."""

    def __init__(self, codec, session_config, sink, ports=(), *, head_bytes: int = 512, on_frame=None) -> None:
        self.codec = codec
        self.config = session_config
        self.check = HeaderCheck(codec, session_config.max_frame_bytes,
                                 min(session_config.inspect_max_bytes, WHOLE_CHECK_BYTES))
        self.sink = sink
        self.ports = frozenset(ports)
        self.head_bytes = head_bytes
        self.on_frame = on_frame  # called with (flow, direction, item) for every frame, before the session sees it
        self.plan = shared_plan()
        self.flows: dict[tuple, Flow] = {}
        self.undecided: dict[tuple, _Undecided] = {}
        self.ignored: set[tuple] = set()
        self.closing: list[Flow] = []
        self.stats = PcapStats()
        self._packet = 0

    # ------------------------------------------------------------------ input

    def run(self, reader: PacketReader) -> PcapStats:
        for segment in reader.segments():
            self.segment(segment)
        self.finish()
        self.stats.packets = reader.packets
        return self.stats

    def segment(self, seg: Segment) -> None:
        self._packet += 1
        self.stats.segments += 1
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        flow = self.flows.get(key)
        if flow is not None and seg.flags & TCP_SYN and not seg.flags & TCP_ACK and (
                flow.streams[REQUEST][0].next or flow.closing_at is not None):
            self._close(flow)  # the 4-tuple is reused by a new connection
            flow = None
        if flow is None:
            if key in self.ignored:
                return
            flow = self._new_flow(key, seg)
            if flow is None:
                return
        self._apply(flow, seg)
        if self.closing:
            self._expire()

    def _new_flow(self, key: tuple, seg: Segment) -> Flow | None:
        reverse = (seg.dst, seg.dport, seg.src, seg.sport)
        if self.ports and seg.sport not in self.ports and seg.dport not in self.ports:
            self.ignored.add(key)
            self.ignored.add(reverse)
            self.stats.ignored_flows += 1
            return None
        here, there = (seg.src, seg.sport), (seg.dst, seg.dport)
        if seg.flags & TCP_SYN:
            (client, broker), how = ((here, there) if not seg.flags & TCP_ACK else (there, here)), "syn"
        elif seg.dport in self.ports:
            (client, broker), how = (here, there), "port"
        elif seg.sport in self.ports:
            (client, broker), how = (there, here), "port"
        else:
            held = self.undecided.get(key) or self.undecided.get(reverse)
            if held is None:
                held = self.undecided[key] = self.undecided[reverse] = _Undecided(seg.time)
            if not seg.data:
                return None
            held.segments.append(seg)
            held.bytes += len(seg.data)
            decided = self._read_direction(held, seg)
            if decided is None:
                return None
            (client, broker), how = decided
            for k in (key, reverse):
                self.undecided.pop(k, None)
            flow = self._make_flow(client, broker, how, held.first_time)
            for old in held.segments[:-1] if held.segments and held.segments[-1] is seg else held.segments:
                self._apply(flow, old)
            return flow
        return self._make_flow(client, broker, how, seg.time)

    def _make_flow(self, client: tuple, broker: tuple, how: str, first_time: float) -> Flow:
        self.stats.flows += 1
        if how in ("requests", "guess"):
            self.stats.guessed_directions += 1
        feeder = FlowFeeder(self.codec, self.stats.flows, _endpoint(client), _endpoint(broker), self.config, self.plan)
        flow = Flow(self.stats.flows, client, broker, first_time, how, feeder)
        outstanding: dict = {}
        for direction in (REQUEST, RESPONSE):
            out: list = []
            framer = StreamFramer(direction, self.check, outstanding, out, synced=False,
                                  keep_limit=self.config.inspect_max_bytes, head_bytes=self.head_bytes)
            flow.streams[direction] = (Reassembler(framer, self.config.inspect_max_bytes), framer, out)
        self.flows[client + broker] = flow
        self.flows[broker + client] = flow
        return flow

    def _read_direction(self, held: _Undecided, seg: Segment):
        """(client, broker) and how, once one side's bytes read as requests; None to keep holding."""
        here, there = (seg.src, seg.sport), (seg.dst, seg.dport)
        if seg.data and here not in held.readers:
            # Each side's bytes in arrival order (close enough to decide), searched once each.
            if here not in held.sides:
                held.sides[here] = (bytearray(), Resync(self.check, REQUEST, {}))
            data, search = held.sides[here]
            data += seg.data
            if search.find(data)[0] is not None:
                held.readers.append(here)
        readers = held.readers
        if len(readers) == 1:
            client = readers[0]
            return (client, there if client == here else here), "requests"
        if len(held.segments) < HOLD_SEGMENTS and held.bytes < HOLD_BYTES:
            return None
        # Neither side (or both) reads as requests: the side on the higher port is taken as the client.
        client = here if seg.sport > seg.dport else there
        return (client, there if client == here else here), "guess"

    # ------------------------------------------------------------------ per flow

    def _apply(self, flow: Flow, seg: Segment) -> None:
        direction = REQUEST if (seg.src, seg.sport) == flow.client else RESPONSE
        held = flow.held[direction]
        if seg.data and seg.flags & TCP_ACK:
            # A segment that acknowledges bytes of the other direction the capture has not delivered
            # yet was sent after them: a capture that reordered packets would otherwise show a
            # response before its request. It waits (a bounded while) for those bytes.
            if held or self._ahead(flow, direction, seg.ack):
                held.append(seg)
                if len(held) <= HOLD_CAUSAL:
                    return
                self._release(flow, direction, force=True)
                return
        self._process(flow, direction, seg)

    def _ahead(self, flow: Flow, direction: str, ack: int) -> bool:
        other = flow.streams[_OTHER[direction]][0]
        return other.isn is not None and other._offset(ack) > other.next

    def _release(self, flow: Flow, direction: str, force: bool = False) -> None:
        held = flow.held[direction]
        while held and (force or not self._ahead(flow, direction, held[0].ack)):
            self._process(flow, direction, held.pop(0))

    def _process(self, flow: Flow, direction: str, seg: Segment) -> None:
        reassembler, framer, out = flow.streams[direction]
        flow.last_time = seg.time
        flags = seg.flags
        if flags & TCP_SYN:
            if reassembler.isn is None:
                reassembler.syn(seg.seq)
                framer.synced = True  # the stream is seen from its first byte
            return
        if seg.data or seg.missing:
            reassembler.push(seg.seq, seg.data, seg.missing, seg.time)
            if out:
                self._emit(flow, direction, out)
            if flow.held[_OTHER[direction]]:
                self._release(flow, _OTHER[direction])
        if flags & TCP_ACK:
            flow.streams[RESPONSE if direction == REQUEST else REQUEST][0].ack(seg.ack)
        if flags & TCP_RST:
            flow.reset = True
            self._schedule_close(flow)
        elif flags & TCP_FIN:
            reassembler.fin(seg.seq, len(seg.data) + seg.missing)
            flow.fins.add(direction)
            if len(flow.fins) == 2:
                self._schedule_close(flow)

    def _schedule_close(self, flow: Flow) -> None:
        if flow.closing_at is None:
            flow.closing_at = self._packet + CLOSE_AFTER_PACKETS
            self.closing.append(flow)

    def _expire(self) -> None:
        while self.closing and self.closing[0].closing_at <= self._packet:
            flow = self.closing.pop(0)
            if self.flows.get(flow.client + flow.broker) is flow:
                self._close(flow)

    def _emit(self, flow: Flow, direction: str, out: list) -> None:
        sink, stats = self.sink, self.stats
        feed = flow.feeder.request if direction == REQUEST else flow.feeder.response
        for item in out:
            kind = item[0]
            if kind == "frame":
                _, offset, size, data, complete, time = item
                stats.frames += 1
                if self.on_frame is not None:
                    self.on_frame(flow, direction, item)
                sink.frame_events(flow, direction, offset, time, feed(size, data, complete, time), data)
            else:
                if kind == "gap":
                    stats.gaps += 1
                    stats.gap_bytes += item[2]
                elif kind == "discarded":
                    stats.discarded_bytes += item[2]
                else:
                    stats.resyncs += 1
                sink.stream_note(flow, direction, item)
        out.clear()

    def _close(self, flow: Flow) -> None:
        time = flow.last_time
        while flow.held[REQUEST] or flow.held[RESPONSE]:
            for direction in (REQUEST, RESPONSE):
                self._release(flow, direction, force=True)
        for direction in (REQUEST, RESPONSE):
            reassembler, framer, out = flow.streams[direction]
            reassembler.flush(time)
            framer.finish(time)
            self.stats.retransmitted_bytes += reassembler.retransmitted
            self._emit(flow, direction, out)
        for key in (flow.client + flow.broker, flow.broker + flow.client):
            if self.flows.get(key) is flow:
                del self.flows[key]
        self.sink.flow_closed(flow, flow.feeder.close(time))

    def finish(self) -> None:
        """End of the capture: held flows get their direction guessed, then every open flow ends, oldest first."""
        for held in list({id(h): h for h in self.undecided.values()}.values()):
            if not held.segments:
                continue
            seg = held.segments[-1]
            held.bytes = HOLD_BYTES  # nothing more will come: decide now
            (client, broker), how = self._read_direction(held, Segment(seg.time, seg.src, seg.sport, seg.dst,
                                                                       seg.dport, 0, 0, 0, b"", 0))
            flow = self._make_flow(client, broker, how, held.first_time)
            for old in held.segments:
                self._apply(flow, old)
        self.undecided.clear()
        for flow in sorted({id(f): f for f in self.flows.values()}.values(), key=lambda f: f.id):
            self._close(flow)
