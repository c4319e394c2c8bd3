"""The few narrow aggregations every table is derived from, computed in one pass over the captures.

The report's tables never read the captures themselves: they are derived from these
aggregates (kinspect.analyze.tables, kinspect.analyze.upgrade), which the job computes
once and keeps (memory, then disk) while the tables are built:

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
rows (sums, minima, maxima) in one shuffle. No Python runs per row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kinspect.analyze.partials import EXCHANGE_KEYS, HIST, LATENCY, PARTIAL_SCHEMAS, REQUEST, RESPONSE  # noqa: F401

DIRECTIONS = {REQUEST: "request", RESPONSE: "response"}


def api() -> Column:
    """The api name, or api_<key> for an api the specs do not know."""
    return F.coalesce(F.col("api_name"), F.concat(F.lit("api_"), F.col("api_key").cast("string")))


def _named(agg: DataFrame) -> DataFrame:
    """`api` in place of the (api_key, api_name) an aggregate was grouped by: computed once per
    aggregate row instead of once per capture row."""
    first = [c for c in agg.columns if c not in ("api_key", "api_name")]
    return agg.select(api().alias("api"), *first)


def _sum(column: str) -> Column:
    return F.sum(column).cast("bigint").alias(column)


def _sum0(column: str) -> Column:
    return F.coalesce(F.sum(column), F.lit(0)).cast("bigint").alias(column)


def exchanges(partials: DataFrame) -> DataFrame:
    return (partials.groupBy(*EXCHANGE_KEYS)
            .agg(_sum("n"), F.min("lo").alias("lo"), F.max("hi").alias("hi"), _sum("request_bytes"),
                 _sum0("response_bytes"), _sum0("responses"), _sum0("request_decode_errors"),
                 _sum0("response_decode_errors"), _sum0("requests_not_inspected"), _sum0("kip_requests"),
                 _sum0("kip_request_bytes"), _sum0("kip_request_compact"), _sum0("kip_responses"),
                 _sum0("kip_response_bytes"), _sum0("kip_response_compact"))
            .select(api().alias("api"), "*").drop("api_name"))


def addresses(partials: DataFrame) -> DataFrame:
    return partials.distinct()


def values(partials: DataFrame) -> DataFrame:
    """Every request size, response size and latency, counted per distinct value: the percentiles
    derived from it are exact (nearest rank) whatever the number of rows."""
    return partials.groupBy("api_key", "api_name", "direction", "version", "v").agg(_sum("n")).transform(_named)


def topics(partials: DataFrame) -> DataFrame:
    return partials.groupBy("topic").agg(_sum("exchanges"), _sum("request_bytes"), _sum("response_bytes"))


def tags(partials: DataFrame) -> DataFrame:
    return (partials.groupBy("location", "api_key", "api_name", "path", "tag", "name", "known")
            .agg(_sum("count"), _sum("bytes")).transform(_named))


def integers(partials: DataFrame) -> DataFrame:
    return (partials.groupBy("api_key", "api_name", "location", "path", "type")
            .agg(*[_sum(c) for c in ("exchanges", "count", "fixed_bytes", "packed_bytes", "upacked_bytes") + HIST])
            .transform(_named))


def errors(partials: DataFrame) -> DataFrame:
    return (partials.groupBy("api_key", "api_name", "code", "name").agg(_sum("count"), _sum("exchanges"))
            .transform(_named))


# name -> how it is merged from its partial rows, in the order the job starts them
AGGREGATES = {"exchanges": exchanges, "addresses": addresses, "values": values, "topics": topics,
              "tags": tags, "integers": integers, "errors": errors}


def compute(spark, scan) -> dict[str, DataFrame]:
    """Every aggregate of the captures a `kinspect.analyze.scan.Scan` covers (lazy DataFrames):
    the partial rows come from Spark's tasks, or for a small local capture from this process."""
    from kinspect.analyze.partials import on_driver
    from kinspect.analyze.scan import reader

    if scan.on_driver is not None:
        return {name: merge(spark.createDataFrame(on_driver(name, scan.on_driver), PARTIAL_SCHEMAS[name]))
                for name, merge in AGGREGATES.items()}
    return {name: merge(scan.pieces.mapInArrow(reader(name), PARTIAL_SCHEMAS[name]))
            for name, merge in AGGREGATES.items()}
