"""The capture's warm-up: one real row through the builder and a Parquet writer, and nothing left behind."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from kinspect.capture.observer import CaptureObserver
from kinspect.capture.schema import COLUMN_NAMES
from kinspect.capture.warm_up import warm_up
from kinspect.protocol.codec import Codec


def test_the_warm_up_row_takes_the_real_path(codec: Codec):
    table = pq.read_table(pa.BufferReader(warm_up(codec, "zstd")))
    assert table.column_names == list(COLUMN_NAMES) and table.num_rows == 1
    row = table.to_pylist()[0]
    assert (row["api_name"], row["request_version"], row["client_software_name"]) == ("ApiVersions", 3, "kinspect")
    assert row["integer_fields"]  # the nested column, the costliest to build the first time


def test_starting_a_capture_writes_and_counts_nothing_of_the_warm_up(codec: Codec, tmp_path):
    observer = CaptureObserver(tmp_path, codec).start()
    observer.close()
    w = observer.writer
    assert (w.rows_accepted, w.rows_written, w.row_errors, w.files_written) == (0, 0, 0, 0)
    assert list(tmp_path.iterdir()) == []
