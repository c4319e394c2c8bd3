"""`kinspect capture --pcap`: every exchange of a capture file as Parquet rows, the proxy's capture schema."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kinspect.capture.observer import CaptureObserver
from kinspect.config import load_config
from kinspect.pcap.pipeline import inspect_pcap, summary
from kinspect.pcap.reader import CaptureError
from kinspect.session import Exchange

_WAIT = 0.002  # seconds between looks at a full writer queue


class _CaptureSink:
    """Hands every session event to the capture observer, waiting while its queue is full (nothing is dropped)."""

    def __init__(self, observer: CaptureObserver) -> None:
        self.observer = observer
        self.writer = observer.writer
        self.exchanges = 0

    def _room(self) -> None:
        # Offline there is no event loop to protect: wait for the writer thread instead of dropping.
        writer = self.writer
        while writer.queue_depth >= writer.queue_rows - 1 or writer.queued_bytes > writer.queue_bytes // 2:
            time.sleep(_WAIT)

    def frame_events(self, flow, direction, offset, time_, events, frame) -> None:
        for event in events:
            if type(event) is Exchange:
                self._room()
                self.exchanges += 1
            self.observer.on_event(event)

    def stream_note(self, flow, direction, item) -> None:
        pass

    def flow_closed(self, flow, events) -> None:
        for event in events:
            self.observer.on_event(event)


def run(args, codec) -> int:
    config = load_config(args.config)
    capture = config.capture
    # Packet times are epoch seconds already: the observer's wall-clock offset is 0.
    observer = CaptureObserver(Path(args.out), codec, max_file_bytes=capture.max_file_bytes,
                               max_file_seconds=capture.max_file_seconds, queue_rows=capture.queue_rows,
                               row_group_rows=capture.row_group_rows, queue_bytes=capture.queue_bytes,
                               wall_offset=0.0)
    sink = _CaptureSink(observer)
    observer.start()
    try:
        stats, reader = inspect_pcap(args.pcap, codec, config.inspect, sink, args.port)
    except CaptureError as exc:
        observer.close()
        print(f"kinspect: {exc}", file=sys.stderr)
        return 2
    observer.close(timeout=None)
    writer = observer.writer
    for line in summary(stats, reader):
        print(f"kinspect: {line}", file=sys.stderr)
    print(f"kinspect: {writer.rows_written} rows in {writer.files_written} files under {args.out}"
          + (f", {writer.row_errors} exchanges failed" if writer.row_errors else ""), file=sys.stderr)
    if not stats.frames:
        print(f"kinspect: {args.pcap}: no Kafka frames found", file=sys.stderr)
        return 1
    return 0 if writer.rows_written and not writer.write_errors else 1
