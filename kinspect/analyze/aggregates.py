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

Each is computed in two steps: Spark tasks read the capture files with pyarrow, only the
columns the aggregate needs, and group each chunk with Arrow's compiled kernels
(kinspect.analyze.scan, kinspect.analyze.partials); then Spark merges the tasks' partial
rows (sums, minima, maxima; kinspect.analyze.merge) in one shuffle. No Python runs per row.
A small local capture is read, grouped and merged by the same pyarrow code on the driver.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kinspect.analyze.merge import MERGES, aggregate_columns
from kinspect.analyze.partials import PARTIAL_SCHEMAS


def api() -> Column:
    """The api name, or api_<key> for an api the specs do not know."""
    return F.coalesce(F.col("api_name"), F.concat(F.lit("api_"), F.col("api_key").cast("string")))


def merge(name: str, partials: DataFrame) -> DataFrame:
    """Aggregate `name` from its partial rows, merged by Spark (kinspect.analyze.merge.MERGES)."""
    keys, values, zeros, named, _ = MERGES[name]
    if not values:
        merged = partials.select(*keys).distinct()
    else:
        merged = partials.groupBy(*keys).agg(*[
            (F.coalesce(F.sum(c), F.lit(0)) if c in zeros else getattr(F, op)(c)).cast("bigint").alias(c)
            for c, op in values.items()])
    if named:
        merged = merged.withColumn("api", api())
    return merged.select(*aggregate_columns(name))


def compute(spark, scan) -> dict[str, DataFrame]:
    """Every aggregate of the captures that Spark's read tasks cover (`kinspect.analyze.scan.Scan`),
    as lazy DataFrames."""
    from kinspect.analyze.scan import reader

    return {name: merge(name, scan.pieces.mapInArrow(reader(name), PARTIAL_SCHEMAS[name])) for name in MERGES}


def on_driver(scan) -> dict:
    """Every aggregate of a small local capture, read, grouped and merged in this process
    (pyarrow Tables)."""
    from kinspect.analyze.merge import merge_arrow
    from kinspect.analyze.partials import on_driver as partials_on_driver

    return {name: merge_arrow(name, partials_on_driver(name, scan.on_driver)) for name in MERGES}
