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

    counts = {name: buckets if name in LARGE else 1 for name in MERGES}
    merged = (scan.pieces.mapInArrow(reader(counts), BLOB_SCHEMA)
              .repartition(buckets, "aggregate", "bucket")
              .mapInArrow(merger(), MERGED_SCHEMA)
              .toArrow())
    parts: dict[str, list] = {name: [] for name in MERGES}
    for name, blob in zip(merged.column("aggregate").to_pylist(), merged.column("data").to_pylist()):
        parts[name].append(from_ipc(blob))
    return {name: _concat(name, tables) for name, tables in parts.items()}


def _concat(name: str, tables: list) -> pa.Table:
    if tables:
        return pa.concat_tables(tables)
    return merge_arrow(name, arrow_schema_of(name).empty_table())  # no rows: the aggregate's empty table


def on_driver(scan) -> dict:
    """Every aggregate of a small local capture, read, grouped and merged in this process
    (pyarrow Tables)."""
    from kinspect.analyze.partials import on_driver as partials_on_driver

    return {name: merge_arrow(name, partials_on_driver(name, scan.on_driver)) for name in MERGES}
