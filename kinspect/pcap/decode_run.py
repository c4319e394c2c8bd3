"""`kinspect decode --pcap`: every flow's decode records as JSON Lines, flow after flow or interleaved by time."""

from __future__ import annotations

import json
import sys
import tempfile

from kinspect.config import load_config
from kinspect.offline_decode import DecodeStats
from kinspect.pcap.pipeline import inspect_pcap, summary
from kinspect.pcap.reader import CaptureError
from kinspect.pcap.records import RecordBuilder

CHUNK_BYTES = 16 * 1024  # a flow's records wait in memory up to this much, then go to the spool file


class _JsonSink:
    """Writes records at once (--by time), or spools them and writes them flow after flow (--by flow).

    The spool is one temporary file for all flows: each flow's records gather in a small
    buffer and are appended as a chunk; the flow keeps the chunks' places. Memory is a buffer
    per open flow and an index entry per chunk, whatever the capture's size.
    """

    def __init__(self, codec, out, by: str, roundtrip: bool = False) -> None:
        self.builder = RecordBuilder(codec, DecodeStats(), roundtrip)
        self.out = out
        self.by_flow = by == "flow"
        self.spool = tempfile.TemporaryFile() if self.by_flow else None
        self.buffers: dict[int, list] = {}  # flow id -> [pending text, its size]
        self.chunks: dict[int, list[tuple[int, int]]] = {}  # flow id -> (offset, length) in the spool

    def _write(self, flow, records) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if not self.by_flow:
            self.out.write(text)
            return
        pending = self.buffers.setdefault(flow.id, [[], 0])
        pending[0].append(text)
        pending[1] += len(text)
        if pending[1] >= CHUNK_BYTES:
            self._spill(flow.id)

    def _spill(self, flow_id: int) -> None:
        texts, _ = self.buffers.pop(flow_id)
        data = "".join(texts).encode("utf-8")
        self.spool.seek(0, 2)
        self.chunks.setdefault(flow_id, []).append((self.spool.tell(), len(data)))
        self.spool.write(data)

    def frame_events(self, flow, direction, offset, time, events, frame) -> None:
        self._write(flow, self.builder.frame_records(flow, direction, offset, time, events, frame))

    def stream_note(self, flow, direction, item) -> None:
        if item[0] != "resync":
            self._write(flow, [self.builder.note_record(flow, direction, item)])

    def flow_closed(self, flow, events) -> None:
        self._write(flow, self.builder.close_records(flow, events))

    def finish(self) -> None:
        if not self.by_flow:
            return
        for flow_id in list(self.buffers):
            self._spill(flow_id)
        for flow_id in sorted(self.chunks):
            for offset, length in self.chunks[flow_id]:
                self.spool.seek(offset)
                self.out.write(self.spool.read(length).decode("utf-8"))
        self.spool.close()


def run(args, codec) -> int:
    config = load_config(args.config)
    out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    sink = _JsonSink(codec, out, args.by, args.roundtrip)
    try:
        try:
            stats, reader = inspect_pcap(args.pcap, codec, config.inspect, sink, args.port)
        except CaptureError as exc:
            print(f"kinspect: {exc}", file=sys.stderr)
            return 2
        sink.finish()
    finally:
        if args.output:
            out.close()
    decoded = sink.builder.stats
    for line in summary(stats, reader):
        print(f"kinspect: {line}", file=sys.stderr)
    line = f"{decoded.frames} frames decoded, {decoded.decode_errors} failed to decode"
    if decoded.unpaired_responses:
        line += f", {decoded.unpaired_responses} responses without their request"
    if args.roundtrip:
        line += f", {decoded.roundtrip_mismatches} re-encoded differently"
    print(f"kinspect: {line}", file=sys.stderr)
    if not stats.frames:
        print(f"kinspect: {args.pcap}: no Kafka frames found"
              + (f" on port {', '.join(map(str, args.port))}" if args.port else ""), file=sys.stderr)
        return 1
    return 0 if decoded.ok else 1
