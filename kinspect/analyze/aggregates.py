"""The few narrow aggregations every table is derived from, each reading only the capture columns it needs.

The report's tables never read the captures themselves: they are derived from these
aggregates (kinspect.analyze.tables, kinspect.analyze.upgrade), which the job computes
once and keeps (memory, then disk) while the tables are built. Each aggregate is one
scan of its own columns (Parquet column pruning) and one shuffle of narrow rows:

    exchanges   one row per distinct (client software, client id, api, versions, record magics,
                first flexible version, schema version): counts, bytes, time range, decode
                problems, KIP-482 sizes -> summary, top_clients, kip482_savings, upgrade_*
    addresses   one row per distinct (client software, client address) -> upgrade_clients
    values      one row per distinct (api, direction, version, size) and (api, latency), with
                its count -> api_sizes, size_histogram, latency (exact percentiles)
    topics      per topic named (each list column is exploded only in its own aggregate)
    tags        per tagged field
    integers    per integer field path, with the varint histograms
    errors      per error code

Only Spark SQL expressions that Spark compiles run on the row path (projections,
generators, aggregate functions): no Python UDF, no higher-order function.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# capture columns of schema v2 (issue 13) that v1 files lack: read as null / empty there
OPTIONAL_COLUMNS = {"client_software_name": "string", "client_software_version": "string",
                    "record_magics": "array<tinyint>"}

# `values` directions: a request size, a response size, a latency (microseconds)
REQUEST, RESPONSE, LATENCY = 0, 1, 2
DIRECTIONS = {REQUEST: "request", RESPONSE: "response"}

EXCHANGE_KEYS = ("software", "software_version", "client_id", "api_key", "api_name", "version", "response_version",
                 "magic_mask", "first_flexible_version", "flexible", "schema_version")


def api() -> Column:
    """The api name, or api_<key> for an api the specs do not know."""
    return F.coalesce(F.col("api_name"), F.concat(F.lit("api_"), F.col("api_key").cast("string")))


def _named(agg: DataFrame) -> DataFrame:
    """`api` in place of the (api_key, api_name) an aggregate was grouped by: computed once per
    aggregate row instead of once per capture row."""
    first = [c for c in agg.columns if c not in ("api_key", "api_name")]
    return agg.select(api().alias("api"), *first)


def _response_version() -> Column:
    # the version the response body was read at, or the request's when that is null
    return F.coalesce(F.col("response_version"), F.col("request_version"))


def _magic_mask() -> Column:
    """The record-batch magic values seen (0, 1, 2) as a bit mask (bit m: magic m)."""
    magics = F.coalesce(F.col("record_magics"), F.array().cast("array<tinyint>"))
    return sum((F.when(F.array_contains(magics, m), 1 << m).otherwise(0) for m in range(3)), F.lit(0)).cast("bigint")


def _count_if(condition: Column) -> Column:
    return F.coalesce(F.sum(F.when(condition, 1)), F.lit(0)).cast("bigint")


def _sum_if(condition: Column, value: Column) -> Column:
    return F.coalesce(F.sum(F.when(condition, value)), F.lit(0)).cast("bigint")


def exchanges(captures: DataFrame) -> DataFrame:
    has_response = F.col("response_size").isNotNull()
    kip = ~F.col("flexible") & F.col("first_flexible_version").isNotNull()
    kip_request = kip & F.col("request_compact_size").isNotNull()
    kip_response = kip & F.col("response_compact_size").isNotNull() & has_response
    return (captures.select(
        F.coalesce(F.col("client_software_name"), F.lit("unknown")).alias("software"),
        F.col("client_software_version").alias("software_version"), "client_id",
        F.col("api_key").cast("int").alias("api_key"), "api_name", F.col("request_version").cast("int").alias("version"),
        _response_version().cast("int").alias("response_version"), _magic_mask().alias("magic_mask"),
        F.col("first_flexible_version").cast("int").alias("first_flexible_version"), "flexible",
        F.col("schema_version").cast("int").alias("schema_version"),
        F.unix_micros(F.col("request_time")).alias("t_us"), "request_size", "response_size",
        F.col("request_decode_error").isNotNull().alias("request_decode_error"),
        F.col("response_decode_error").isNotNull().alias("response_decode_error"),
        "request_inspected", "request_compact_size", "response_compact_size")
        .groupBy(*EXCHANGE_KEYS)
        .agg(F.count(F.lit(1)).alias("n"), F.min("t_us").alias("lo"), F.max("t_us").alias("hi"),
             F.sum("request_size").cast("bigint").alias("request_bytes"),
             F.coalesce(F.sum("response_size"), F.lit(0)).cast("bigint").alias("response_bytes"),
             F.count("response_size").alias("responses"),
             _count_if(F.col("request_decode_error")).alias("request_decode_errors"),
             _count_if(F.col("response_decode_error")).alias("response_decode_errors"),
             _count_if(~F.col("request_inspected")).alias("requests_not_inspected"),
             _count_if(kip_request).alias("kip_requests"),
             _sum_if(kip_request, F.col("request_size")).alias("kip_request_bytes"),
             _sum_if(kip_request, F.col("request_compact_size")).alias("kip_request_compact"),
             _count_if(kip_response).alias("kip_responses"),
             _sum_if(kip_response, F.col("response_size")).alias("kip_response_bytes"),
             _sum_if(kip_response, F.col("response_compact_size")).alias("kip_response_compact"))
        .select(api().alias("api"), "*").drop("api_name"))


def addresses(captures: DataFrame) -> DataFrame:
    return (captures.select(F.coalesce(F.col("client_software_name"), F.lit("unknown")).alias("software"),
                            F.col("client_software_version").alias("software_version"),
                            F.col("client_address").alias("address"))
            .distinct())


def values(captures: DataFrame) -> DataFrame:
    """Every request size, response size and latency, counted per distinct value: the percentiles
    derived from it are exact (nearest rank) whatever the number of rows."""
    def item(direction: int, version: Column | None, value: str) -> Column:
        return F.struct(F.lit(direction).cast("tinyint").alias("direction"),
                        (version if version is not None else F.lit(None)).cast("int").alias("version"),
                        F.col(value).cast("bigint").alias("v"))

    items = F.array(item(REQUEST, F.col("request_version"), "request_size"),
                    F.when(F.col("response_size").isNotNull(), item(RESPONSE, _response_version(), "response_size")),
                    F.when(F.col("latency_us").isNotNull(), item(LATENCY, None, "latency_us")))
    return (captures.select("api_key", "api_name", F.inline(items))
            .where(F.col("direction").isNotNull())
            .groupBy("api_key", "api_name", "direction", "version", "v").agg(F.count(F.lit(1)).alias("n"))
            .transform(_named))


def topics(captures: DataFrame) -> DataFrame:
    # a topic named twice in one exchange (request and response, say) counts once
    return (captures.select(F.explode(F.array_distinct(F.col("topic_partitions.topic"))).alias("topic"),
                            "request_size", F.coalesce(F.col("response_size"), F.lit(0)).alias("response_size"))
            .groupBy("topic")
            .agg(F.count(F.lit(1)).alias("exchanges"), F.sum("request_size").cast("bigint").alias("request_bytes"),
                 F.sum("response_size").cast("bigint").alias("response_bytes")))


def tags(captures: DataFrame) -> DataFrame:
    return (captures.select("api_key", "api_name", F.inline("tagged_fields"))
            .groupBy("location", "api_key", "api_name", "path", "tag", "name", "known")
            .agg(F.count(F.lit(1)).alias("count"), F.sum("size").cast("bigint").alias("bytes"))
            .transform(_named))


def integers(captures: DataFrame) -> DataFrame:
    hist = [F.sum(F.col("uvarint_hist")[i]).cast("bigint").alias(f"u{i + 1}") for i in range(10)]
    hist += [F.sum(F.col("zigzag_hist")[i]).cast("bigint").alias(f"z{i + 1}") for i in range(10)]
    return (captures.select("api_key", "api_name", F.inline("integer_fields"))
            .groupBy("api_key", "api_name", "location", "path", "type")
            .agg(F.count(F.lit(1)).alias("exchanges"), F.sum("count").cast("bigint").alias("count"),
                 F.sum("fixed_bytes").cast("bigint").alias("fixed_bytes"),
                 F.sum("zigzag_bytes").cast("bigint").alias("packed_bytes"),
                 F.sum("uvarint_bytes").cast("bigint").alias("upacked_bytes"), *hist)
            .transform(_named))


def errors(captures: DataFrame) -> DataFrame:
    return (captures.select("api_key", "api_name", F.inline("error_codes"))
            .groupBy("api_key", "api_name", F.col("code").cast("int").alias("code"), "name")
            .agg(F.sum("count").cast("bigint").alias("count"), F.count(F.lit(1)).alias("exchanges"))
            .transform(_named))


# name -> how it is computed from the captures, in the order the job starts them
AGGREGATES = {"exchanges": exchanges, "addresses": addresses, "values": values, "topics": topics,
              "tags": tags, "integers": integers, "errors": errors}
