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

Each is computed in two steps of Spark tasks: the first reads the capture files with
pyarrow, only the columns the aggregate needs, groups each piece with Arrow's compiled
kernels (kinspect.analyze.scan, kinspect.analyze.partials) and splits the partial rows into
buckets by key; Spark shuffles the buckets as opaque Arrow bytes, and the second merges
each bucket (sums, minima, maxima; kinspect.analyze.merge). No Python runs per row, and
the JVM only moves bytes. A small local capture is read, grouped and merged by the same
pyarrow code on the driver.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from kinspect.analyze.merge import MERGES, aggregate_ddl
from kinspect.analyze.partials import BLOB_SCHEMA


def compute(spark, scan, buckets: int) -> dict[str, DataFrame]:
    """Every aggregate of the captures that Spark's read tasks cover (`kinspect.analyze.scan.Scan`),
    as lazy DataFrames: read and partially grouped per piece, shuffled in `buckets` by key,
    merged per bucket."""
    from kinspect.analyze.scan import merger, reader

    return {name: (scan.pieces.mapInArrow(reader(name, buckets), BLOB_SCHEMA)
                   .repartition(buckets, "bucket")
                   .mapInArrow(merger(name), aggregate_ddl(name)))
            for name in MERGES}


def on_driver(scan) -> dict:
    """Every aggregate of a small local capture, read, grouped and merged in this process
    (pyarrow Tables)."""
    from kinspect.analyze.merge import merge_arrow
    from kinspect.analyze.partials import on_driver as partials_on_driver

    return {name: merge_arrow(name, partials_on_driver(name, scan.on_driver)) for name in MERGES}
