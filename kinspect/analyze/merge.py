"""How each aggregate's partial rows are merged into the aggregate (pyarrow, numpy), in Spark's tasks or on the driver.

Spark's read tasks split their partial rows into buckets by a hash of the aggregate's keys;
Spark shuffles the buckets (as opaque Arrow IPC bytes) and one task per bucket merges its
rows here (`merge_arrow`): rows with equal keys always meet in one bucket, so each bucket's
merge is final. The driver merges a small capture's partial rows the same way. The
aggregate's columns are aggregate_columns(name): the api is one string column, `api` (the
api name, or api_<key> for an api the specs do not know), made once per aggregate row.
"""

from __future__ import annotations

from kinspect.analyze.partials import EXCHANGE_KEYS, HIST

# name -> (group keys, {column: "sum" | "min" | "max"}, columns whose empty sum is 0, not null,
#          whether (api_key, api_name) become `api`, and whether api_key is kept beside it)
MERGES: dict[str, tuple[tuple[str, ...], dict[str, str], tuple[str, ...], bool, bool]] = {
    "exchanges": (EXCHANGE_KEYS,
                  {"n": "sum", "lo": "min", "hi": "max", "request_bytes": "sum", "response_bytes": "sum",
                   "responses": "sum", "request_decode_errors": "sum", "response_decode_errors": "sum",
                   "requests_not_inspected": "sum", "kip_requests": "sum", "kip_request_bytes": "sum",
                   "kip_request_compact": "sum", "kip_responses": "sum", "kip_response_bytes": "sum",
                   "kip_response_compact": "sum"},
                  ("response_bytes", "responses", "request_decode_errors", "response_decode_errors",
                   "requests_not_inspected", "kip_requests", "kip_request_bytes", "kip_request_compact",
                   "kip_responses", "kip_response_bytes", "kip_response_compact"), True, True),
    "addresses": (("software", "software_version", "address"), {}, (), False, False),
    "values": (("api_key", "api_name", "direction", "version", "v"), {"n": "sum"}, (), True, False),
    "topics": (("topic",), {"exchanges": "sum", "request_bytes": "sum", "response_bytes": "sum"}, (), False, False),
    "tags": (("location", "api_key", "api_name", "path", "tag", "name", "known"), {"count": "sum", "bytes": "sum"},
             (), True, False),
    "integers": (("api_key", "api_name", "location", "path", "type"),
                 {c: "sum" for c in ("exchanges", "count", "fixed_bytes", "packed_bytes", "upacked_bytes") + HIST},
                 (), True, False),
    "errors": (("api_key", "api_name", "code", "name"), {"count": "sum", "exchanges": "sum"}, (), True, False),
}


# name -> the keys a partial row's bucket is hashed from (partials.buckets_of): a few of its
# merge keys, so rows with equal keys still meet, and enough to spread the rows over the
# buckets; hashing fewer columns is cheaper (2.3M values partial rows: 133 -> 28 ms of CPU)
BUCKET_KEYS: dict[str, tuple[str, ...]] = {name: keys for name, (keys, *_) in MERGES.items()}
BUCKET_KEYS |= {"values": ("v",), "exchanges": ("client_id", "api_key", "version")}


def aggregate_columns(name: str) -> list[str]:
    """The columns of aggregate `name`, in order: `api` first (where there is one), then the
    other keys, then the merged values."""
    keys, values, _, named, keep_key = MERGES[name]
    if not named:
        return list(keys) + list(values)
    rest = [k for k in keys if k not in ("api_key", "api_name")]
    return ["api"] + (["api_key"] if keep_key else []) + rest + list(values)


def merge_arrow(name: str, partials, decode: bool = True):
    """Aggregate `name` from its partial rows (a pyarrow Table), grouped by their keys packed
    into one integer per row (kinspect.analyze.groups). Its strings are plain, or with
    `decode` false left as dictionaries (what a merging task hands Spark)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from kinspect.analyze.groups import Groups, decoded

    keys, values, zeros, named, _ = MERGES[name]
    groups = Groups.of([partials[k] for k in keys])
    columns = {k: groups.keys(partials[k]) for k in keys}
    # every merged value in one C call (Groups.reduce)
    merged = groups.reduce([(op, partials[column]) for column, op in values.items()]) if values else []
    for column, result in zip(values, merged):
        columns[column] = pc.fill_null(result, 0) if column in zeros else result
    if named:  # made once per distinct (api_key, api_name), a dictionary over the rows
        apis = Groups.of([columns["api_key"], columns["api_name"]])
        api_key = pc.cast(apis.keys(columns["api_key"]), pa.string())
        api = pc.coalesce(decoded(apis.keys(columns["api_name"])), pc.binary_join_element_wise("api_", api_key, ""))
        columns["api"] = pa.DictionaryArray.from_arrays(pa.array(apis.ids, pa.int32()), api)
    return pa.table({c: decoded(columns[c]) if decode else columns[c] for c in aggregate_columns(name)})


def merge_blobs(blobs):
    """A merging task: (aggregate, Arrow IPC bytes of partial rows) in, of some aggregates'
    buckets; each aggregate merged and out as (aggregate, Arrow IPC bytes of its rows in their
    narrowest types: aggregates.compute casts them back)."""
    import pyarrow as pa

    from kinspect.analyze.partials import arrow_schema_of, from_ipc, ipc_bytes, shrunk

    parts: dict[str, list] = {}
    for name, blob in blobs:
        parts.setdefault(name, []).append(blob)
    for name, tables in parts.items():
        schema = arrow_schema_of(name)  # each bucket's rows came in their own narrowest types
        partials = pa.concat_tables([from_ipc(blob).cast(schema) for blob in tables])
        yield name, ipc_bytes(shrunk(merge_arrow(name, partials, False)))
