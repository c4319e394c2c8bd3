"""The integer_fields column of a capture batch, cut out of the scans' counters in C (capture._columns) or numpy.

Each scan's counters arrive as bytes and its slot table (int_slots) as a table number
(IntegerFieldColumns.table_number). The C cutter reads them in one pass; the numpy path,
its reference (and the path where the extension is not built, or KINSPECT_PURE_PYTHON=1),
joins the counters into one int32 buffer (codegen.COUNTER_TYPECODE) that numpy reads in place.
"""

from __future__ import annotations

import io
from array import array

from kinspect.protocol.codec.codegen import (COUNTER_BYTES, SLOT_COUNT, SLOT_FIXED, SLOT_OCCURRENCES, SLOT_STRIDE, SLOT_UHIST,
                                             SLOT_UVARINT, SLOT_ZHIST, SLOT_ZIGZAG)
from kinspect.protocol.codec.wire_program import optional_extension

HISTOGRAM_BUCKETS = 10  # a varint of a 64-bit value takes 1 to 10 bytes
LOCATIONS = ("request", "response")  # location numbers of table_number
_SLOT_BYTES = SLOT_STRIDE * COUNTER_BYTES
assert COUNTER_BYTES == 4  # the numpy path and capture._columns read them as int32
_KEEP_BUFFER = 16 << 20  # a batch's counters beyond this many bytes get a buffer of their own, not kept
# Slot tables looked up by id at most: a batch's slices bring a copy each of the few tables of their apis
# (each held by its entry, a few KB), so the cache holds several batches' worth.
ID_CACHE_ENTRIES = 1024
assert SLOT_ZHIST == SLOT_UHIST + HISTOGRAM_BUCKETS  # the numpy path reads both histograms as one block
_LAYOUT = (SLOT_STRIDE, SLOT_OCCURRENCES, SLOT_COUNT, SLOT_FIXED, SLOT_UVARINT, SLOT_ZIGZAG, SLOT_UHIST, SLOT_ZHIST,
           HISTOGRAM_BUCKETS)


def native_cut():
    """capture._columns.cut, or None where it is not built or KINSPECT_PURE_PYTHON=1."""
    module = optional_extension("kinspect.capture._columns")
    return None if module is None else module.cut


class IntegerFieldColumns:
    """Builds the integer_fields column of a batch from its scans' counters and slot tables.

    Every slot gets a label (location, path, type) numbered once per writer; a slot table
    (a scanned struct's int_slots, one tuple object per api, version and direction) gets a
    table number once, with its slots' label numbers. A batch's rows only append counters
    and table numbers; the cutter keeps the slots whose field was there and cuts out
    their labels and figures (`native`: in C where built, else numpy).
    """

    def __init__(self, native: bool = True) -> None:
        self._label_ids: dict = {}  # (location, path, type) -> label number
        self._labels: list[tuple[str, str, str]] = []
        # One dict per location: id(slots) -> (slots, table number), the per-row lookup. The entry holds
        # slots, so no other object can get its id while it is there: the id alone identifies the table.
        self.tables: tuple[dict, dict] = ({}, {})
        # One dict per location: slots -> table number, by content. A writer process decodes each batch (or
        # pickled slice of one) into its own copies of the codec's slot tables: numbered by id alone, every copy
        # was a new table, kept for good (tens of bytes a row of a busy proxy's capture, without end).
        self._numbers: tuple[dict, dict] = ({}, {})
        self._table_labels: list[bytes] = []  # table number -> its slots' label numbers (int32 bytes)
        self._arrays = None  # the numpy path's (label numbers of all tables, each table's start, size)
        self._arrow_labels = None  # the labels as three Arrow string arrays, rebuilt as they grow
        # The numpy path joins a batch's counters into one reused buffer: a fresh megabyte a batch
        # went to the kernel and back (page faults cost more than the copy).
        self._buffer = io.BytesIO()
        self._cut = (native and native_cut()) or None

    def table_number(self, location: int, slots: tuple) -> int:
        """The number of a slot table (location: 0 request, 1 response), one per distinct table; `tables[location]`
        caches it by id, for at most ID_CACHE_ENTRIES copies of tables at a time."""
        by_id = self.tables[location]
        hit = by_id.get(id(slots))
        if hit is not None:
            return hit[1]
        if len(by_id) >= ID_CACHE_ENTRIES:
            by_id.clear()  # the copies of past slices: their tables keep their numbers by content
        table = self._numbers[location].get(slots)
        if table is None:
            table = self._new_table(location, slots)
        by_id[id(slots)] = (slots, table)
        return table

    def _new_table(self, location: int, slots: tuple) -> int:
        name = LOCATIONS[location]
        numbers = array("i")
        for path, kind in slots:
            key = (name, path, kind)
            number = self._label_ids.get(key)
            if number is None:
                number = self._label_ids[key] = len(self._labels)
                self._labels.append(key)
            numbers.append(number)
        table = len(self._table_labels)
        self._table_labels.append(numbers.tobytes())
        self._numbers[location][slots] = table
        self._arrays = None
        return table

    def column(self, pa, column_type, counters: list, tables: list, per_row: list):
        """The column of a batch: `counters` holds each scan's counters (bytes) in row order, `tables` their
        slot tables' numbers (table_number), `per_row` how many scans each row has (0 to 2)."""
        import numpy as np

        if self._cut is not None:
            cut = self._cut(counters, list(map(self._table_labels.__getitem__, tables)), per_row, *_LAYOUT)
            row_offsets, labels, count, fixed, uvarint, zigzag, u_offsets, u_values, z_offsets, z_values = (
                np.frombuffer(part, np.int64 if i in (3, 4, 5) else np.int32) for i, part in enumerate(cut))
        else:
            row_offsets, labels, count, fixed, uvarint, zigzag, u_offsets, u_values, z_offsets, z_values = (
                self.cut_numpy(np, counters, tables, per_row))
        if self._arrow_labels is None or len(self._arrow_labels[0]) != len(self._labels):
            self._arrow_labels = tuple(pa.array([label[i] for label in self._labels], pa.string()) for i in range(3))
        picked = pa.array(labels)
        arrays = [
            *(names.take(picked) for names in self._arrow_labels),
            pa.array(count),
            pa.array(fixed),
            pa.array(uvarint),
            pa.array(zigzag),
            pa.ListArray.from_arrays(pa.array(u_offsets), pa.array(u_values)),
            pa.ListArray.from_arrays(pa.array(z_offsets), pa.array(z_values)),
        ]
        structs = pa.StructArray.from_arrays(arrays, fields=list(column_type.value_type))
        return pa.ListArray.from_arrays(pa.array(row_offsets), structs, type=column_type)

    def cut_numpy(self, np, counters: list, tables: list, per_row: list) -> tuple:
        """What capture._columns.cut returns, as numpy arrays (the reference): per row the present slots before
        it (and after the last row), per present slot its label number, count, fixed, uvarint and zig-zag bytes,
        and the offsets and values of its two histograms without their trailing zero counts."""
        if self._arrays is None:
            sizes = np.array([len(t) // 4 for t in self._table_labels], np.int64)
            starts = np.zeros(len(sizes), np.int64)
            np.cumsum(sizes[:-1], out=starts[1:])
            self._arrays = (np.frombuffer(b"".join(self._table_labels), np.int32), starts, sizes)
        label_numbers, table_starts, table_sizes = self._arrays
        buffer = self._buffer
        buffer.seek(0)
        buffer.writelines(counters)
        size = buffer.tell()
        if size % _SLOT_BYTES:
            raise ValueError(f"integer counters of {size} bytes, not whole slots of {_SLOT_BYTES}")
        if sum(per_row) != len(counters) or len(tables) != len(counters):
            raise ValueError(f"{len(counters)} scans' counters, {len(tables)} slot tables, rows of {sum(per_row)} scans")
        view = buffer.getbuffer()
        counts = None
        try:
            counts = np.frombuffer(view, np.int32, size // COUNTER_BYTES).reshape(-1, SLOT_STRIDE)
            numbers = np.array(tables, np.int64)
            sizes = table_sizes[numbers]
            # Slots before each scan, and before each row's first scan.
            scan_ends = np.zeros(len(numbers) + 1, np.int64)
            np.cumsum(sizes, out=scan_ends[1:])
            scan_bytes = np.array([len(c) for c in counters], np.int64)
            if not np.array_equal(scan_bytes, sizes * _SLOT_BYTES):
                raise ValueError("a scan's counters do not match its slot table")
            row_ends = np.zeros(len(per_row) + 1, np.int64)
            np.cumsum(per_row, out=row_ends[1:])
            row_ends = scan_ends[row_ends]
            # Slot i of scan j has label label_numbers[table_starts[table j] + i].
            labels = label_numbers[np.repeat(table_starts[numbers] - scan_ends[:-1], sizes) + np.arange(len(counts))]
            present = counts[:, SLOT_OCCURRENCES] > 0  # the field was there (an empty array counts)
            kept = np.flatnonzero(present)
            figures = counts[kept, SLOT_COUNT:SLOT_ZHIST + HISTOGRAM_BUCKETS]  # a copy: the buffer is free again
        finally:
            del counts  # the buffer's last reader: released, it can be written again
            view.release()
        if size > _KEEP_BUFFER:
            self._buffer = io.BytesIO()
        # Row r's fields end where the present slots before row_ends[r] end.
        before = np.zeros(len(present) + 1, np.int32)
        np.cumsum(present, out=before[1:])
        first = SLOT_COUNT  # figures' column 0
        hists = figures[:, SLOT_UHIST - first:SLOT_ZHIST - first + HISTOGRAM_BUCKETS]
        return (before[row_ends], labels[kept], figures[:, SLOT_COUNT - first].astype(np.int32),
                figures[:, SLOT_FIXED - first].astype(np.int64), figures[:, SLOT_UVARINT - first].astype(np.int64),
                figures[:, SLOT_ZIGZAG - first].astype(np.int64), *_trimmed(np, hists[:, :HISTOGRAM_BUCKETS]),
                *_trimmed(np, hists[:, HISTOGRAM_BUCKETS:]))


def _trimmed(np, counts) -> tuple:
    """(offsets, values) of trimmed_histograms as numpy int32 arrays."""
    nonzero = counts != 0
    keep = np.where(nonzero.any(axis=1), HISTOGRAM_BUCKETS - np.argmax(nonzero[:, ::-1], axis=1), 0)
    values = counts[np.arange(HISTOGRAM_BUCKETS) < keep[:, None]].astype(np.int32)  # row-major: each row's in order
    offsets = np.zeros(len(keep) + 1, np.int32)
    np.cumsum(keep, out=offsets[1:])
    return offsets, values


def trimmed_histograms(pa, np, counts):
    """Each row of `counts` (slots x 10 bucket counts) as a list<int32> without its trailing zero
    counts: most values of a field take one or two varint bytes, so a list holds 1 or 2 counts
    rather than 10, which halves the column's Parquet write and read (schema version 3)."""
    offsets, values = _trimmed(np, counts)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
