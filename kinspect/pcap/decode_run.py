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

SPOOL_BYTES = 1024 * 1024  # a flow's records beyond this wait in a temporary file, not in memory


class _JsonSink:
    """Writes records at once (--by time) or spools them per flow and writes flow after flow (--by flow)."""

    def __init__(self, codec, out, by: str, roundtrip: bool = False) -> None:
        self.builder = RecordBuilder(codec, DecodeStats(), roundtrip)
        self.out = out
        self.by_flow = by == "flow"
        self.spools: dict[int, object] = {}

    def _write(self, flow, records) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if self.by_flow:
            spool = self.spools.get(flow.id)
            if spool is None:
                spool = self.spools[flow.id] = tempfile.SpooledTemporaryFile(SPOOL_BYTES, mode="w+", encoding="utf-8")
            spool.write(text)
        else:
            self.out.write(text)

    def frame_events(self, flow, direction, offset, time, events, frame) -> None:
        self._write(flow, self.builder.frame_records(flow, direction, offset, time, events, frame))

    def stream_note(self, flow, direction, item) -> None:
        if item[0] != "resync":
            self._write(flow, [self.builder.note_record(flow, direction, item)])

    def flow_closed(self, flow, events) -> None:
        self._write(flow, self.builder.close_records(flow, events))

    def finish(self) -> None:
        for flow_id in sorted(self.spools):
            spool = self.spools.pop(flow_id)
            spool.seek(0)
            while chunk := spool.read(1 << 20):
                self.out.write(chunk)
            spool.close()


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
    if args.roundtrip:
        line += f", {decoded.roundtrip_mismatches} re-encoded differently"
    print(f"kinspect: {line}", file=sys.stderr)
    if not stats.frames:
        print(f"kinspect: {args.pcap}: no Kafka frames found"
              + (f" on port {', '.join(map(str, args.port))}" if args.port else ""), file=sys.stderr)
        return 1
    return 0 if decoded.ok else 1
