"""The integer_fields column of a capture batch, cut out of the scans' counters by Arrow kernels, not Python loops.

Each row holds the scans' (location, slots, counters as bytes); the counters of a whole batch are
joined into one int64 buffer that Arrow reads in place (IntegerFieldColumns).
"""

from __future__ import annotations

from array import array

from kinspect.protocol.codec.codegen import SLOT_COUNT, SLOT_FIXED, SLOT_STRIDE, SLOT_UHIST, SLOT_UVARINT, SLOT_ZHIST, SLOT_ZIGZAG


class IntegerFieldColumns:
    """Builds the integer_fields column of a batch from each row's (location, slots, counters) groups.

    Every slot gets a label (location, path, type) numbered once per writer; a slot table
    (a scanned struct's int_slots, one tuple object per api, version and direction) maps
    to its labels once. A batch then only appends counters and label numbers (memory
    copies); Arrow kernels keep the slots whose field was there and cut out the figures.
    """

    def __init__(self) -> None:
        self._label_ids: dict = {}  # (location, path, type) -> label number
        self._labels: list[tuple[str, str, str]] = []
        self._tables: dict = {}  # (location, id(slots)) -> (slots, array of label numbers)
        self._arrow_labels = None  # the labels as three Arrow string arrays, rebuilt as they grow
        self._zero = self._zero_scalar = self._element = None  # typed constants, made on first use

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
        import pyarrow.compute as pc

        if self._zero is None:
            # Typed scalars and arrays only: a Python int that pyarrow must infer a type for
            # makes it try `import dateutil` (absent, so never cached): ~0.2 ms per kernel call.
            self._zero = pa.array([0], pa.int64())
            self._zero_scalar = pa.scalar(0, pa.int64())
            self._element = {i: pa.scalar(i, pa.int64()) for i in (0, SLOT_COUNT, SLOT_FIXED, SLOT_UVARINT, SLOT_ZIGZAG)}
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
        counters = b"".join(chunks)
        element = self._element
        values = pa.Array.from_buffers(pa.int64(), len(counters) >> 3, [None, pa.py_buffer(counters)])
        all_slots = pa.FixedSizeListArray.from_arrays(values, SLOT_STRIDE)
        present = pc.greater(pc.list_element(all_slots, element[0]), self._zero_scalar)  # the field was there (an empty array counts)
        slots = all_slots.filter(present)
        picked = pa.Array.from_buffers(pa.int32(), len(labels), [None, pa.py_buffer(labels)]).filter(present)
        if self._arrow_labels is None or len(self._arrow_labels[0]) != len(self._labels):
            self._arrow_labels = tuple(pa.array([label[i] for label in self._labels], pa.string()) for i in range(3))
        # Row r's fields end where the present slots before row_ends[r] end.
        before = pa.concat_arrays([self._zero, pc.cumulative_sum(pc.cast(present, pa.int64()))])
        ends = pa.Array.from_buffers(pa.int32(), len(row_ends), [None, pa.py_buffer(row_ends)])
        offsets = pc.cast(before.take(ends), pa.int32())
        hist = pa.list_(pa.int32())
        arrays = [
            *(names.take(picked) for names in self._arrow_labels),
            pc.cast(pc.list_element(slots, element[SLOT_COUNT]), pa.int32()),
            pc.list_element(slots, element[SLOT_FIXED]),
            pc.list_element(slots, element[SLOT_UVARINT]),
            pc.list_element(slots, element[SLOT_ZIGZAG]),
            pc.cast(pc.list_slice(slots, SLOT_UHIST, SLOT_UHIST + 10), hist),
            pc.cast(pc.list_slice(slots, SLOT_ZHIST, SLOT_ZHIST + 10), hist),
        ]
        structs = pa.StructArray.from_arrays(arrays, fields=list(column_type.value_type))
        return pa.ListArray.from_arrays(offsets, structs, type=column_type)

