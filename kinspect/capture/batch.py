"""Capture rows as Arrow record batches, built column by column from a batch of exchange facts (capture.facts).

The writer never makes a row object: a batch of EXCHANGE tuples is transposed (zip) into
one tuple per field; integer columns and times become Arrow buffers in one C pass each
(capture._columns, where built; else numpy arrays in one call each, a tenth of pa.array's
time on Python ints), and one loop over the two sides of each
exchange makes the row's derived values (tag bytes, tagged fields, error codes, topics,
records, compact sizes; in C where built, capture._derive). capture.columns cuts the
integer_fields figures out of the scans' counters (in C where it is built). Nothing of a
record's key, value or headers was ever read (records are summarized from their batch
headers), and no bytes field reaches a row. tests/support/per_row_batch.py keeps the
per-row builder this replaced, the reference the tests compare it with.
"""

from __future__ import annotations

from kinspect.capture.columns import IntegerFieldColumns
from kinspect.capture.count_later import LaterCounter
from kinspect.capture.facts import FIELDS
from kinspect.capture.schema import COLUMN_NAMES, SCHEMA_VERSION, arrow_schema
from kinspect.protocol.codec import response_header_version
from kinspect.protocol.codec.wire_program import optional_extension
from kinspect.protocol.error_codes import error_name
from kinspect.protocol.specs.api_keys import PRODUCE

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
# The derived columns, in the order of each row's tuple in BatchBuilder._derived (integer_groups: its scans
# with integer counters, 0 to 2).
_DERIVED = ("request_decode_error", "response_decode_error", "request_tag_section_bytes", "response_tag_section_bytes",
            "request_compact_size", "response_compact_size", "tagged_fields", "error_codes", "topic_partitions",
            "record_batches", "record_count", "compression", "record_magics", "integer_groups")
# Per row, the list columns hold tuples (pyarrow reads any sequence): the collector stops
# tracking a tuple of atomic values, so a batch's rows are not promoted while it is built.
_EMPTY = ()


# Integer columns converted by numpy (np.array of a tuple of ints, then pa.array of that array):
# its dtype says the column's type. Out-of-range values raise, as in pa.array; numpy would
# also take a float or a str of digits, which the facts never hold in these fields.
_NUMPY = {
    "connection_id": "int64", "node_id": "int32", "api_key": "int16", "request_version": "int16",
    "response_version": "int16", "request_header_version": "int8", "response_header_version": "int8",
    "correlation_id": "int32", "request_size": "int32", "response_size": "int32", "request_header_size": "int32",
    "response_header_size": "int32", "request_tag_section_bytes": "int32", "response_tag_section_bytes": "int32",
    "request_compact_size": "int32", "response_compact_size": "int32", "record_batches": "int32",
    "record_count": "int64",
}


_WIDTHS = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}


def _from_buffers(pa, arrow_type, n: int, data: bytes, validity: bytes | None, nulls: int):
    """An Arrow array of n values of a fixed-width type, from the buffers capture._columns made."""
    return pa.Array.from_buffers(arrow_type, n, [None if validity is None else pa.py_buffer(validity),
                                                 pa.py_buffer(data)], null_count=nulls)


def _integers(pa, np, values, dtype: str, arrow_type, native=None):
    """An integer column of `values` (a tuple of ints, None for null: pa.array's nulls, in a column that
    has none too, as the per-row builder gave them). `native`: capture._columns.integers, which makes the
    column's buffers in one pass where every value is an int that fits (else numpy decides, the reference)."""
    if native is not None:
        made = native(values, _WIDTHS[dtype])
        if made is not None:
            return _from_buffers(pa, arrow_type, len(values), *made)
    try:
        return pa.array(np.array(values, dtype))
    except TypeError:  # a None (numpy has no null): pa.array, as fast as numpy with its checks on a few
        return pa.array(values, type=arrow_type)


def _times(pa, np, values, offset: float, arrow_type, native=None):
    """Seconds (monotonic, or a latency) plus offset, to integer microseconds (None stays null), rounded
    as round() does: half to even, on the same float64 products as round((t + offset) * 1_000_000)."""
    if native is not None:  # capture._columns.micros: the same operations in one pass, where every value is a float
        made = native(values, offset)
        if made is not None:
            return _from_buffers(pa, arrow_type, len(values), *made)
    seconds = np.array(values, np.float64)  # None -> NaN (no time is ever NaN)
    missing = np.isnan(seconds)
    micros = np.rint((seconds + offset) * 1_000_000)
    if missing.any():
        micros[missing] = 0
        return pa.array(micros.astype(np.int64), type=arrow_type, mask=missing)
    return pa.array(micros.astype(np.int64), type=arrow_type)


class BatchBuilder:
    """Turns lists of EXCHANGE tuples into record batches of the capture schema (one per writer thread).

    `wall_offset` maps the events' monotonic times to UTC; `registry` (the events' codec's,
    SpecRegistry.default() if None) says which request versions are flexible. `native`: the
    integer_fields figures are cut in C where it is built (capture.columns), else by numpy, and the
    derived columns are worked out in C where built (capture._derive), else in Python.
    """

    def __init__(self, wall_offset: float, registry=None, versions: dict | None = None, native: bool = True) -> None:
        # The integer counters the event loop left for later, counted with a codec of these specs (None: the
        # built-in ones, loaded at the first frame to count).
        self.later = LaterCounter(registry)
        if versions is not None:
            registry = None  # every request version the specs define, as versions_table() gave them
        elif registry is None:
            from kinspect.protocol.specs.registry import SpecRegistry

            registry = SpecRegistry.default()
        self.wall_offset = wall_offset
        self.registry = registry
        self._versions: dict = dict(versions or {})  # (api key, version) -> (flexible, first flexible version)
        self._flexible = {key: facts[0] for key, facts in self._versions.items()}  # the same, one dict each
        self._first = {key: facts[1] for key, facts in self._versions.items()}
        # pyarrow is imported at the first build: a proxy whose rows are built by the writer process
        # makes a builder only to hand its settings on, and never loads pyarrow (about 40 MB).
        self.schema = None
        self._pa = self._np = None
        self._types: dict = {}
        self._integer_fields = IntegerFieldColumns(native)  # its label tables grow with the apis seen
        self._utf8_sizes: dict = {}  # client id -> its UTF-8 bytes
        # The derived columns' loop in C where built (`native`), and the caches it keeps of two pure functions.
        self._derive = getattr(optional_extension("kinspect.capture._derive") if native else None, "derive", None)
        self._error_names: dict = {}  # error code -> error_name(code)
        self._header_versions: dict = {}  # api key -> response_header_version(api_key, True)
        # Integer and time columns' Arrow buffers in C where built (`native`), else numpy's conversion.
        columns_module = optional_extension("kinspect.capture._columns") if native else None
        self._native_integers = getattr(columns_module, "integers", None)
        self._native_micros = getattr(columns_module, "micros", None)

    def _arrow(self):
        import numpy as np
        import pyarrow as pa

        self._np = np
        self.schema = arrow_schema()
        self._types = {field.name: field.type for field in self.schema}
        self._pa = pa
        return pa

    def build(self, facts: list[tuple]):
        """One pa.RecordBatch of the exchanges `facts` (raises on facts that are not EXCHANGE tuples)."""
        pa = self._pa or self._arrow()
        np = self._np
        types = self._types
        facts = self.later.count(facts)
        n = len(facts)
        fields = tuple(zip(*facts)) if n else ((),) * len(FIELDS)
        if len(fields) != len(FIELDS):
            raise ValueError(f"an exchange's facts have {len(fields)} fields, not {len(FIELDS)}")
        columns = {name: fields[_AT[field]] for name, field in _PLAIN.items()}
        columns.update(self._derived(facts))
        arrays = {"schema_version": pa.array(np.full(n, SCHEMA_VERSION, np.int16))}
        offset = self.wall_offset
        micros = self._native_micros
        arrays["request_time"] = _times(pa, np, fields[_AT["request_time"]], offset, types["request_time"], micros)
        arrays["response_time"] = _times(pa, np, fields[_AT["response_time"]], offset, types["response_time"], micros)
        arrays["latency_us"] = _times(pa, np, fields[_AT["latency"]], 0.0, types["latency_us"], micros)
        keys = list(zip(fields[_AT["api_key"]], fields[_AT["request_version"]]))
        flexible = list(map(self._flexible.get, keys))
        if None in flexible:  # a version not looked up yet
            for key in keys:
                if key not in self._flexible:
                    self._version_facts(key)
            flexible = list(map(self._flexible.get, keys))
        arrays["flexible"] = pa.array(flexible, type=types["flexible"])
        arrays["first_flexible_version"] = pa.array(list(map(self._first.get, keys)),
                                                    type=types["first_flexible_version"])
        integer_fields = columns.pop("integer_fields")
        arrays["integer_fields"] = self._integer_fields.column(pa, types["integer_fields"], *integer_fields)
        for name, values in columns.items():
            dtype = _NUMPY.get(name)
            if dtype is None:
                arrays[name] = pa.array(values, type=types[name])
            else:
                arrays[name] = _integers(pa, np, values, dtype, types[name], self._native_integers)
        return pa.RecordBatch.from_arrays([arrays[name] for name in COLUMN_NAMES], schema=self.schema)

    def spec_layers(self) -> list | None:
        """The layers of the specs the counters left for later are counted with, for a builder in another process
        (BatchBuilder(..., SpecRegistry(layers), versions=...)); None for the built-in specs alone, which that
        process loads itself."""
        registry = self.later.registry
        if registry is None:
            return None
        from kinspect.protocol.specs.registry import load_builtin_layers

        builtin = load_builtin_layers()
        layers = registry.layers
        same = len(layers) == len(builtin) and all(a is b for a, b in zip(layers, builtin))
        return None if same else list(layers)

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
        self._flexible[key], self._first[key] = facts
        return facts

    def _utf8_size(self, client_id: str | None) -> int:
        """Bytes of a client id in UTF-8 (0 for None), remembered for the few client ids a proxy sees."""
        if len(self._utf8_sizes) >= 4096:  # a client making up ids does not grow it without bound
            self._utf8_sizes.clear()
        size = self._utf8_sizes[client_id] = len(client_id.encode("utf-8")) if client_id is not None else 0
        return size

    def _derived(self, facts: list[tuple]) -> dict:
        """The columns computed from both sides of each exchange: in C where built (capture._derive), else
        _derived_python, its reference."""
        derive = self._derive
        if derive is None or type(facts) is not list:
            return self._derived_python(facts)
        integer_fields = self._integer_fields
        derived, counters, tables = derive(facts, *integer_fields.tables, integer_fields.table_number, self._utf8_sizes,
                                           self._utf8_size, self._error_names, error_name, self._header_versions,
                                           response_header_version, PRODUCE, _LOG_OVERHEAD)
        columns = dict(zip(_DERIVED, derived))
        columns["integer_fields"] = (counters, tables, columns.pop("integer_groups"))
        return columns

    def _derived_python(self, facts: list[tuple]) -> dict:
        """The columns computed from both sides of each exchange, one loop over the batch (the reference of
        capture._derive: change both).

        What follows from an exchange's two SIDEs alone (the bodies' tagged fields, error codes, topics,
        record summaries, integer groups) is worked out again only when a row's sides are not the
        previous row's: exchanges whose bodies were seen before share their SCAN objects (the metrics'
        memo, capture.facts), and the batch's message keeps them shared, so a run of alike exchanges pays
        it once. Each row then adds what its own header and sizes say. Each row's derived values are
        one tuple (a tuple is built in one step, where a list append is a method call per value);
        the batch's are transposed by zip at the end."""
        rows, int_counters, int_tables = [], [], []
        integer_fields = self._integer_fields
        req_tables, resp_tables = integer_fields.tables
        table_number = integer_fields.table_number
        append, counter, table = rows.append, int_counters.append, int_tables.append
        utf8_sizes = self._utf8_sizes
        last_api = last_req = last_side = None  # the sides the values below were worked out from
        req_stats = resp_stats = req_table = resp_table = None
        for (_, _, _, _, _, _, client_id, api_key, _, _, _, _, size, header_size, _, header_tag_bytes,
             header_tags, _, _, req, _, _, response_header_version_, response_size, _, _,
             response_tag_bytes, response_header_tags, side) in facts:
            if req is not last_req or side is not last_side or api_key != last_api:
                last_api, last_req, last_side = api_key, req, side
                req_error = req_delta = resp_error = resp_delta = req_stats = resp_stats = None
                req_tag_bytes = resp_tag_bytes = groups = 0
                req_tagged = resp_tagged = codes = magics = _EMPTY
                topics = summaries = None
                if type(req) is tuple:
                    req_tag_bytes, body_tags, req_delta, slots, req_stats, topics, _, summaries = req
                    if body_tags:
                        req_tagged = tuple([("request_body", p, t, n, s, n is not None) for p, t, n, s in body_tags])
                    if req_stats is not None:
                        hit = req_tables.get(id(slots))
                        req_table = hit[1] if hit is not None else table_number(0, slots)
                        groups = 1
                    if summaries and api_key == PRODUCE:
                        # Distinct magics of the request's batches, ascending (0/1: KIP-724's removed formats).
                        if len(summaries) == 1 and summaries[0] is not None and len(summaries[0]) == 1:
                            magics = (summaries[0][0][0],)  # one batch: most produce requests
                        else:
                            magics = tuple(sorted({b[0] for s in summaries if s is not None for b in s}))
                else:
                    req_error = req
                if type(side) is tuple:
                    resp_tag_bytes, body_tags, resp_delta, slots, resp_stats, more, codes_seen, records = side
                    if body_tags:
                        resp_tagged = tuple([("response_body", p, t, n, s, n is not None) for p, t, n, s in body_tags])
                    if codes_seen:
                        codes = tuple([(code, error_name(code), count) for code, count in sorted(codes_seen)])
                    if resp_stats is not None:
                        hit = resp_tables.get(id(slots))
                        resp_table = hit[1] if hit is not None else table_number(1, slots)
                        groups += 1
                    if more and more != topics:  # the response often names what the request named
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
                    if resp_delta is not None:
                        flexible_header_version = response_header_version(api_key, True)
                elif side is not None:  # None: no response
                    resp_error = side
                batches = records = 0
                compression = _EMPTY
                if summaries and len(summaries) == 1 and summaries[0] is not None and len(summaries[0]) == 1:
                    _, records, codec, length = summaries[0][0]  # one batch: most produce requests
                    records = max(records, 0)
                    batches, compression = 1, ((codec, 1, records, length + _LOG_OVERHEAD),)
                elif summaries:
                    codecs: dict[str, list[int]] = {}
                    for summary in summaries:
                        if summary is None:
                            continue
                        for _, count, compression, length in summary:
                            batches += 1
                            if count < 0:
                                count = 0
                            records += count
                            acc = codecs.get(compression)
                            if acc is None:
                                acc = codecs[compression] = [0, 0, 0]
                            acc[0] += 1
                            acc[1] += count
                            acc[2] += length + _LOG_OVERHEAD
                    compression = tuple([(c, a[0], a[1], a[2]) for c, a in sorted(codecs.items())])
                if not topics:
                    topics = _EMPTY
                elif len(topics) > 1 or type(topics) is not tuple:
                    topics = tuple(sorted(topics))  # (topic, partitions) items, by topic
            # What the row's own header and sizes add.
            tagged = tuple([("request_header", "", tag, None, n, False) for tag, n in header_tags]) if header_tags else ()
            if req_tagged:
                tagged += req_tagged
            req_compact = resp_compact = None
            if req_delta is not None:
                # The header at its flexible version: ClientId keeps its int16 length, plus a tag section.
                client_id_size = utf8_sizes.get(client_id)
                if client_id_size is None:
                    client_id_size = self._utf8_size(client_id)
                req_compact = size + req_delta + 11 + client_id_size - header_size
            if req_stats is not None:
                table(req_table)
                counter(req_stats)
            if response_size is not None:
                if response_header_tags:
                    tagged += tuple([("response_header", "", tag, None, n, False) for tag, n in response_header_tags])
                if resp_tagged:
                    tagged += resp_tagged
                if resp_tag_bytes:
                    response_tag_bytes += resp_tag_bytes
                if resp_delta is not None:  # v0 -> v1 at the flexible version: +1 tag byte
                    resp_compact = response_size + resp_delta + (1 if flexible_header_version > response_header_version_
                                                                  else 0)
                if resp_stats is not None:
                    table(resp_table)
                    counter(resp_stats)
            if req_tag_bytes:
                header_tag_bytes += req_tag_bytes
            append((req_error, resp_error, header_tag_bytes, response_tag_bytes, req_compact,
                    resp_compact, tagged, codes, topics, batches, records, compression, magics, groups))
        columns = dict(zip(_DERIVED, zip(*rows))) if rows else dict.fromkeys(_DERIVED, ())
        columns["integer_fields"] = (int_counters, int_tables, columns.pop("integer_groups"))
        return columns
