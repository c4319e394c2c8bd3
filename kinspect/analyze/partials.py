"""Partial aggregates of one piece of capture rows, computed with Arrow's compiled kernels.

Every aggregate of kinspect.analyze.aggregates is computed in two steps: here, a Spark task
reads its piece of the capture files with pyarrow (only the columns the aggregate needs),
groups it with Arrow's hash aggregation and splits the partial rows into buckets by a hash
of their keys (`partial_blobs`); Spark shuffles the buckets as Arrow IPC bytes and another
task merges each (kinspect.analyze.merge). The driver does both for a small capture. No
Python runs per row: list columns are flattened and grouped by Arrow, never looped over.

Each aggregate's function takes a pyarrow Table holding (at least) COLUMNS[name] and returns
a Table of PARTIAL_SCHEMAS[name]: the aggregate's keys and its mergeable partial values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kinspect.analyze.inputs import MALFORMED, REQUIRED_COLUMNS
from kinspect.capture.schema import arrow_schema

# `values` directions: a request size, a response size, a latency (microseconds)
REQUEST, RESPONSE, LATENCY = 0, 1, 2

EXCHANGE_KEYS = ("software", "software_version", "client_id", "api_key", "api_name", "version", "response_version",
                 "magic_mask", "first_flexible_version", "flexible", "schema_version")
EXCHANGE_SUMS = ("n", "request_bytes", "response_bytes", "responses", "request_decode_errors",
                 "response_decode_errors", "requests_not_inspected", "kip_requests", "kip_request_bytes",
                 "kip_request_compact", "kip_responses", "kip_response_bytes", "kip_response_compact")
HIST = tuple(f"u{i}" for i in range(1, 11)) + tuple(f"z{i}" for i in range(1, 11))

# name -> the capture columns its partial reads
COLUMNS: dict[str, tuple[str, ...]] = {
    "exchanges": ("client_software_name", "client_software_version", "client_id", "api_key", "api_name",
                  "request_version", "response_version", "record_magics", "first_flexible_version", "flexible",
                  "schema_version", "request_time", "request_size", "response_size", "request_decode_error",
                  "response_decode_error", "request_inspected", "request_compact_size", "response_compact_size"),
    "addresses": ("client_software_name", "client_software_version", "client_address"),
    "values": ("api_key", "api_name", "request_version", "response_version", "request_size", "response_size",
               "latency_us"),
    "topics": ("topic_partitions", "request_size", "response_size"),
    "tags": ("api_key", "api_name", "tagged_fields"),
    "integers": ("api_key", "api_name", "integer_fields"),
    "errors": ("api_key", "api_name", "error_codes"),
}

# name -> its partial rows' columns and types, in Spark SQL type names (arrow_schema_of reads them)
PARTIAL_SCHEMAS: dict[str, str] = {
    "exchanges": ("software string, software_version string, client_id string, api_key int, api_name string, "
                  "version int, response_version int, magic_mask bigint, first_flexible_version int, "
                  "flexible boolean, schema_version int, lo bigint, hi bigint, "
                  + ", ".join(f"{name} bigint" for name in EXCHANGE_SUMS)),
    "addresses": "software string, software_version string, address string",
    "values": "api_key int, api_name string, direction tinyint, version int, v bigint, n bigint",
    "topics": "topic string, exchanges bigint, request_bytes bigint, response_bytes bigint",
    "tags": ("api_key int, api_name string, location string, path string, tag int, name string, known boolean, "
             "count bigint, bytes bigint"),
    "integers": ("api_key int, api_name string, location string, path string, type string, exchanges bigint, "
                 "count bigint, fixed_bytes bigint, packed_bytes bigint, upacked_bytes bigint, "
                 + ", ".join(f"{name} bigint" for name in HIST)),
    "errors": "api_key int, api_name string, code int, name string, count bigint, exchanges bigint",
}

_I32, _I64 = pa.int32(), pa.int64()
CHUNK_ROWS = 500_000  # rows grouped at once by a task (scan.PIECE_ROWS: a local piece is one chunk)


def _group(table: pa.Table, keys, aggregations) -> pa.Table:
    """`table` grouped by `keys` (nulls form their own group), as Spark's groupBy does."""
    return table.group_by(list(keys), use_threads=False).aggregate(list(aggregations))


def _renamed(table: pa.Table, names: dict[str, str]) -> pa.Table:
    return table.rename_columns([names.get(c, c) for c in table.column_names])


def _flag(condition) -> pa.Array:
    """1 where `condition` is true, 0 where false or null (Spark's count of when(condition))."""
    return pc.cast(pc.fill_null(condition, False), _I64)


def _where(condition, value) -> pa.Array:
    """`value` where `condition` is true, null elsewhere (Spark's when(condition, value))."""
    return pc.if_else(pc.fill_null(condition, False), pc.cast(value, _I64), pa.scalar(None, _I64))


def _api(table: pa.Table) -> dict[str, pa.Array]:
    return {"api_key": pc.cast(table["api_key"], _I32), "api_name": table["api_name"]}


def _inline(table: pa.Table, column: str) -> tuple["_Fields", np.ndarray]:
    """The elements of a list<struct> column, and the row each came from (Spark's inline())."""
    lists = table[column]  # chunked (a chunk per row group): flattened per chunk, no copy of the whole
    return _Fields(pc.list_flatten(lists)), pc.list_parent_indices(lists).to_numpy()


class _Fields:
    """The members of a (chunked) struct array, by name."""

    def __init__(self, elements):
        self.elements = elements

    def field(self, name: str):
        return pc.struct_field(self.elements, name)


def _magic_mask(table: pa.Table) -> pa.Array:
    """The record-batch magic values seen (0, 1, 2) as a bit mask (bit m: magic m), 0 for none."""
    mask = np.zeros(table.num_rows, np.int64)
    lists = table["record_magics"].combine_chunks()
    magics = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    if len(magics):
        rows = pc.list_parent_indices(lists).to_numpy()
        known = (magics >= 0) & (magics <= 2)
        np.bitwise_or.at(mask, rows[known], np.left_shift(1, magics[known].astype(np.int64)))
    return pa.array(mask)


def exchanges(table: pa.Table) -> pa.Table:
    request_size, response_size = table["request_size"], table["response_size"]
    has_response = pc.is_valid(response_size)
    kip = pc.and_(pc.invert(table["flexible"]), pc.is_valid(table["first_flexible_version"]))
    kip_request = pc.and_(kip, pc.is_valid(table["request_compact_size"]))
    kip_response = pc.and_(pc.and_(kip, pc.is_valid(table["response_compact_size"])), has_response)
    rows = pa.table({
        "software": pc.fill_null(table["client_software_name"], "unknown"),
        "software_version": table["client_software_version"], "client_id": table["client_id"], **_api(table),
        "version": pc.cast(table["request_version"], _I32),
        "response_version": pc.cast(pc.coalesce(table["response_version"], table["request_version"]), _I32),
        "magic_mask": _magic_mask(table),
        "first_flexible_version": pc.cast(table["first_flexible_version"], _I32), "flexible": table["flexible"],
        "schema_version": pc.cast(table["schema_version"], _I32),
        "t_us": pc.cast(pc.cast(table["request_time"], pa.timestamp("us", "UTC")), _I64),
        "request_size": pc.cast(request_size, _I64), "response_size": pc.cast(response_size, _I64),
        "has_response": _flag(has_response),
        "request_decode_error": _flag(pc.is_valid(table["request_decode_error"])),
        "response_decode_error": _flag(pc.is_valid(table["response_decode_error"])),
        "not_inspected": _flag(pc.invert(table["request_inspected"])),
        "kip_request": _flag(kip_request), "kip_request_bytes": _where(kip_request, request_size),
        "kip_request_compact": _where(kip_request, table["request_compact_size"]),
        "kip_response": _flag(kip_response), "kip_response_bytes": _where(kip_response, response_size),
        "kip_response_compact": _where(kip_response, table["response_compact_size"]),
    })
    sums = {"request_size": "request_bytes", "response_size": "response_bytes", "has_response": "responses",
            "request_decode_error": "request_decode_errors", "response_decode_error": "response_decode_errors",
            "not_inspected": "requests_not_inspected", "kip_request": "kip_requests",
            "kip_request_bytes": "kip_request_bytes", "kip_request_compact": "kip_request_compact",
            "kip_response": "kip_responses", "kip_response_bytes": "kip_response_bytes",
            "kip_response_compact": "kip_response_compact"}
    grouped = _group(rows, EXCHANGE_KEYS, [("t_us", "min"), ("t_us", "max"),
                                           ("request_size", "count", pc.CountOptions("all"))]
                     + [(column, "sum") for column in sums])
    names = {"t_us_min": "lo", "t_us_max": "hi", "request_size_count": "n"}
    names |= {f"{column}_sum": name for column, name in sums.items()}
    return _renamed(grouped, names)


def addresses(table: pa.Table) -> pa.Table:
    rows = pa.table({"software": pc.fill_null(table["client_software_name"], "unknown"),
                     "software_version": table["client_software_version"], "address": table["client_address"]})
    return _group(rows, rows.column_names, [])


def values(table: pa.Table) -> pa.Table:
    """Every request size, response size and latency, counted per distinct value."""
    api = _api(table)
    request_version = pc.cast(table["request_version"], _I32)
    parts = [pa.table({**api, "direction": pa.array(np.full(table.num_rows, REQUEST, np.int8)),
                       "version": request_version, "v": pc.cast(table["request_size"], _I64)})]
    for direction, version, value in ((RESPONSE, pc.cast(pc.coalesce(table["response_version"],
                                                                      table["request_version"]), _I32),
                                       table["response_size"]),
                                      (LATENCY, pa.nulls(table.num_rows, _I32), table["latency_us"])):
        part = pa.table({**api, "direction": pa.array(np.full(table.num_rows, direction, np.int8)),
                         "version": version, "v": pc.cast(value, _I64)})
        parts.append(part.filter(pc.is_valid(part["v"])))
    rows = pa.concat_tables(parts)
    grouped = _group(rows, ("api_key", "api_name", "direction", "version", "v"), [("v", "count", pc.CountOptions("all"))])
    return _renamed(grouped, {"v_count": "n"})


def topics(table: pa.Table) -> pa.Table:
    # a topic named twice in one exchange (request and response, say) counts once
    elements, rows = _inline(table, "topic_partitions")
    named = _group(pa.table({"row": rows, "topic": elements.field("topic")}), ("row", "topic"), [])
    at = named["row"]
    per_topic = pa.table({"topic": named["topic"],
                          "request_size": pc.cast(table["request_size"].take(at), _I64),
                          "response_size": pc.cast(pc.fill_null(table["response_size"].take(at), 0), _I64)})
    grouped = _group(per_topic, ("topic",), [("topic", "count", pc.CountOptions("all")),
                                             ("request_size", "sum"), ("response_size", "sum")])
    return _renamed(grouped, {"topic_count": "exchanges", "request_size_sum": "request_bytes",
                              "response_size_sum": "response_bytes"})


def _parent_api(table: pa.Table, rows: np.ndarray) -> dict[str, pa.Array]:
    at = pa.array(rows)
    return {"api_key": pc.cast(table["api_key"].take(at), _I32), "api_name": table["api_name"].take(at)}


def tags(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "tagged_fields")
    flat = pa.table({**_parent_api(table, rows), "location": elements.field("location"), "path": elements.field("path"),
                     "tag": pc.cast(elements.field("tag"), _I32), "name": elements.field("name"),
                     "known": elements.field("known"), "size": pc.cast(elements.field("size"), _I64)})
    grouped = _group(flat, ("api_key", "api_name", "location", "path", "tag", "name", "known"),
                     [("size", "count", pc.CountOptions("all")), ("size", "sum")])
    return _renamed(grouped, {"size_count": "count", "size_sum": "bytes"})


def _hist_columns(hists, prefix: str) -> dict[str, pa.Array]:
    """Element i of every histogram list as column prefix<i+1>, 0 where a list is shorter: schema
    version 3 leaves each list's trailing zero counts out (versions 1 and 2 always wrote 10)."""
    lengths = pc.fill_null(pc.list_value_length(hists), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(hists).to_numpy()
    if (lengths == 10).all():  # a version 1 or 2 file
        columns = np.ascontiguousarray(flat.reshape(-1, 10).T)  # one contiguous row per slot
        return {f"{prefix}{i + 1}": pa.array(columns[i]) for i in range(10)}
    # Most lists hold one to three counts: a slot no list reaches is one shared array of zeros.
    starts = np.cumsum(lengths) - lengths
    zeros = None
    out = {}
    for i in range(10):
        reached = lengths > i
        if reached.any():
            column = np.zeros(len(lengths), flat.dtype)
            column[reached] = flat[starts[reached] + i]
            out[f"{prefix}{i + 1}"] = pa.array(column)
        else:
            zeros = zeros if zeros is not None else pa.array(np.zeros(len(lengths), flat.dtype))
            out[f"{prefix}{i + 1}"] = zeros
    return out


def integers(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "integer_fields")
    flat = pa.table({**_parent_api(table, rows), "location": elements.field("location"),
                     "path": elements.field("path"), "type": elements.field("type"),
                     "count": pc.cast(elements.field("count"), _I64),
                     "fixed_bytes": pc.cast(elements.field("fixed_bytes"), _I64),
                     "packed_bytes": pc.cast(elements.field("zigzag_bytes"), _I64),
                     "upacked_bytes": pc.cast(elements.field("uvarint_bytes"), _I64),
                     **_hist_columns(elements.field("uvarint_hist"), "u"),
                     **_hist_columns(elements.field("zigzag_hist"), "z")})
    sums = ("count", "fixed_bytes", "packed_bytes", "upacked_bytes") + HIST
    grouped = _group(flat, ("api_key", "api_name", "location", "path", "type"),
                     [("count", "count", pc.CountOptions("all"))] + [(column, "sum") for column in sums])
    return _renamed(grouped, {"count_count": "exchanges"} | {f"{column}_sum": column for column in sums})


def errors(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "error_codes")
    flat = pa.table({**_parent_api(table, rows), "code": pc.cast(elements.field("code"), _I32),
                     "name": elements.field("name"), "count": pc.cast(elements.field("count"), _I64)})
    grouped = _group(flat, ("api_key", "api_name", "code", "name"),
                     [("count", "sum"), ("count", "count", pc.CountOptions("all"))])
    return _renamed(grouped, {"count_sum": "count", "count_count": "exchanges"})


PARTIALS = {"exchanges": exchanges, "addresses": addresses, "values": values, "topics": topics,
            "tags": tags, "integers": integers, "errors": errors}


def column_names(name: str) -> list[str]:
    """The column names of PARTIAL_SCHEMAS[name], in order."""
    return [part.strip().split(" ")[0] for part in PARTIAL_SCHEMAS[name].split(",")]


def partial(name: str, table: pa.Table) -> pa.Table:
    """The partial aggregate `name` of these capture rows, its columns in PARTIAL_SCHEMAS order."""
    return PARTIALS[name](table).select(column_names(name))


_ARROW_TYPES = {"string": pa.string(), "int": _I32, "bigint": _I64, "tinyint": pa.int8(), "boolean": pa.bool_()}


def arrow_schema_of(name: str) -> pa.Schema:
    """PARTIAL_SCHEMAS[name] as an Arrow schema (what the task hands Spark)."""
    return pa.schema([(column, _ARROW_TYPES[kind]) for column, kind in
                      (part.strip().split(" ") for part in PARTIAL_SCHEMAS[name].split(","))])


def read_file(path: str, content: bytes | None):
    """A capture file as a pyarrow ParquetFile: from Spark's bytes, or from its file: URI."""
    import pyarrow.parquet as pq

    from kinspect.analyze.inputs import local_path

    try:
        return pq.ParquetFile(pa.BufferReader(content) if content is not None else str(local_path(path)))
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError... for a bad footer
        raise ValueError(f"{MALFORMED} {path}: {' '.join(str(exc).split())[:200]}") from None


def partial_batches(name: str, path: str, groups: list[int] | None, content: bytes | None):
    """Aggregate `name`'s partial rows of one piece (row groups `groups` of a file, or all of
    them), as record batches: one per chunk of about CHUNK_ROWS rows, grouped by Arrow."""
    parquet = read_file(path, content)
    present = set(parquet.schema_arrow.names)
    missing = [c for c in REQUIRED_COLUMNS if c in COLUMNS[name] and c not in present]
    if missing:
        raise ValueError(f"{MALFORMED} {path}: missing columns {', '.join(missing)}")
    wanted = [c for c in COLUMNS[name] if c in present]
    absent = [c for c in COLUMNS[name] if c not in present]  # optional (v2) columns of a v1 file: null
    schema, full = arrow_schema_of(name), arrow_schema()
    for chunk in _chunks(parquet.metadata, groups if groups is not None else range(parquet.num_row_groups)):
        table = parquet.read_row_groups(chunk, columns=wanted, use_threads=False)
        for column in absent:
            table = table.append_column(column, pa.nulls(table.num_rows, full.field(column).type))
        if table.num_rows:
            yield from partial(name, table).cast(schema).to_batches()


def _chunks(metadata, groups):
    """Runs of consecutive row groups of at most CHUNK_ROWS rows (or one larger row group): a
    capture writer's row groups are small, and grouping a larger chunk at once leaves fewer
    partial rows for Spark to merge."""
    chunk, rows = [], 0
    for group in groups:
        more = metadata.row_group(group).num_rows
        if chunk and rows + more > CHUNK_ROWS:
            yield chunk
            chunk, rows = [], 0
        chunk.append(group)
        rows += more
    if chunk:
        yield chunk


def on_driver(name: str, pieces: list) -> pa.Table:
    """Aggregate `name`'s partial rows of every piece, read in this process (a small capture)."""
    batches = [batch for path, groups in pieces for batch in partial_batches(name, path, groups, None)]
    return pa.Table.from_batches(batches, schema=arrow_schema_of(name))


def _column_hash(column) -> np.ndarray:
    """A hash of each value of a key column, the same in every process: strings by the CRC-32 of
    their distinct values (a capture has few distinct ids, names and addresses), numbers and
    booleans by their value, null by a constant."""
    import zlib

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        encoded = pc.dictionary_encode(array)
        digests = np.array([zlib.crc32(value.encode()) for value in encoded.dictionary.to_pylist()] or [0],
                           np.uint64)
        hashed = digests[pc.fill_null(encoded.indices, 0).to_numpy()]
    else:
        hashed = pc.fill_null(pc.cast(array, pa.int64()), 0).to_numpy().astype(np.uint64)
    return np.where(pc.is_null(array).to_numpy(zero_copy_only=False), np.uint64(0x9E3779B97F4A7C15), hashed)


def buckets_of(table: pa.Table, keys, buckets: int) -> np.ndarray:
    """Each row's bucket in [0, buckets) by a hash of its keys: rows with equal keys share a bucket
    whichever task computed them (how partial rows meet their equals in one merge)."""
    combined = np.zeros(table.num_rows, np.uint64)
    with np.errstate(over="ignore"):
        for key in keys:
            combined = combined * np.uint64(0x100000001B3) + _column_hash(table[key])
        combined ^= combined >> np.uint64(29)
    return (combined % np.uint64(buckets)).astype(np.int32)


# a task's partial rows of one aggregate and bucket, as an Arrow IPC stream
BLOB_SCHEMA = "aggregate string, bucket int, data binary"


def ipc_bytes(table: pa.Table) -> bytes:
    """`table` as the bytes of one Arrow IPC stream (how partial and merged rows cross Spark)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table of one Arrow IPC stream (ipc_bytes' inverse)."""
    return pa.ipc.open_stream(data).read_all()


def blob_batch(names: list, buckets: list, blobs: list) -> pa.RecordBatch:
    """A record batch of BLOB_SCHEMA."""
    return pa.RecordBatch.from_pydict({"aggregate": pa.array(names, pa.string()),
                                       "bucket": pa.array(buckets, pa.int32()),
                                       "data": pa.array(blobs, pa.binary())})


def partial_blobs(name: str, path: str, groups: list[int] | None, content: bytes | None, buckets: int,
                  keys) -> pa.RecordBatch:
    """Aggregate `name`'s partial rows of one piece, split into `buckets` by a hash of `keys`: a
    record batch of (aggregate, bucket, Arrow IPC bytes of its rows), for Spark to shuffle by
    bucket as opaque bytes (the merge is then pyarrow's, not a row-by-row aggregation in the JVM)."""
    parts = list(partial_batches(name, path, groups, content))
    table = pa.Table.from_batches(parts, schema=arrow_schema_of(name)) if parts else None
    if table is None or not table.num_rows:
        return blob_batch([], [], [])
    bucket = buckets_of(table, keys, buckets)
    order = np.argsort(bucket, kind="stable")
    ordered, sorted_buckets = table.take(pa.array(order)), bucket[order]
    present = np.flatnonzero(np.diff(sorted_buckets, prepend=-1))  # where each bucket's rows start
    ends = np.append(present[1:], len(order))
    blobs = [ipc_bytes(ordered.slice(start, end - start)) for start, end in zip(present, ends)]
    return blob_batch([name] * len(blobs), sorted_buckets[present].tolist(), blobs)


