"""Runs a capture through kinspect's flow table and keeps what the tests compare: frames, notes, records."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from kinspect.config import InspectConfig
from kinspect.pcap.feed import session_config
from kinspect.pcap.flows import FlowTable
from kinspect.pcap.reader import PacketReader
from kinspect.pcap.records import RecordBuilder
from kinspect.protocol.codec import Codec

_MASK = 0xFFFFFFFF
WHOLE = InspectConfig(inspect_max_bytes=InspectConfig().max_frame_bytes)  # every frame kept whole


@dataclass
class FlowFrames:
    flow: object
    frames: dict = field(default_factory=lambda: {"request": [], "response": []})  # (offset, size, data)
    notes: dict = field(default_factory=lambda: {"request": [], "response": []})  # (kind, offset, count)
    records: list = field(default_factory=list)

    def stream(self, direction: str) -> bytes:
        return b"".join(struct.pack(">i", size) + data for _, size, data in self.frames[direction])

    def position(self, direction: str, offset: int) -> int:
        """A stream offset as a TCP sequence number: comparable between two captures of one connection."""
        return (self.flow.streams[direction][0].isn + offset) & _MASK

    @property
    def client_port(self) -> int:
        return self.flow.client[1]


class _Sink:
    def __init__(self, codec, flows: dict) -> None:
        self.builder = RecordBuilder(codec)
        self.flows = flows

    def _flow(self, flow) -> FlowFrames:
        got = self.flows.get(flow.id)
        if got is None:
            got = self.flows[flow.id] = FlowFrames(flow)
        return got

    def frame_events(self, flow, direction, offset, time, events, frame):
        self._flow(flow).records.extend(self.builder.frame_records(flow, direction, offset, time, events, frame))

    def stream_note(self, flow, direction, item):
        if item[0] != "resync":
            self._flow(flow).notes[direction].append((item[0], item[1], item[2]))

    def flow_closed(self, flow, events):
        self._flow(flow).records.extend(self.builder.close_records(flow, events))


def reassemble(path, ports=(), codec: Codec | None = None, inspect: InspectConfig = WHOLE):
    """{flow id: FlowFrames}, the flow table's stats and the decode stats."""
    codec = codec or Codec()
    flows: dict = {}
    sink = _Sink(codec, flows)

    def on_frame(flow, direction, item):
        sink._flow(flow).frames[direction].append((item[1], item[2], item[3]))

    with PacketReader(path) as reader:
        stats = FlowTable(codec, session_config(inspect), sink, ports, on_frame=on_frame).run(reader)
    return flows, stats, sink.builder.stats
