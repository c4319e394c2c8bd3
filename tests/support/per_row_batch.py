"""The capture's per-row batch builder as it was before the batch was vectorised (commit b4835cc): the reference of capture.batch.

BatchBuilder here appends every derived value of every row to a list and converts each
column with pa.array; IntegerFieldColumns walks every scan's slots in Python. The
writer's BatchBuilder must give equal record batches (and byte-identical Parquet).
"""

from __future__ import annotations

from array import array

from kinspect.capture.facts import FIELDS
from kinspect.capture.schema import COLUMN_NAMES, SCHEMA_VERSION, arrow_schema
from kinspect.protocol.codec import response_header_version
from kinspect.protocol.error_codes import error_name
from kinspect.protocol.specs.api_keys import PRODUCE
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

        chunks = []  # the bytes of each scan's array('i') (capture.facts), joined once (growing an array copies)
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
        counters = np.frombuffer(b"".join(chunks), np.int32).reshape(-1, SLOT_STRIDE)
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
            pa.array(slots[:, SLOT_FIXED].astype(np.int64)),
            pa.array(slots[:, SLOT_UVARINT].astype(np.int64)),
            pa.array(slots[:, SLOT_ZIGZAG].astype(np.int64)),
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


_LOG_OVERHEAD = 12  # a batch's offset and length fields, not counted in its batch_length

# Columns that are an EXCHANGE field as it is (same name, or renamed here).
_PLAIN = {
    "connection_id": "connection_id", "client_address": "client_address", "client_id": "client_id",
    "broker": "broker", "node_id": "node_id", "api_key": "api_key", "api_name": "api_name",
    "request_version": "request_version", "response_version": "response_version",
    "request_header_version": "request_header_version", "response_header_version": "response_header_version",
    "correlation_id": "correlation_id", "request_size": "request_size",
    "response_size": "response_size", "request_header_size": "request_header_size",
    "response_header_size": "response_header_size", "request_inspected": "request_complete",
    "response_inspected": "response_complete",
    "client_software_name": "client_software_name", "client_software_version": "client_software_version",
}
_AT = {name: i for i, name in enumerate(FIELDS)}
# Per row, the list columns hold tuples (pyarrow reads any sequence): the collector stops
# tracking a tuple of atomic values, so a batch's rows are not promoted while it is built.
_EMPTY = ()


def _times(values, offset: float) -> list:
    """Monotonic seconds to UTC microseconds (None stays None), rounded as round() does: half to even."""
    return [None if t is None else round((t + offset) * 1_000_000) for t in values]


def _latencies(values) -> list:
    return [None if t is None else round(t * 1_000_000) for t in values]


class BatchBuilder:
    """Turns lists of EXCHANGE tuples into record batches of the capture schema (one per writer thread).

    `wall_offset` maps the events' monotonic times to UTC; `registry` (the events' codec's,
    SpecRegistry.default() if None) says which request versions are flexible.
    """

    def __init__(self, wall_offset: float, registry=None, versions: dict | None = None) -> None:
        if versions is not None:
            registry = None  # every request version the specs define, as versions_table() gave them
        elif registry is None:
            from kinspect.protocol.specs.registry import SpecRegistry

            registry = SpecRegistry.default()
        self.wall_offset = wall_offset
        self.registry = registry
        self._versions: dict = dict(versions or {})  # (api key, version) -> (flexible, first flexible version)
        # pyarrow is imported at the first build: a proxy whose rows are built by the writer process
        # makes a builder only to hand its settings on, and never loads pyarrow (about 40 MB).
        self.schema = None
        self._pa = None
        self._types: dict = {}
        self._integer_fields = IntegerFieldColumns()  # its label tables grow with the apis seen
        self._codec = None  # counts what the event loop left for later (_counted), with the Python scanner

    def _counted(self, facts: list[tuple]) -> list[tuple]:
        """Every side whose counters were left for later (int_stats (frame, pos)) with them counted: in Python,
        by Codec.scan, the reference of capture.count_later (added with it; the builder before had none)."""
        from kinspect.protocol.codec import Codec
        from kinspect.protocol.specs.registry import SpecRegistry

        from kinspect.protocol.errors import DecodeError

        out = []
        for row in facts:
            if type(row) is not tuple or len(row) != len(FIELDS):
                out.append(row)  # build() says what is wrong
                continue
            row = list(row)
            for at, version_at, direction in ((19, 9, "request"), (28, 21, "response")):
                side = row[at]
                if type(side) is tuple and type(side[4]) is tuple:
                    self._codec = self._codec or Codec(self.registry or SpecRegistry.default())
                    frame, pos = side[4]
                    try:  # a frame that does not scan as its row's api says (facts made up by a test): no counters
                        result = self._codec.body(row[7], direction, row[version_at]).scan(
                            frame, pos, whole=False, integers=True).finish()
                    except DecodeError:
                        row[at] = side[:3] + ((), None) + side[5:]
                        continue
                    row[at] = side[:3] + ((result.int_slots, result.int_stats) if result.int_stats is not None
                                          else ((), None)) + side[5:]
            out.append(tuple(row))
        return out

    def _arrow(self):
        import pyarrow as pa

        self.schema = arrow_schema()
        self._types = {field.name: field.type for field in self.schema}
        self._pa = pa
        return pa

    def build(self, facts: list[tuple]):
        """One pa.RecordBatch of the exchanges `facts` (raises on facts that are not EXCHANGE tuples)."""
        pa = self._pa or self._arrow()
        types = self._types
        facts = self._counted(facts)
        n = len(facts)
        fields = tuple(zip(*facts)) if n else ((),) * len(FIELDS)
        if len(fields) != len(FIELDS):
            raise ValueError(f"an exchange's facts have {len(fields)} fields, not {len(FIELDS)}")
        columns = {name: fields[_AT[field]] for name, field in _PLAIN.items()}
        columns["schema_version"] = [SCHEMA_VERSION] * n
        columns["request_time"] = _times(fields[_AT["request_time"]], self.wall_offset)
        columns["response_time"] = _times(fields[_AT["response_time"]], self.wall_offset)
        columns["latency_us"] = _latencies(fields[_AT["latency"]])
        versions = self._versions
        flexible = [versions.get(key) or self._version_facts(key)
                    for key in zip(fields[_AT["api_key"]], fields[_AT["request_version"]])]
        columns["flexible"] = [f[0] for f in flexible]
        columns["first_flexible_version"] = [f[1] for f in flexible]
        columns.update(self._derived(facts))
        arrays = []
        for name in COLUMN_NAMES:
            if name == "integer_fields":
                arrays.append(self._integer_fields.column(pa, types[name], *columns[name]))
            else:
                arrays.append(pa.array(columns[name], type=types[name]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def versions_table(self) -> dict:
        """Every request version the specs define -> (flexible, first flexible version): what a builder in
        another process needs of the specs (BatchBuilder(..., versions=table))."""
        if self.registry is None:
            return dict(self._versions)
        for api_key in self.registry.api_keys():
            for version in self.registry.versions(api_key, "request"):
                if (api_key, version) not in self._versions:
                    self._version_facts((api_key, version))
        return dict(self._versions)

    def _version_facts(self, key: tuple) -> tuple:
        """(whether the request version is flexible, the api's first flexible version or None)."""
        spec = self.registry.message(key[0], "request", key[1]) if self.registry is not None else None
        if spec is None:
            facts = (False, None)
        else:
            flexible = spec.flexible_versions
            facts = (key[1] in flexible, None if flexible.empty else flexible.low)
        self._versions[key] = facts
        return facts

    @staticmethod
    def _derived(facts: list[tuple]) -> dict:
        """The columns computed from both sides of each exchange, one loop over the batch."""
        req_errors, resp_errors, req_tag_bytes, resp_tag_bytes = [], [], [], []
        req_compact, resp_compact, tagged_col, errors_col, int_groups, int_rows = [], [], [], [], [], []
        topics_col, batches_col, records_col, compression_col, magics_col = [], [], [], [], []
        for (_, _, _, _, _, _, client_id, api_key, _, _, _, _, size, header_size, _, header_tag_bytes,
             header_tags, _, _, req, _, _, response_header_version_, response_size, _, _,
             response_tag_bytes, response_header_tags, side) in facts:
            tagged = tuple([("request_header", "", tag, None, n, False) for tag, n in header_tags]) if header_tags else ()
            compact = error = None
            topics = summaries = None
            groups = 0
            magics = _EMPTY
            if type(req) is tuple:
                tag_bytes, body_tags, delta, slots, stats, topics, _, summaries = req
                header_tag_bytes += tag_bytes
                if body_tags:
                    tagged += tuple([("request_body", p, t, n, s, n is not None) for p, t, n, s in body_tags])
                if delta is not None:
                    # The header at its flexible version: ClientId keeps its int16 length, plus a tag section.
                    flexible_header = 11 + (len(client_id.encode("utf-8")) if client_id is not None else 0)
                    compact = size + delta + flexible_header - header_size
                if stats is not None:
                    int_groups.append(("request", slots, stats))
                    groups = 1
                if summaries and api_key == PRODUCE:
                    # Distinct magics of the request's batches, ascending (0/1: KIP-724's removed formats).
                    magics = tuple(sorted({b[0] for s in summaries if s is not None for b in s}))
            else:
                error = req
            req_errors.append(error)
            req_tag_bytes.append(header_tag_bytes)
            req_compact.append(compact)
            magics_col.append(magics)
            codes = _EMPTY
            compact = error = None
            if response_size is not None:
                if response_header_tags:
                    tagged += tuple([("response_header", "", tag, None, n, False) for tag, n in response_header_tags])
                if type(side) is tuple:
                    tag_bytes, body_tags, delta, slots, stats, more, codes_seen, records = side
                    response_tag_bytes += tag_bytes
                    if body_tags:
                        tagged += tuple([("response_body", p, t, n, s, n is not None) for p, t, n, s in body_tags])
                    if codes_seen:
                        codes = tuple([(code, error_name(code), count) for code, count in sorted(codes_seen)])
                    if stats is not None:
                        int_groups.append(("response", slots, stats))
                        groups += 1
                    if more:
                        if topics:  # a topic named by both directions counts the larger number of partitions
                            merged = dict(topics)
                            for topic, n in more:
                                if merged.get(topic, -1) < n:
                                    merged[topic] = n
                            topics = merged.items()
                        else:
                            topics = more
                    if records:
                        summaries = summaries + records if summaries else records
                    if delta is not None:
                        grows = response_header_version(api_key, True) > response_header_version_  # v0 -> v1: +1 tag byte
                        compact = response_size + delta + (1 if grows else 0)
                else:
                    error = side
            resp_errors.append(error)
            resp_tag_bytes.append(response_tag_bytes)
            resp_compact.append(compact)
            tagged_col.append(tagged)
            errors_col.append(codes)
            int_rows.append(groups)
            topics_col.append(tuple(sorted(topics)) if topics else _EMPTY)  # (topic, partitions) items, by topic
            batches = records = 0
            compression = _EMPTY
            if summaries:
                codecs: dict[str, list[int]] = {}
                for summary in summaries:
                    if summary is None:
                        continue
                    for _, count, compression, length in summary:
                        batches += 1
                        count = max(count, 0)
                        records += count
                        acc = codecs.get(compression)
                        if acc is None:
                            acc = codecs[compression] = [0, 0, 0]
                        acc[0] += 1
                        acc[1] += count
                        acc[2] += length + _LOG_OVERHEAD
                compression = tuple([(c, a[0], a[1], a[2]) for c, a in sorted(codecs.items())])
            batches_col.append(batches)
            records_col.append(records)
            compression_col.append(compression)
        return {
            "request_decode_error": req_errors, "response_decode_error": resp_errors,
            "request_tag_section_bytes": req_tag_bytes, "response_tag_section_bytes": resp_tag_bytes,
            "request_compact_size": req_compact, "response_compact_size": resp_compact,
            "tagged_fields": tagged_col, "error_codes": errors_col, "integer_fields": (int_groups, int_rows),
            "topic_partitions": topics_col, "record_batches": batches_col, "record_count": records_col,
            "compression": compression_col, "record_magics": magics_col,
        }
