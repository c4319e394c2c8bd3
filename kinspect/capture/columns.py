"""The integer_fields column of a capture batch, cut out of the scans' counters by numpy, not Python loops.

Each row holds the scans' (location, slots, counters as bytes); the counters of a whole batch are
joined into one int64 buffer that numpy reads in place (IntegerFieldColumns).
"""

from __future__ import annotations

from array import array

from kinspect.protocol.codec.codegen import (SLOT_COUNT, SLOT_FIXED, SLOT_OCCURRENCES, SLOT_STRIDE, SLOT_UHIST, SLOT_UVARINT,
                                             SLOT_ZHIST, SLOT_ZIGZAG)

HISTOGRAM_BUCKETS = 10  # a varint of a 64-bit value takes 1 to 10 bytes


class IntegerFieldColumns:
    """Builds the integer_fields column of a batch from each row's (location, slots, counters) groups.

    Every slot gets a label (location, path, type) numbered once per writer; a slot table
    (a scanned struct's int_slots, one tuple object per api, version and direction) maps
    to its labels once. A batch then only appends counters and label numbers (memory
    copies); numpy keeps the slots whose field was there and cuts out the figures.
    """

    def __init__(self) -> None:
        self._label_ids: dict = {}  # (location, path, type) -> label number
        self._labels: list[tuple[str, str, str]] = []
        self._tables: dict = {}  # (location, id(slots)) -> (slots, array of label numbers)
        self._arrow_labels = None  # the labels as three Arrow string arrays, rebuilt as they grow

    def _table(self, location: str, slots: tuple) -> array:
        hit = self._tables.get((location, id(slots)))
        if hit is not None and hit[0] is slots:
            return hit[1]
        ids = array("i")
        for path, kind in slots:
            key = (location, path, kind)
            number = self._label_ids.get(key)
            if number is None:
                number = self._label_ids[key] = len(self._labels)
                self._labels.append(key)
            ids.append(number)
        self._tables[(location, id(slots))] = (slots, ids)  # holds slots: its id stays unique
        return ids

    def column(self, pa, column_type, groups: list, per_row: list):
        """The column of a batch: `groups` holds every row's (location, slots, counters) in row
        order, `per_row` how many of them each row has."""
        import numpy as np

        chunks = []  # the bytes of each scan's array('q') (capture.facts), joined once (growing an array copies)
        labels = array("i")
        row_ends = array("i", [0])  # slots before each row
        table = self._table
        groups = iter(groups)
        for count in per_row:
            for _ in range(count):
                location, slots, stats = next(groups)
                chunks.append(stats)
                labels.extend(table(location, slots))
            row_ends.append(len(labels))
        counters = np.frombuffer(b"".join(chunks), np.int64).reshape(-1, SLOT_STRIDE)
        present = counters[:, SLOT_OCCURRENCES] > 0  # the field was there (an empty array counts)
        slots = counters[present]
        picked = pa.array(np.frombuffer(labels, np.int32)[present])
        if self._arrow_labels is None or len(self._arrow_labels[0]) != len(self._labels):
            self._arrow_labels = tuple(pa.array([label[i] for label in self._labels], pa.string()) for i in range(3))
        # Row r's fields end where the present slots before row_ends[r] end.
        before = np.zeros(len(present) + 1, np.int32)
        np.cumsum(present, out=before[1:])
        offsets = pa.array(before[np.frombuffer(row_ends, np.int32)])
        arrays = [
            *(names.take(picked) for names in self._arrow_labels),
            pa.array(slots[:, SLOT_COUNT].astype(np.int32)),
            pa.array(slots[:, SLOT_FIXED]),
            pa.array(slots[:, SLOT_UVARINT]),
            pa.array(slots[:, SLOT_ZIGZAG]),
            trimmed_histograms(pa, np, slots[:, SLOT_UHIST:SLOT_UHIST + HISTOGRAM_BUCKETS]),
            trimmed_histograms(pa, np, slots[:, SLOT_ZHIST:SLOT_ZHIST + HISTOGRAM_BUCKETS]),
        ]
        structs = pa.StructArray.from_arrays(arrays, fields=list(column_type.value_type))
        return pa.ListArray.from_arrays(offsets, structs, type=column_type)


def trimmed_histograms(pa, np, counts):
    """Each row of `counts` (slots x 10 bucket counts) as a list<int32> without its trailing zero
    counts: most values of a field take one or two varint bytes, so a list holds 1 or 2 counts
    rather than 10, which halves the column's Parquet write and read (schema version 3)."""
    nonzero = counts != 0
    keep = np.where(nonzero.any(axis=1), HISTOGRAM_BUCKETS - np.argmax(nonzero[:, ::-1], axis=1), 0)
    values = counts[np.arange(HISTOGRAM_BUCKETS) < keep[:, None]].astype(np.int32)  # row-major: each row's in order
    offsets = np.zeros(len(keep) + 1, np.int32)
    np.cumsum(keep, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
