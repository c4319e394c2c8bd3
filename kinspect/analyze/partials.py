"""Partial aggregates of one piece of capture rows, computed with Arrow's and numpy's compiled kernels.

Every aggregate of kinspect.analyze.aggregates is computed in two steps: here, a Spark task
reads its piece of the capture files with pyarrow (only the columns the aggregate needs,
strings as dictionaries), groups it by its keys packed into one integer per row
(kinspect.analyze.groups) and splits the partial rows into buckets by a hash of their keys
(`piece_blobs`); Spark shuffles the buckets as Arrow IPC bytes and another task merges
each (kinspect.analyze.merge). The driver does both for a small capture. No Python runs
per row: list columns are flattened and grouped as whole arrays, never looped over.

Each aggregate's function takes a pyarrow Table holding (at least) COLUMNS[name] and returns
a Table of PARTIAL_SCHEMAS[name]: the aggregate's keys and its mergeable partial values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kinspect.analyze.groups import Groups, codes, decoded, distinct_counts, list_sums, pack, whole
from kinspect.analyze.inputs import MALFORMED, REQUIRED_COLUMNS, row_runs
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

# the columns more than one aggregate reads: read once a chunk (partial_batches)
SHARED_COLUMNS = frozenset(c for c in {c for cols in COLUMNS.values() for c in cols}
                           if sum(c in cols for cols in COLUMNS.values()) > 1)

_I32, _I64 = pa.int32(), pa.int64()
CHUNK_ROWS = 500_000  # rows grouped at once by a task (scan.PIECE_ROWS: a local piece is one chunk)


def _inline(table: pa.Table, column: str) -> tuple["_Fields", np.ndarray]:
    """The elements of a list<struct> column, and the row each came from (Spark's inline())."""
    lists = table[column]  # chunked (a chunk per row group): flattened per chunk, no copy of the whole
    return _Fields(pc.list_flatten(lists)), pc.list_parent_indices(lists).to_numpy().astype(np.int64)


class _Fields:
    """The members of a (chunked) struct array, by name."""

    def __init__(self, elements):
        self.elements = elements

    def field(self, name: str):
        return pc.struct_field(self.elements, name)


def _api_code(table: pa.Table) -> np.ndarray:
    """Each row's (api_key, api_name) as one integer: a key column of the flattened aggregates,
    taken per element without touching the names again."""
    return pack([table["api_key"], table["api_name"]])


def _api(table: pa.Table, rows) -> dict[str, pa.Array]:
    """api_key and api_name of the capture rows `rows` (each group's first)."""
    at = pa.array(rows)
    return {"api_key": pc.cast(whole(table["api_key"]).take(at), _I32), "api_name": whole(table["api_name"]).take(at)}


def _magic_mask(table: pa.Table) -> pa.Array:
    """The record-batch magic values seen (0, 1, 2) as a bit mask (bit m: magic m), 0 for none."""
    mask = np.zeros(table.num_rows, np.int64)
    lists = whole(table["record_magics"])
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
    response_version = pc.coalesce(table["response_version"], table["request_version"])
    magic_mask = _magic_mask(table)
    keys = [(table["client_software_name"], "unknown"), table["client_software_version"], table["client_id"],
            table["api_key"], table["api_name"], table["request_version"], response_version, magic_mask,
            table["first_flexible_version"], table["flexible"], table["schema_version"]]
    groups = Groups.of(keys)
    first = groups.keys
    t_us = pc.cast(table["request_time"], pa.timestamp("us", "UTC"))
    # every sum and count in one C call (Groups.reduce)
    reduced = dict(zip(("lo", "hi") + EXCHANGE_SUMS[1:], groups.reduce([
        ("min", t_us), ("max", t_us), ("sum", request_size), ("sum", response_size), ("count", has_response),
        ("count", pc.is_valid(table["request_decode_error"])), ("count", pc.is_valid(table["response_decode_error"])),
        ("count", pc.invert(table["request_inspected"])), ("count", kip_request),
        ("sum", request_size, kip_request), ("sum", table["request_compact_size"], kip_request),
        ("count", kip_response), ("sum", response_size, kip_response),
        ("sum", table["response_compact_size"], kip_response)])))
    return pa.table({
        "software": pc.fill_null(decoded(first(table["client_software_name"])), "unknown"),
        "software_version": first(table["client_software_version"]), "client_id": first(table["client_id"]),
        "api_key": first(table["api_key"]), "api_name": first(table["api_name"]),
        "version": first(table["request_version"]), "response_version": first(response_version),
        "magic_mask": first(magic_mask), "first_flexible_version": first(table["first_flexible_version"]),
        "flexible": first(table["flexible"]), "schema_version": first(table["schema_version"]),
        "n": groups.size(), **reduced})


def addresses(table: pa.Table) -> pa.Table:
    software = table["client_software_name"]
    groups = Groups.of([(software, "unknown"), table["client_software_version"], table["client_address"]])
    return pa.table({"software": pc.fill_null(decoded(groups.keys(software)), "unknown"),
                     "software_version": groups.keys(table["client_software_version"]),
                     "address": groups.keys(table["client_address"])})


def values(table: pa.Table) -> pa.Table:
    """Every request size, response size and latency, counted per distinct value: the three
    sides' (api, direction, version, value) packed into one int64 each, counted by a sort, and
    unpacked (a value range too wide to pack is grouped the general way)."""
    api = Groups.of([table["api_key"], table["api_name"]])
    request_version = whole(table["request_version"])
    sides = ((REQUEST, request_version, whole(table["request_size"])),
             (RESPONSE, whole(pc.coalesce(table["response_version"], table["request_version"])),
              whole(table["response_size"])),
             (LATENCY, None, whole(table["latency_us"])))
    # only the request side keeps a null value (as today: a request always has a size)
    kept = [None if direction == REQUEST else pc.is_valid(value).to_numpy(zero_copy_only=False)
            for direction, _, value in sides]
    version_low, version_span = _range([version for _, version, _ in sides if version is not None])
    value_low, value_span = _range([value for _, _, value in sides])
    if api.number * 3 * version_span * value_span >= 1 << 62:
        return _values_wide(table, api, sides, kept)
    keys = []
    for (direction, version, value), keep in zip(sides, kept):
        key = api.ids * 3 + direction
        key = key * version_span + (_offsets(version, version_low) if version is not None else 0)
        key = key * value_span + _offsets(value, value_low)
        keys.append(key if keep is None else key[keep])
    # counted by a sort, not a hash: numpy sorts int64 with SIMD, and most keys of a piece are
    # distinct (a 476k-row piece: 1.4M keys, 483k distinct; Arrow's hash grouping 120 ms, this 29)
    key, count = distinct_counts(np.concatenate(keys))
    key, value = np.divmod(key, value_span)
    key, version = np.divmod(key, version_span)
    api_id, direction = np.divmod(key, 3)
    return pa.table({**_api(table, api.first[api_id]), "direction": pa.array(direction.astype(np.int8)),
                     "version": pa.array(version + (version_low - 1), _I32, mask=version == 0),
                     "v": pa.array(value + (value_low - 1), _I64, mask=value == 0),
                     "n": pa.array(count.astype(np.int64))})


def _range(arrays) -> tuple[int, int]:
    """The lowest value of some integer arrays, and the span of their codes (`_offsets`)."""
    lows, highs = zip(*((s.as_py() for s in pc.min_max(a).values()) for a in arrays))
    lows, highs = [v for v in lows if v is not None], [v for v in highs if v is not None]
    if not lows:
        return 0, 1
    return min(lows), max(highs) - min(lows) + 2


def _offsets(array, low: int) -> np.ndarray:
    """Each value's offset from `low`, plus one; null 0."""
    return pc.fill_null(pc.cast(array, _I64), low - 1).to_numpy() - (low - 1)


def _values_wide(table: pa.Table, api: Groups, sides, kept) -> pa.Table:
    """`values` for values too far apart to pack: the sides concatenated and grouped by Groups."""
    parts = []
    for (direction, version, value), keep in zip(sides, kept):
        rows = np.arange(table.num_rows) if keep is None else np.flatnonzero(keep)
        at = pa.array(rows)
        parts.append(pa.table({"api": api.ids[rows], "direction": pa.array(np.full(len(rows), direction, np.int8)),
                               "version": (pc.cast(version, _I32).take(at) if version is not None
                                           else pa.nulls(len(rows), _I32)),
                               "v": pc.cast(value, _I64).take(at)}))
    rows = pa.concat_tables(parts)
    groups = Groups.of([rows["api"], rows["direction"], rows["version"], rows["v"]])
    return pa.table({**_api(table, api.first[groups.keys(rows["api"]).to_numpy()]),
                     "direction": groups.keys(rows["direction"]), "version": groups.keys(rows["version"]),
                     "v": groups.keys(rows["v"]), "n": groups.size()})


def topics(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "topic_partitions")
    topic = whole(elements.field("topic"))
    code, span = codes(topic)
    # A topic named twice in one exchange (request and response, say) counts once: the
    # elements' distinct (row, topic), by a sort of one int64 each (a row below 2^31 times a
    # code below 2^31). The rows ascend already, so the stable sort (a timsort) only has
    # each row's few elements to order: much cheaper than hashing keys nearly all distinct.
    key = rows * span + code
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    first = np.ones(len(order), bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    named = order[first]  # an element of each distinct (row, topic)
    per_topic = Groups(code[named])
    at = pa.array(rows[named])
    request_bytes, response_bytes = per_topic.reduce([
        ("sum", whole(table["request_size"]).take(at)), ("sum", pc.fill_null(whole(table["response_size"]).take(at), 0))])
    return pa.table({"topic": per_topic.keys(topic.take(pa.array(named))), "exchanges": per_topic.size(),
                     "request_bytes": request_bytes, "response_bytes": response_bytes})


def tags(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "tagged_fields")
    fields = {name: whole(elements.field(name)) for name in ("location", "path", "tag", "name", "known")}
    groups = Groups.of([_api_code(table)[rows], *fields.values()])
    return pa.table({**_api(table, rows[groups.first]), **{name: groups.keys(f) for name, f in fields.items()},
                     "count": groups.size(), "bytes": groups.sum(elements.field("size"))})


def _hist_sums(groups: Groups, hists, prefix: str) -> dict[str, pa.Array]:
    """Each group's sums of element i of the histogram lists, as column prefix<i+1>: a count
    past a list's end is 0 (schema version 3 leaves trailing zero counts out; versions 1
    and 2 always wrote 10)."""
    hists = whole(hists)
    if hists.null_count or hists.values.null_count:  # never written: nulls count as empty lists, 0
        lengths = pc.fill_null(pc.list_value_length(hists), 0).to_numpy().astype(np.int64)
        counts = pc.fill_null(pc.list_flatten(hists), 0).to_numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
    else:  # the lists' own offsets and values, without building lengths and a flattened copy
        offsets, counts = hists.offsets.to_numpy(), hists.values.to_numpy()
    # no list of more than 10 is written; past 10 is left out
    sums = list_sums(groups.ids, groups.number, offsets, counts, 10)
    return {f"{prefix}{i + 1}": pa.array(np.ascontiguousarray(sums[:, i])) for i in range(10)}


def integers(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "integer_fields")
    fields = {name: whole(elements.field(name)) for name in ("location", "path", "type")}
    groups = Groups.of([_api_code(table)[rows], *fields.values()])
    return pa.table({**_api(table, rows[groups.first]), **{name: groups.keys(f) for name, f in fields.items()},
                     "exchanges": groups.size(),
                     **dict(zip(("count", "fixed_bytes", "packed_bytes", "upacked_bytes"), groups.reduce(
                         [("sum", elements.field(name)) for name in ("count", "fixed_bytes", "zigzag_bytes",
                                                                     "uvarint_bytes")]))),
                     **_hist_sums(groups, elements.field("uvarint_hist"), "u"),
                     **_hist_sums(groups, elements.field("zigzag_hist"), "z")})


def errors(table: pa.Table) -> pa.Table:
    elements, rows = _inline(table, "error_codes")
    code, name = whole(elements.field("code")), whole(elements.field("name"))
    groups = Groups.of([_api_code(table)[rows], code, name])
    return pa.table({**_api(table, rows[groups.first]), "code": groups.keys(code), "name": groups.keys(name),
                     "count": groups.sum(elements.field("count")), "exchanges": groups.size()})


PARTIALS = {"exchanges": exchanges, "addresses": addresses, "values": values, "topics": topics,
            "tags": tags, "integers": integers, "errors": errors}


def column_names(name: str) -> list[str]:
    """The column names of PARTIAL_SCHEMAS[name], in order."""
    return [part.strip().split(" ")[0] for part in PARTIAL_SCHEMAS[name].split(",")]


def partial(name: str, table: pa.Table) -> pa.Table:
    """The partial aggregate `name` of these capture rows, its columns in PARTIAL_SCHEMAS order."""
    return PARTIALS[name](table).select(column_names(name))


# strings as dictionaries: a capture's few distinct names, ids and addresses, whose indices
# the merge groups by (kinspect.analyze.groups) without hashing the strings
_ARROW_TYPES = {"string": pa.dictionary(_I32, pa.string()), "int": _I32, "bigint": _I64, "tinyint": pa.int8(),
                "boolean": pa.bool_()}


def arrow_schema_of(name: str) -> pa.Schema:
    """PARTIAL_SCHEMAS[name] as an Arrow schema, strings as dictionaries: the partial rows' types."""
    return pa.schema([(column, _ARROW_TYPES[kind]) for column, kind in
                      (part.strip().split(" ") for part in PARTIAL_SCHEMAS[name].split(","))])


def read_file(path: str, content: bytes | None):
    """A capture file as a pyarrow ParquetFile: from Spark's bytes, or from its file: URI. Its
    string columns (nested ones too) are read as dictionaries: Parquet stores them
    dictionary-encoded, so the read hands over each page's indices instead of building every
    string, and the grouping takes the indices as codes instead of hashing the strings."""
    import pyarrow.parquet as pq

    from kinspect.analyze.inputs import local_path

    def source():
        return pa.BufferReader(content) if content is not None else str(local_path(path))

    try:
        plain = pq.ParquetFile(source())
        strings = [column.path for column in (plain.schema.column(i) for i in range(len(plain.schema)))
                   if column.logical_type.type == "STRING" or column.converted_type == "UTF8"]
        return pq.ParquetFile(source(), read_dictionary=strings, metadata=plain.metadata)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError... for a bad footer
        raise ValueError(f"{MALFORMED} {path}: {' '.join(str(exc).split())[:200]}") from None


def partial_batches(names, parquet, path: str, groups: list[int] | None):
    """The partial rows of aggregates `names` of one piece (row groups `groups` of the ParquetFile
    `parquet` read from `path`, or all of them), as (aggregate, record batch) pairs: for each
    chunk of about CHUNK_ROWS rows, each aggregate's rows grouped at once, in turn. A column
    that several aggregates read (SHARED_COLUMNS) is read once a chunk, kept until its last
    aggregate is done with it; every other column only for its aggregate."""
    present = set(parquet.schema_arrow.names)
    for name in names:
        missing = [c for c in REQUIRED_COLUMNS if c in COLUMNS[name] and c not in present]
        if missing:
            raise ValueError(f"{MALFORMED} {path}: missing columns {', '.join(missing)}")
    for chunk in _chunks(parquet.metadata, groups if groups is not None else range(parquet.num_row_groups)):
        kept: dict[str, pa.ChunkedArray] = {}
        for index, name in enumerate(names):
            table = _chunk_columns(parquet, chunk, name, present, kept)
            if table.num_rows:
                for batch in partial(name, table).cast(arrow_schema_of(name)).to_batches():
                    yield name, batch
            later = {c for other in names[index + 1:] for c in COLUMNS[other]}
            for column in [c for c in kept if c not in later]:  # no aggregate after this one reads it
                del kept[column]


def _chunk_columns(parquet, chunk: list[int], name: str, present: set, kept: dict) -> pa.Table:
    """Aggregate `name`'s columns of the row groups `chunk`: those in `kept` as they are, the rest
    read (and kept if shared), optional (v2) columns a v1 file lacks as nulls."""
    wanted = [c for c in COLUMNS[name] if c in present and c not in kept]
    # one row group at a time: each may have its own dictionaries, which Arrow cannot
    # read into one nested column at once (the string fields of a list<struct>)
    if wanted:
        read = pa.concat_tables([parquet.read_row_group(group, columns=wanted, use_threads=False)
                                 for group in chunk])
        rows = read.num_rows
    else:  # every column already read (an aggregate whose columns all are shared)
        rows = len(next(kept[c] for c in COLUMNS[name] if c in kept))
    columns = {}
    for column in COLUMNS[name]:
        if column in kept:
            columns[column] = kept[column]
        elif column in present:
            columns[column] = read[column]
            if column in SHARED_COLUMNS:
                kept[column] = read[column]
        else:
            columns[column] = pa.nulls(rows, arrow_schema().field(column).type)
    return pa.table(columns)


def _chunks(metadata, groups):
    """Runs of consecutive row groups of about CHUNK_ROWS rows (inputs.row_runs: a piece the
    driver planned is one chunk): a capture writer's row groups are small, and grouping a
    larger chunk at once leaves fewer partial rows for Spark to merge."""
    groups = list(groups)
    for run in row_runs([metadata.row_group(group).num_rows for group in groups], CHUNK_ROWS):
        yield [groups[i] for i in run]


def on_driver(pieces: list) -> dict[str, pa.Table]:
    """Every aggregate's partial rows of every piece, read in this process (a small capture)."""
    batches: dict[str, list] = {name: [] for name in COLUMNS}
    for path, groups in pieces:
        for name, batch in partial_batches(list(COLUMNS), read_file(path, None), path, groups):
            batches[name].append(batch)
    return {name: pa.Table.from_batches(rows, schema=arrow_schema_of(name)) for name, rows in batches.items()}


def _column_hash(column) -> np.ndarray:
    """A hash of each value of a key column, the same in every process: strings (plain or a
    dictionary) by the CRC-32 of their distinct values (a capture has few distinct ids, names
    and addresses; a value twice in a dictionary gets the same CRC both times), numbers and
    booleans by their value, null by a constant."""
    import zlib

    array = whole(column)
    if pa.types.is_dictionary(array.type) or pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        encoded = array if pa.types.is_dictionary(array.type) else pc.dictionary_encode(array)
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


def ipc_bytes(table: pa.Table) -> bytes:
    """`table` as the bytes of one Arrow IPC stream (how partial and merged rows cross Spark)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table of one Arrow IPC stream (ipc_bytes' inverse)."""
    return pa.ipc.open_stream(data).read_all()


_INTEGERS = tuple((kind, -(1 << (kind.bit_width - 1)), (1 << (kind.bit_width - 1)) - 1)
                  for kind in (pa.int8(), pa.int16(), pa.int32()))


def _narrowest(array) -> pa.Array:
    """`array` in the fewest bytes that hold its values: integers in the narrowest type of their
    range, a dictionary's indices in the narrowest type of its length."""
    array = whole(array)
    if pa.types.is_dictionary(array.type):
        indices = _narrowest(pa.array([0, len(array.dictionary) - 1], array.type.index_type))
        return pa.DictionaryArray.from_arrays(array.indices.cast(indices.type), array.dictionary)
    if not pa.types.is_integer(array.type):
        return array
    low, high = (value.as_py() for value in pc.min_max(array).values())
    for kind, smallest, largest in _INTEGERS:
        if kind.bit_width < array.type.bit_width and (low is None or (smallest <= low and high <= largest)):
            return array.cast(kind)
    return array


def shrunk(table: pa.Table) -> pa.Table:
    """Partial rows in the fewest bytes, for the shuffle (arrow_schema_of's types widen them
    back): most sums and counts fit in a byte or two, and Spark's JVM copies, compresses and
    moves every byte several times (the 5M capture's partial rows: 400 -> 131 MB). A table
    of a few rows stays as it is: a cast per column would cost more than its bytes."""
    if table.num_rows < 1000:
        return table
    return pa.table({column: _narrowest(table[column]) for column in table.column_names})


def piece_blobs(parquet, path: str, groups: list[int] | None, buckets: dict[str, list[int]],
                keys: dict[str, tuple]):
    """The partial rows of one piece (as partial_batches takes it) of each aggregate of `buckets`,
    split into len(buckets[name]) buckets by a hash of its `keys[name]`: (bucket's partition,
    (aggregate, Arrow IPC bytes of its rows)) for each bucket with rows, for Spark to shuffle as
    opaque bytes (the merge is then pyarrow's and numpy's, not a row-by-row aggregation in the JVM)."""
    names = list(buckets)
    parts: dict[str, list] = {name: [] for name in names}
    for name, batch in partial_batches(names, parquet, path, groups):
        parts[name].append(batch)
    for name in names:
        table = pa.Table.from_batches(parts.pop(name), schema=arrow_schema_of(name))
        for partition, blob in _split(table, buckets[name], keys[name]):
            yield partition, (name, blob)


def _split(table: pa.Table, partitions: list[int], keys) -> list[tuple[int, bytes]]:
    """Partial rows in len(partitions) buckets by a hash of `keys`, as (partition, IPC bytes)."""
    if not table.num_rows:
        return []
    # shrunk once for every bucket (a bucket's own narrowest types saved few bytes, and
    # shrinking each of six buckets took 30 ms of the 166 ms of a 524k-row exchanges piece)
    table = shrunk(table)
    if len(partitions) == 1:
        return [(partitions[0], ipc_bytes(table))]
    bucket = buckets_of(table, keys, len(partitions))
    # a stable sort of small integers is a radix sort in numpy (int32 buckets: a timsort, 12x slower)
    order = np.argsort(bucket.astype(np.uint8) if len(partitions) <= 256 else bucket, kind="stable")
    ordered, sorted_buckets = table.take(pa.array(order)), bucket[order]
    present = np.flatnonzero(np.diff(sorted_buckets, prepend=-1))  # where each bucket's rows start
    ends = np.append(present[1:], len(order))
    return [(partitions[b], ipc_bytes(ordered.slice(start, end - start)))
            for b, start, end in zip(sorted_buckets[present].tolist(), present, ends)]
