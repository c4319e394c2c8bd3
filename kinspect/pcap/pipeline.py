"""Runs a capture file through the flow table with a sink; the shared part of `decode --pcap` and `capture --pcap`."""

from __future__ import annotations

from pathlib import Path

from kinspect.pcap.feed import session_config
from kinspect.pcap.flows import FlowTable, PcapStats
from kinspect.pcap.reader import PacketReader


def inspect_pcap(path: str | Path, codec, inspect_config, sink, ports=()) -> tuple[PcapStats, PacketReader]:
    """Read every packet, reassemble, frame and feed sessions; raises CaptureError for an unreadable file."""
    with PacketReader(path) as reader:
        stats = FlowTable(codec, session_config(inspect_config), sink, ports).run(reader)
    return stats, reader


def summary(stats: PcapStats, reader: PacketReader) -> list[str]:
    """Lines for standard error: what was read, what was missing, what was skipped."""
    lines = [f"{reader.packets} packets ({reader.format}, {reader.link_name}), {stats.flows} TCP flows, "
             f"{stats.frames} frames"]
    if stats.gaps or stats.discarded_bytes:
        lines.append(f"{stats.gaps} gaps ({stats.gap_bytes} bytes not captured), {stats.discarded_bytes} bytes "
                     f"not framed while regaining sync, {stats.resyncs} resyncs")
    if stats.guessed_directions:
        lines.append(f"{stats.guessed_directions} flows without their start: the client side was guessed "
                     "(give --port to say which side is the broker)")
    if stats.ignored_flows:
        lines.append(f"{stats.ignored_flows} flows on other ports ignored")
    if reader.truncated:
        lines.append("the capture file ends inside a packet record (truncated)")
    if reader.malformed:
        lines.append(f"{reader.malformed} packets could not be parsed")
    return lines
