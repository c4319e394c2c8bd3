"""The few narrow aggregations every table is derived from, computed in one pass over the captures.

The report's tables never read the captures themselves: they are derived on the driver
from these aggregates (kinspect.analyze.tables, kinspect.analyze.upgrade), which the job
computes once and collects as Arrow:

    exchanges   one row per distinct (client software, client id, api, versions, record magics,
                first flexible version, schema version): counts, bytes, time range, decode
                problems, KIP-482 sizes -> summary, top_clients, kip482_savings, upgrade_*
    addresses   one row per distinct (client software, client address) -> upgrade_clients
    values      one row per distinct (api, direction, version, size) and (api, latency), with
                its count -> api_sizes, size_histogram, latency (exact percentiles)
    topics      per topic named (each list column is flattened only in its own aggregate)
    tags        per tagged field
    integers    per integer field path, with the varint histograms
    errors      per error code

All seven are computed in one Spark job of two stages: a task per piece of the captures
reads it with pyarrow, each aggregate's columns in turn, groups them with Arrow's and numpy's
compiled kernels (kinspect.analyze.scan, .partials, .groups) and splits each aggregate's
partial rows into buckets by key; Spark shuffles the buckets as opaque Arrow bytes, and a
task per shuffle partition merges its buckets (sums, minima, maxima; kinspect.analyze.merge).
No Python runs per row, and the JVM only moves bytes. A small local capture is read,
grouped and merged by the same code on the driver.
"""

from __future__ import annotations

import pyarrow as pa

from kinspect.analyze.merge import MERGED_SCHEMA, MERGES, merge_arrow
from kinspect.analyze.partials import BLOB_SCHEMA, arrow_schema_of, from_ipc

# The aggregates whose merge is spread over the shuffle's buckets: they grow with the input
# (the distinct sizes and latencies; clients times apis and versions). The others hold a few
# thousand rows at most and are merged in one bucket each.
LARGE = ("exchanges", "values")


def compute(spark, scan, buckets: int) -> dict[str, pa.Table]:
    """Every aggregate of the captures that Spark's read tasks cover (`kinspect.analyze.scan.Scan`),
    in one Spark job: each piece read and partially grouped, its partial rows shuffled in
    `buckets` by key as Arrow bytes, each bucket merged; collected on the driver."""
    from kinspect.analyze.scan import merger, reader

    merged = (scan.pieces.mapInArrow(reader(placement(buckets)), BLOB_SCHEMA)
              .repartition(buckets, "bucket")
              .mapInArrow(merger(), MERGED_SCHEMA)
              .toArrow())
    parts: dict[str, list] = {name: [] for name in MERGES}
    for name, blob in zip(merged.column("aggregate").to_pylist(), merged.column("data").to_pylist()):
        parts[name].append(from_ipc(blob))
    return {name: _concat(name, tables) for name, tables in parts.items()}


def placement(partitions: int) -> dict[str, list[int]]:
    """Each aggregate's buckets, as the labels its partial rows carry (BLOB_SCHEMA's bucket):
    Spark's shuffle sends a label to partition pmod(hash(label), partitions), and these are
    chosen to spread the merges evenly: the large aggregates' bucket b to partition b, the
    small ones' single bucket round the partitions. (Hashing (aggregate, bucket) instead put
    four of the six values buckets of the 5M capture in one partition: one merging task took
    most of the stage.) A label's partition only balances the work: rows with equal keys share
    a bucket, so a label, whichever partition it goes to."""
    labels = [_label(p, partitions) for p in range(partitions)]
    small = [name for name in MERGES if name not in LARGE]
    return {name: labels if name in LARGE else [labels[small.index(name) % partitions]] for name in MERGES}


def _label(partition: int, partitions: int) -> int:
    """The smallest int that Spark's hash partitioning sends to `partition`."""
    return next(label for label in range(1 << 20) if _spark_hash(label) % partitions == partition)


def _spark_hash(value: int, seed: int = 42) -> int:
    """Spark's hash() of an int (Murmur3_x86_32.hashInt with Spark's seed), as a signed int."""
    def rotated(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotated((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotated(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4  # the length in bytes
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def _concat(name: str, tables: list) -> pa.Table:
    """The merging tasks' rows of aggregate `name`, in its types (each came in its narrowest)."""
    empty = merge_arrow(name, arrow_schema_of(name).empty_table())  # no rows: the aggregate's empty table
    return pa.concat_tables([table.cast(empty.schema) for table in tables]) if tables else empty


def on_driver(scan) -> dict:
    """Every aggregate of a small local capture, read, grouped and merged in this process
    (pyarrow Tables)."""
    from kinspect.analyze.partials import on_driver as partials_on_driver

    return {name: merge_arrow(name, partials_on_driver(name, scan.on_driver)) for name in MERGES}
