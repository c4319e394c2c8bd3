"""Generated capture files for the analyze job's tests, with the client software and record magic columns of schema v2.

The rows are random but coherent: varint sizes and histograms are computed from real
integer values, compact sizes exist only for non-flexible versions of apis that have a
flexible one, acks=0 produces have no response, one api is unknown to the specs. The same
seed gives the same files.

    python -m kinspect.analyze.sample_data OUT_DIR ROWS [--files N] [--seed S]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
from pathlib import Path

from kinspect.capture.schema import SCHEMA_VERSION, arrow_schema
from kinspect.protocol.wire.primitives import uvarint_size, zigzag_encode

# api key, name (None: unknown to the specs), versions, first flexible version
APIS = (
    (0, "Produce", range(3, 12), 9),
    (1, "Fetch", range(0, 17), 12),  # Fetch v0-v3: removed in 4.0 (KIP-896)
    (3, "Metadata", range(1, 13), 9),
    (18, "ApiVersions", range(0, 4), 3),
    (10, "FindCoordinator", range(0, 5), 3),
    (12, "Heartbeat", range(0, 5), 4),
    (8, "OffsetCommit", range(2, 9), 8),
    (9999, None, range(0, 2), None),
)
WEIGHTS = (30, 30, 8, 4, 3, 10, 6, 1)
TOPICS = tuple(f"topic-{i}" for i in range(9))
CLIENTS = ("orders-service", "billing", "rdkafka", "console-consumer", "payments", None)
BROKERS = (("10.0.0.1:9092", 1), ("10.0.0.2:9092", 2), ("10.0.0.3:9092", 3))
ERRORS = ((6, "NOT_LEADER_OR_FOLLOWER"), (3, "UNKNOWN_TOPIC_OR_PARTITION"), (36, "TOPIC_ALREADY_EXISTS"),
          (-1, "UNKNOWN_SERVER_ERROR"), (27, "REBALANCE_IN_PROGRESS"))
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# integer field paths per api (location, path, type, bits)
INTEGER_PATHS = {
    0: (("request", "TopicData.PartitionData.Index", "int32", 32), ("request", "TimeoutMs", "int32", 32),
        ("response", "Responses.PartitionResponses.BaseOffset", "int64", 64),
        ("response", "Responses.PartitionResponses.ErrorCode", "int16", 16)),
    1: (("request", "Topics.Partitions.FetchOffset", "int64", 64), ("request", "MaxWaitMs", "int32", 32),
        ("response", "Responses.Partitions.HighWatermark", "int64", 64)),
    12: (("request", "GenerationId", "int32", 32),),
    8: (("request", "Topics.Partitions.CommittedOffset", "int64", 64),),
}
KNOWN_TAGS = (("request_header", "", 3, "ClientTag"), ("response_body", "", 0, "ThrottleHint"),
              ("response_body", "Topics", 1, "TopicHint"))
SOFTWARE = (("apache-kafka-java", "3.9.0"), ("apache-kafka-java", "4.1.0"), ("librdkafka", "2.16.1"),
            ("kafka-python", None), (None, None))
MAGICS = ([2], [2], [2], [1], [0, 2], [0])
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _integer_field(rnd: random.Random, location: str, path: str, kind: str, bits: int) -> dict:
    values = [_value(rnd, bits) for _ in range(rnd.randint(1, 6))]
    uhist, zhist = [0] * 10, [0] * 10
    ubytes = zbytes = 0
    for v in values:
        u = uvarint_size(v & ((1 << bits) - 1))
        z = uvarint_size(zigzag_encode(v, bits))
        uhist[u - 1] += 1
        zhist[z - 1] += 1
        ubytes += u
        zbytes += z
    return {"location": location, "path": path, "type": kind, "count": len(values),
            "fixed_bytes": len(values) * bits // 8, "uvarint_bytes": ubytes, "zigzag_bytes": zbytes,
            "uvarint_hist": trimmed(uhist), "zigzag_hist": trimmed(zhist)}


def trimmed(counts: list[int]) -> list[int]:
    """A histogram as schema version 3 writes it: without its trailing zero counts."""
    end = len(counts)
    while end and counts[end - 1] == 0:
        end -= 1
    return counts[:end]


def _value(rnd: random.Random, bits: int) -> int:
    pick = rnd.random()
    if pick < 0.5:
        return rnd.randint(0, 100)
    if pick < 0.6:
        return -1
    if pick < 0.9:
        return rnd.randint(0, 1 << min(bits - 1, 40))
    return rnd.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def exchange(rnd: random.Random, i: int) -> dict:
    """One random exchange row, as a dict of capture columns."""
    api_key, api_name, versions, first_flexible = rnd.choices(APIS, WEIGHTS)[0]
    version = rnd.choice(versions)
    flexible = first_flexible is not None and version >= first_flexible
    acks0 = api_key == 0 and rnd.random() < 0.1
    request_time = EPOCH + dt.timedelta(microseconds=i * 1500 + rnd.randint(0, 999))
    latency = None if acks0 else int(rnd.lognormvariate(7.5, 1.2))
    request_size = int(rnd.lognormvariate(5, 1.5)) + 30
    response_size = None if acks0 else int(rnd.lognormvariate(6, 2)) + 12
    response_version = None if acks0 else (0 if api_key == 18 and rnd.random() < 0.05 else version)
    broker, node = rnd.choice(BROKERS)
    tagged = []
    if flexible:
        for location, path, tag, name in KNOWN_TAGS:
            if rnd.random() < 0.3 and not (acks0 and location.startswith("response")):
                tagged.append({"location": location, "path": path, "tag": tag, "name": name,
                               "size": rnd.randint(1, 40), "known": True})
        if rnd.random() < 0.05:
            tagged.append({"location": "request_body", "path": "", "tag": 1000 + rnd.randint(0, 2),
                           "name": None, "size": rnd.randint(0, 9), "known": False})
    errors = []
    if not acks0 and rnd.random() < 0.15:
        for code, name in rnd.sample(ERRORS, rnd.randint(1, 2)):
            errors.append({"code": code, "name": name, "count": rnd.randint(1, 4)})
    topics = []
    if api_key in (0, 1, 3) and rnd.random() < 0.9:
        for t in rnd.sample(TOPICS, rnd.randint(1, 3)):
            topics.append({"topic": t, "partitions": rnd.randint(0, 6)})
        if rnd.random() < 0.1:  # the same topic named twice in one exchange
            topics.append(dict(topics[0]))
    batches = records = 0
    compression = []
    if api_key in (0, 1) and rnd.random() < 0.8:
        codec = rnd.choice(CODECS)
        batches = rnd.randint(1, 5)
        records = batches * rnd.randint(1, 200)
        compression.append({"codec": codec, "batches": batches, "records": records,
                            "bytes": request_size if api_key == 0 else (response_size or 0)})
    integer_fields = [_integer_field(rnd, *spec) for spec in INTEGER_PATHS.get(api_key, ())
                      if not (acks0 and spec[0] == "response") and rnd.random() < 0.9]
    compact_ok = first_flexible is not None and not flexible
    software, software_version = rnd.choice(SOFTWARE)
    inspected = rnd.random() > 0.02
    return {
        "schema_version": SCHEMA_VERSION,
        "request_time": request_time,
        "response_time": None if acks0 else request_time + dt.timedelta(microseconds=latency),
        "latency_us": latency,
        "connection_id": rnd.randint(1, 40),
        "client_address": f"10.1.0.{rnd.randint(1, 9)}:{rnd.randint(30000, 60000)}",
        "client_id": rnd.choice(CLIENTS),
        "broker": broker,
        "node_id": node if rnd.random() < 0.7 else None,
        "api_key": api_key,
        "api_name": api_name,
        "request_version": version,
        "response_version": response_version,
        "request_header_version": 2 if flexible else 1,
        "response_header_version": None if acks0 else (1 if flexible and api_key != 18 else 0),
        "flexible": flexible,
        "correlation_id": i & 0x7FFFFFFF,
        "request_size": request_size,
        "response_size": response_size,
        "request_header_size": 10 + rnd.randint(0, 20),
        "response_header_size": None if acks0 else (5 if flexible else 4),
        "request_inspected": inspected,
        "response_inspected": None if acks0 else rnd.random() > 0.02,
        "request_decode_error": None if rnd.random() > 0.01 else "truncated at Topics",
        "response_decode_error": None,
        "request_tag_section_bytes": sum(t["size"] for t in tagged if t["location"].startswith("request")),
        "response_tag_section_bytes": None if acks0 else sum(t["size"] for t in tagged
                                                             if t["location"].startswith("response")),
        "tagged_fields": tagged,
        "error_codes": errors,
        "topic_partitions": topics,
        "record_batches": batches,
        "record_count": records,
        "compression": compression,
        "integer_fields": integer_fields,
        "first_flexible_version": first_flexible,
        "request_compact_size": (request_size - rnd.randint(0, request_size // 4 + 1))
        if compact_ok and inspected else None,
        "response_compact_size": (response_size - rnd.randint(0, response_size // 5 + 1))
        if compact_ok and response_size is not None and rnd.random() > 0.02 else None,
        "client_software_name": software,
        "client_software_version": software_version,
        "record_magics": rnd.choice(MAGICS) if api_key == 0 and batches else [],
    }


def with_v2_columns(schema):
    """The capture schema with the v2 columns (issue 13) whether or not this kinspect's schema has them yet."""
    import pyarrow as pa

    for name, kind in (("client_software_name", pa.string()), ("client_software_version", pa.string()),
                       ("record_magics", pa.list_(pa.int8()))):
        if name not in schema.names:
            schema = schema.append(pa.field(name, kind))
    return schema


def write_captures(out_dir: Path, rows: int, files: int = 3, seed: int = 1, distinct: int | None = None,
                   schema_version: int = SCHEMA_VERSION, v2: bool = True) -> list[Path]:
    """Write `rows` exchanges as `files` capture-*.parquet files; returns their paths.

    With `distinct`, only that many rows are generated and repeated to reach `rows`
    (fast to make millions for a benchmark; the job's work per row is the same).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = with_v2_columns(arrow_schema()) if v2 else arrow_schema()
    if schema_version != SCHEMA_VERSION:
        schema = schema.with_metadata({**schema.metadata, b"kinspect.capture.schema_version":
                                       str(schema_version).encode()})
    rnd = random.Random(seed)
    base_rows = min(rows, distinct) if distinct else rows
    generated = [exchange(rnd, i) for i in range(base_rows)]
    if schema_version < 3 or not v2:  # the layout before version 3: histograms of always 10 counts
        for row in generated:
            for field in row["integer_fields"]:
                for name in ("uvarint_hist", "zigzag_hist"):
                    field[name] = field[name] + [0] * (10 - len(field[name]))
    base = pa.Table.from_pylist(generated, schema=schema)
    if schema_version != SCHEMA_VERSION:
        base = base.set_column(0, "schema_version", pa.array([schema_version] * base_rows, pa.int16()))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    per_file = -(-rows // files)
    start = 0
    for n in range(files):
        count = min(per_file, rows - start)
        if count <= 0:
            break
        pieces, left, pos = [], count, start % base_rows
        while left:
            take = min(left, base_rows - pos)
            pieces.append(base.slice(pos, take))
            left -= take
            pos = 0
        path = out_dir / f"capture-{n:05d}.parquet"
        pq.write_table(pa.concat_tables(pieces), path, row_group_size=256 * 1024)
        paths.append(path)
        start += count
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write generated kinspect capture files")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("rows", type=int)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--distinct", type=int, help="generate this many rows and repeat them")
    args = parser.parse_args(argv)
    for path in write_captures(args.out_dir, args.rows, args.files, args.seed, args.distinct):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
