"""Prometheus figures of the capture writer, read at scrape time by a custom collector."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kinspect.capture.writer import CaptureWriter

METRIC_NAMES = {
    "kinspect_capture_rows_total": "counter",
    "kinspect_capture_rows_accepted_total": "counter",
    "kinspect_capture_dropped_rows_total": "counter",
    "kinspect_capture_files_total": "counter",
    "kinspect_capture_queue_rows": "gauge",
    "kinspect_capture_queue_bytes": "gauge",
    "kinspect_capture_writer_behind_total": "counter",
}


class CaptureCollector(Collector):
    """Rows accepted, written and dropped, files finished, the queue's depth and the writer process's falls behind,
    straight from the writer's counters.

    kinspect_capture_rows_total counts rows in finished files only (it stays at 0 until the
    first file is closed); kinspect_capture_rows_accepted_total counts exchanges queued for
    writing as they come, so a capture that runs shows at once.
    """

    def __init__(self, writer: CaptureWriter) -> None:
        self.writer = writer

    def describe(self):
        return self._families(describing=True)

    def collect(self):
        return self._families(describing=False)

    def _families(self, describing: bool) -> list:
        w = self.writer
        rows = CounterMetricFamily("kinspect_capture_rows", "Exchanges written to capture files")
        accepted = CounterMetricFamily("kinspect_capture_rows_accepted",
                                       "Exchanges accepted into the capture queue (written or still to be written)")
        dropped = CounterMetricFamily("kinspect_capture_dropped_rows",
                                      "Exchanges not captured, by reason (queue_full: the capture queue was full by rows or bytes)",
                                      labels=("reason",))
        files = CounterMetricFamily("kinspect_capture_files", "Capture files finished (closed and renamed)")
        queue = GaugeMetricFamily("kinspect_capture_queue_rows", "Exchanges waiting in the capture queue")
        queue_bytes = GaugeMetricFamily("kinspect_capture_queue_bytes", "Bytes of frames held by the capture queue")
        behind = CounterMetricFamily("kinspect_capture_writer_behind",
                                     "Times the capture writer process, in the idle scheduling class, fell behind and "
                                     "was lifted out until it caught up (capture.writer_priority)")
        if not describing:
            rows.add_metric((), w.rows_written)
            accepted.add_metric((), w.rows_accepted)
            dropped.add_metric(("queue_full",), w.rows_dropped)
            dropped.add_metric(("row_error",), w.row_errors + w.fact_errors)
            dropped.add_metric(("write_error",), w.write_errors)
            files.add_metric((), w.files_written)
            queue.add_metric((), w.queue_depth)
            queue_bytes.add_metric((), w.queued_bytes)
            behind.add_metric((), w.writer_lifts)
        return [rows, accepted, dropped, files, queue, queue_bytes, behind]
