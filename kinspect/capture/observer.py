"""The capture observer: ships each Exchange's facts to the capture writer's queue, and does nothing else on the event loop."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kinspect.capture.facts import FactsTaker
from kinspect.capture.batch import BatchBuilder
from kinspect.capture.warm_up import warm_facts, warm_up
from kinspect.capture.writer import CaptureWriter
from kinspect.protocol.codec import Codec
from kinspect.protocol.specs.registry import SpecRegistry
from kinspect.session.events import Exchange

log = logging.getLogger("kinspect.capture")


def _log_fact_error(exc: Exception) -> None:
    """The first exchange whose facts could not be taken (a bug; the rest are only counted)."""
    log.error("capture: cannot take an exchange's facts (further failures are only counted)", exc_info=exc)


class CaptureObserver:
    """Queues the facts of Exchange events for the writer thread (rows are built there, never here).

    The facts come from the events' cached scans, shared with the metrics: no frame and no
    codec crosses to the thread (see capture.facts).
    """

    event_types = (Exchange,)
    needs_bodies = True  # the scans read whole frames

    def __init__(self, directory: str | Path, codec: Codec | None = None, *, max_file_bytes: int = 64 * 1024 * 1024,
                 max_file_seconds: float = 300.0, queue_rows: int = 100_000, row_group_rows: int = 10_000,
                 queue_bytes: int = 256 * 1024 * 1024, wall_offset: float | None = None,
                 process: bool = False, writer_priority: str = "auto") -> None:
        # The events' codec: its scans gather the integer counters once a capture takes facts.
        codec = codec if codec is not None else Codec(SpecRegistry.default())
        # Event times are time.monotonic(); one offset, taken now, maps them to UTC wall-clock time.
        # A fixed wall_offset is kept as given (0 for events already in epoch seconds: pcap packet times).
        self._fixed_offset = wall_offset is not None
        self.wall_offset = wall_offset if wall_offset is not None else time.time() - time.monotonic()
        self.writer = CaptureWriter(directory, BatchBuilder(self.wall_offset, codec.registry),
                                    max_file_bytes=max_file_bytes, max_file_seconds=max_file_seconds,
                                    queue_rows=queue_rows, row_group_rows=row_group_rows,
                                    queue_bytes=queue_bytes, process=process, writer_priority=writer_priority)
        self._codec = codec
        # The writer queue's front takes each exchange's facts and queues them: in C where built, the
        # dispatcher's one call for an Exchange does it all (no Python frame on the event loop).
        front = self.writer.front
        front.take, front.on_error = FactsTaker(codec).take, _log_fact_error
        self.handlers = {Exchange: front}
        self._front = front

    @classmethod
    def from_config(cls, capture, codec: Codec | None = None) -> CaptureObserver:
        """From a config's [capture] section (CaptureConfig)."""
        return cls(capture.directory, codec, max_file_bytes=capture.max_file_bytes,
                   max_file_seconds=capture.max_file_seconds, queue_rows=capture.queue_rows,
                   row_group_rows=capture.row_group_rows, queue_bytes=capture.queue_bytes,
                   process=capture.writer_process, writer_priority=capture.writer_priority)

    def on_event(self, event) -> None:
        if type(event) is Exchange:
            self._front(event)

    def start(self) -> CaptureObserver:
        if self.writer._thread is None:
            try:
                if self.writer.process:  # the writer process warms itself with this exchange's facts
                    self.writer.warm_facts = warm_facts(self._codec)
                else:
                    warm_up(self._codec, self.writer.compression)
            except Exception:  # the first real batch pays pyarrow's first use instead; the capture goes on
                log.warning("capture: warming up the row builder failed", exc_info=True)
            if not self._fixed_offset:  # the clock offset is taken again as it starts
                self.wall_offset = self.writer.builder.wall_offset = time.time() - time.monotonic()
        self.writer.start()
        return self

    def close(self, timeout: float | None = 60.0) -> None:
        """Write everything queued and close the open file (blocks until done)."""
        self.writer.close(timeout)
