"""The capture schema: one row per exchange, versioned, documented column by column.

This table is the single source: the writer builds its pyarrow schema from it, the
analyze job checks files against it, and the README's schema section is checked
against it by a test. Any change to a column's name, type or meaning bumps
SCHEMA_VERSION. Keys, values and headers of records are never captured.
"""

from __future__ import annotations

SCHEMA_VERSION = 3  # 3: histograms without their trailing zero counts (2 and 1: always 10 counts)
# Columns added after version 1, with the version that added them: files of older versions
# lack them, and readers take them as null (scalars) or empty (lists).
ADDED_IN = {
    "client_software_name": 2,
    "client_software_version": 2,
    "record_magics": 2,
}
# Parquet key-value metadata every capture file carries.
METADATA_VERSION_KEY = b"kinspect.capture.schema_version"

# Element types of the list columns (struct members: name, type, doc).
TAGGED_FIELD = (
    ("location", "string", "request_header, request_body, response_header or response_body"),
    ("path", "string", "struct path of the tag section, '' for the top level"),
    ("tag", "int32", "the tag number"),
    ("name", "string?", "the field's name when the spec knows the tag, null otherwise"),
    ("size", "int32", "bytes of the field's data"),
    ("known", "bool", "whether the spec knows the tag"),
)
ERROR_CODE = (
    ("code", "int16", "a non-zero error code in the response (nested ones too)"),
    ("name", "string", "its Kafka name, e.g. NOT_LEADER_OR_FOLLOWER"),
    ("count", "int32", "how many times it appears in the response"),
)
TOPIC_PARTITIONS = (
    ("topic", "string", "a topic name the request or response names"),
    ("partitions", "int32", "how many partitions of it the message names"),
)
COMPRESSION = (
    ("codec", "string", "none, gzip, snappy, lz4 or zstd"),
    ("batches", "int32", "record batches with this codec"),
    ("records", "int64", "records in them"),
    ("bytes", "int64", "bytes of those batches"),
)
INTEGER_FIELD = (
    ("location", "string", "request or response (headers excluded)"),
    ("path", "string", "dotted field path, e.g. Topics.Partitions.PartitionIndex"),
    ("type", "string", "int16, int32 or int64"),
    ("count", "int32", "values of this field in the message"),
    ("fixed_bytes", "int64", "bytes the values take today (2, 4 or 8 each, or their KAFKA-9927 encoding's)"),
    ("uvarint_bytes", "int64", "bytes as unsigned varints (negatives as the type's two's complement)"),
    ("zigzag_bytes", "int64", "bytes as zig-zag signed varints"),
    ("uvarint_hist", "list<int32>", "counts of values whose unsigned varint takes 1, 2, ... bytes, up to the last "
     "non-zero count (at most 10; schema versions 1 and 2: always 10)"),
    ("zigzag_hist", "list<int32>", "the same for zig-zag varints"),
)

STRUCTS = {
    "tagged_field": TAGGED_FIELD,
    "error_code": ERROR_CODE,
    "topic_partitions": TOPIC_PARTITIONS,
    "compression": COMPRESSION,
    "integer_field": INTEGER_FIELD,
}

# Columns: name, type ("?" suffix = nullable), doc. Sizes are bytes; a frame size
# excludes the 4-byte length prefix, as Kafka's own request metrics do.
COLUMNS = (
    ("schema_version", "int16", "SCHEMA_VERSION of the writer"),
    ("request_time", "timestamp_us", "UTC time of the socket read that completed the request (microseconds; packet time for pcap)"),
    ("response_time", "timestamp_us?", "the same for the response; null for acks=0 produces"),
    ("latency_us", "int64?", "response_time - request_time, monotonic: frames completed by one read share its time"),
    ("connection_id", "int64", "kinspect's id of the client connection, unique within one proxy run"),
    ("client_address", "string", "client host:port"),
    ("client_id", "string?", "the request header's client id"),
    ("broker", "string", "the broker host:port kinspect forwarded to"),
    ("node_id", "int32?", "the broker's node id (rewrite mode)"),
    ("api_key", "int16", "the request's api key"),
    ("api_name", "string?", "its name; null for an api the specs do not know"),
    ("request_version", "int16", "the request's api version"),
    ("response_version", "int16?", "the version the response body was read at (0 for KIP-511's fallback)"),
    ("request_header_version", "int8", "0, 1 or 2"),
    ("response_header_version", "int8?", "0 or 1"),
    ("flexible", "bool", "whether the request version is flexible (KIP-482)"),
    ("correlation_id", "int32", "the request header's correlation id"),
    ("request_size", "int32", "request frame bytes"),
    ("response_size", "int32?", "response frame bytes"),
    ("request_header_size", "int32", "request header bytes"),
    ("response_header_size", "int32?", "response header bytes"),
    ("request_inspected", "bool", "whether the whole request was inspected (false: larger than inspect_max_bytes)"),
    ("response_inspected", "bool?", "the same for the response"),
    ("request_decode_error", "string?", "why the request body could not be decoded, if it could not"),
    ("response_decode_error", "string?", "the same for the response"),
    ("request_tag_section_bytes", "int32", "bytes of all tag sections in the request, header included"),
    ("response_tag_section_bytes", "int32?", "the same for the response"),
    ("tagged_fields", "list<tagged_field>", "every non-empty tagged field, in both directions"),
    ("error_codes", "list<error_code>", "non-zero error codes in the response"),
    ("topic_partitions", "list<topic_partitions>", "topics named, with their partition counts"),
    ("record_batches", "int32", "record batches carried (Produce requests, Fetch responses...)"),
    ("record_count", "int64", "records in them"),
    ("compression", "list<compression>", "batches, records and bytes per compression codec"),
    ("integer_fields", "list<integer_field>", "per integer field path: bytes today, as unsigned and as zig-zag varints"),
    ("first_flexible_version", "int16?", "the api's first flexible version; null if it has none"),
    ("request_compact_size", "int32?", "non-flexible requests: the frame's bytes at the first flexible version's encoding, same fields"),
    ("response_compact_size", "int32?", "the same for the response"),
    ("client_software_name", "string?", "the client's KIP-511 software name (ApiVersions v3+) when the request was seen, "
     "sanitized; null before it"),
    ("client_software_version", "string?", "its software version, the same way"),
    ("record_magics", "list<int8>", "distinct magic values of the request's record batches (Produce), ascending; "
     "empty when none"),
)

COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
# Columns whose row groups carry min/max statistics: the top-level ones a reader filters on (times, apis,
# sizes). Nobody filters on the leaves inside the list columns, and their statistics were 7-10% of the
# Parquet write (about 0.3-0.6 µs a row of the recorded traffic, docs/performance.md).
STATISTICS_COLUMNS = tuple(name for name, kind, _ in COLUMNS if not kind.startswith("list<"))


def parquet_options(compression: str | None) -> dict:
    """The keyword arguments of every capture file's pyarrow ParquetWriter."""
    return {"compression": compression or "none", "write_statistics": list(STATISTICS_COLUMNS)}


def column_names(version: int = SCHEMA_VERSION) -> tuple[str, ...]:
    """The columns a file of this schema version has."""
    return tuple(name for name in COLUMN_NAMES if ADDED_IN.get(name, 1) <= version)

_ARROW_SCALARS = {
    "bool": "bool_", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "string": "string",
}


def _arrow_type(pa, kind: str):
    kind = kind.rstrip("?")
    if kind == "timestamp_us":
        return pa.timestamp("us", tz="UTC")
    if kind.startswith("list<"):
        inner = kind[5:-1]
        if inner in STRUCTS:
            return pa.list_(_arrow_struct(pa, STRUCTS[inner]))
        return pa.list_(_arrow_type(pa, inner))
    return getattr(pa, _ARROW_SCALARS[kind])()


def _arrow_struct(pa, members):
    return pa.struct([pa.field(n, _arrow_type(pa, t), nullable=t.endswith("?")) for n, t, _ in members])


def arrow_schema():
    """The pyarrow schema of a capture file (pyarrow is imported only here)."""
    import pyarrow as pa

    fields = [pa.field(n, _arrow_type(pa, t), nullable=t.endswith("?") or t.startswith("list<")) for n, t, _ in COLUMNS]
    return pa.schema(fields, metadata={METADATA_VERSION_KEY: str(SCHEMA_VERSION).encode()})
