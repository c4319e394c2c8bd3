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
On a local master the buckets go through local files instead (kinspect.analyze.handoff): two
jobs, read then merge.
No Python runs per row, and the JVM only moves bytes. A small local capture is read,
grouped and merged by the same code on the driver.
"""

from __future__ import annotations

import pyarrow as pa

from kinspect.analyze.merge import MERGES, merge_arrow
from kinspect.analyze.partials import arrow_schema_of, from_ipc

# The aggregates whose merge is spread over the shuffle's buckets: they grow with the input
# (the distinct sizes and latencies; clients times apis and versions). The others hold a few
# thousand rows at most and are merged in one bucket each.
LARGE = ("exchanges", "values")


def compute(spark, scan, buckets: int) -> dict[str, pa.Table]:
    """Every aggregate of the captures that Spark's read tasks cover (`kinspect.analyze.scan.Scan`),
    in one Spark job: each piece read and partially grouped, its partial rows shuffled in
    `buckets` by key as Arrow bytes, each bucket merged; collected on the driver. On a local
    master the partial rows go from the read tasks to the merging ones through local files
    instead of the shuffle (kinspect.analyze.handoff).

    The job is two RDD stages, not DataFrame ones: the JVM holds the Arrow bytes as opaque
    byte arrays from the Python worker to the shuffle and back, where mapInArrow copied them
    into and out of Spark SQL rows and Arrow batches at each step (a toy job moving 132 MB of
    bytes through the same two stages: JVM CPU 1.1-1.3 s and 5.8 s wall as DataFrames, 0.7 s
    and 1.2 s as RDDs)."""
    from kinspect.analyze import handoff as files
    from kinspect.analyze.scan import merger, partition_of, reader

    if files.local_master(spark):
        merged = files.through_files(spark, scan, placement(buckets), buckets)
    else:
        spark.sparkContext.setJobDescription("kinspect analyze: the captures into the aggregates")
        merged = (scan.pieces.mapPartitions(reader(placement(buckets)))
                  .partitionBy(buckets, partition_of)
                  .mapPartitions(merger())
                  .collect())
    parts: dict[str, list] = {name: [] for name in MERGES}
    for name, blob in merged:
        parts[name].append(from_ipc(blob))
    return {name: _concat(name, tables) for name, tables in parts.items()}


def placement(partitions: int) -> dict[str, list[int]]:
    """Each aggregate's buckets, as the shuffle partition each goes to: the large aggregates'
    bucket b to partition b, the small ones' single bucket round the partitions, so that the
    merges are spread evenly. (Hashing (aggregate, bucket) instead had put four of the six
    values buckets of the 5M capture in one partition: one merging task took most of the
    stage.) A bucket's partition only balances the work: rows with equal keys share a bucket,
    whichever partition it goes to."""
    small = [name for name in MERGES if name not in LARGE]
    return {name: list(range(partitions)) if name in LARGE else [small.index(name) % partitions] for name in MERGES}


# aggregate -> its string columns the driver keeps as dictionaries: the values aggregate's api,
# a row per distinct size and latency (1.8M rows at 5M exchanges), whose tables rank the apis by
# their dictionary (kinspect.analyze.tables._ranked_values): decoding it cost 70 ms and
# ranking the decoded strings 110 ms more, against 13 ms
DICTIONARIES = {"values": ("api",)}


def driver_schema(name: str) -> pa.Schema:
    """The types of aggregate `name` on the driver: its merged types, strings plain except DICTIONARIES."""
    schema = merge_arrow(name, arrow_schema_of(name).empty_table()).schema  # no rows: the aggregate's types
    for column in DICTIONARIES.get(name, ()):
        schema = schema.set(schema.get_field_index(column), pa.field(column, pa.dictionary(pa.int32(), pa.string())))
    return schema


def _concat(name: str, tables: list) -> pa.Table:
    """The merging tasks' rows of aggregate `name`, in its driver types (each came in its narrowest)."""
    schema = driver_schema(name)
    return pa.concat_tables([table.cast(schema) for table in tables]) if tables else schema.empty_table()


def on_driver(scan) -> dict:
    """Every aggregate of a small local capture, read, grouped and merged in this process
    (pyarrow Tables, in the same types as `compute`'s)."""
    from kinspect.analyze.partials import on_driver as partials_on_driver

    partials = partials_on_driver(scan.on_driver)
    return {name: _concat(name, [merge_arrow(name, partials[name], False)]) for name in MERGES}
