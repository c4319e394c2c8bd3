"""The report's tables, each derived from the job's aggregates (kinspect.analyze.aggregates), never from the captures.

Definitions shared by every table (docs/analyze.md repeats them):
- `api` is the api name, or `api_<key>` for an api the specs do not know.
- A request's version is `request_version`; a response's is `response_version` (the version
  its body was read at), or the request's when that is null.
- Percentiles are exact, by nearest rank: pN of n values is the value at rank ceil(N/100 * n)
  of the sorted values. Latencies are microseconds in the captures and milliseconds
  (value / 1000) in the tables.
- Size histogram buckets are powers of two: bucket k holds sizes in [2^k, 2^(k+1)).
- A topic's bytes are the request and response bytes of every exchange that names it; an
  exchange naming three topics counts in full for each of them (frames are not split
  by topic, so this is an upper bound per topic, not a share).
- Rows that never got a response (acks=0 produces) count as requests only.
- top_clients and top_topics keep the top N by bytes and sum the rest in one last row
  named "(other)" (`grouped` says how many ids a row sums).
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kinspect.analyze import aggregates as A

Aggregates = dict[str, DataFrame]  # name -> aggregate (kinspect.analyze.aggregates.AGGREGATES)

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
OTHER = "(other)"


def ordered(df: DataFrame, *columns) -> DataFrame:
    """A small table sorted in one partition: no range-partitioning job, which a global sort would start."""
    return df.coalesce(1).sortWithinPartitions(*columns)


def percentiles(scale: float | None = None) -> list[Column]:
    """Exact nearest-rank percentiles of `v` (weighted by `n`): aggregate columns for a
    groupBy of the same keys over `with_ranks(df, keys)`."""
    out = []
    for name, p in PERCENTILES:
        rank = F.greatest(F.lit(1), F.ceil(F.lit(p) * F.col("total")))
        value = F.min(F.when(F.col("cum") >= rank, F.col("v")))
        out.append((value / scale if scale else value).alias(name))
    return out


def with_ranks(df: DataFrame, keys: list[str]) -> DataFrame:
    """`cum`: values up to and including this one; `total`: values of the group."""
    ordered = Window.partitionBy(*keys).orderBy("v").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (df.withColumn("cum", F.sum("n").over(ordered))
            .withColumn("total", F.sum("n").over(Window.partitionBy(*keys))))


def summary(aggs: Aggregates, top: int) -> DataFrame:
    return aggs["exchanges"].agg(
        F.sum("n").alias("exchanges"), F.sum("responses").alias("responses"),
        F.min("lo").alias("first_request_us"), F.max("hi").alias("last_request_us"),
        F.sum("request_bytes").alias("request_bytes"), F.sum("response_bytes").alias("response_bytes"),
        # not countDistinct: two of them make Spark expand every row once per distinct column
        F.size(F.collect_set("api")).cast("bigint").alias("apis"),
        F.size(F.collect_set("client_id")).cast("bigint").alias("client_ids"),
        F.sum("request_decode_errors").alias("request_decode_errors"),
        F.sum("response_decode_errors").alias("response_decode_errors"),
        F.sum("requests_not_inspected").alias("requests_not_inspected"),
        F.min("schema_version").alias("min_schema_version"), F.max("schema_version").alias("max_schema_version"))


def _sizes(aggs: Aggregates) -> DataFrame:
    direction = F.when(F.col("direction") == A.REQUEST, "request").otherwise("response")
    return (aggs["values"].where(F.col("direction") != A.LATENCY)
            .select("api", direction.alias("direction"), "version", "v", "n"))


def api_sizes(aggs: Aggregates, top: int) -> DataFrame:
    keys = ["api", "direction", "version"]
    return (with_ranks(_sizes(aggs), keys).groupBy(*keys)
            .agg(F.sum("n").alias("count"), *percentiles(),
                 F.max("v").alias("max"), F.sum(F.col("v") * F.col("n")).alias("sum"))
            .transform(ordered, *keys))


def size_histogram(aggs: Aggregates, top: int) -> DataFrame:
    # bin() is the exact binary string of the size: its length - 1 is floor(log2(size)),
    # with no floating-point log at powers of two.
    bucket = (F.length(F.bin(F.col("v"))) - 1).cast("int")
    return (_sizes(aggs).select("api", "direction", bucket.alias("bucket"), "n")
            .groupBy("api", "direction", "bucket").agg(F.sum("n").alias("count"))
            .withColumn("min_bytes", F.expr("shiftleft(CAST(1 AS BIGINT), bucket)"))
            .select("api", "direction", "bucket", "min_bytes", "count")
            .transform(ordered, "api", "direction", "bucket"))


def _top_with_other(rows: DataFrame, key: str, top: int) -> DataFrame:
    """The top `top` rows by bytes, then one row summing the rest (if any), named OTHER."""
    ranked = (rows.withColumn("bytes", F.col("request_bytes") + F.col("response_bytes"))
              .withColumn("rank", F.row_number().over(
                  Window.orderBy(F.col("bytes").desc(), F.col(key).asc_nulls_first()))))
    head = ranked.where(F.col("rank") <= top).withColumn("grouped", F.lit(1).cast("long"))
    tail = (ranked.where(F.col("rank") > top)
            .agg(F.sum("exchanges").alias("exchanges"), F.sum("request_bytes").alias("request_bytes"),
                 F.sum("response_bytes").alias("response_bytes"), F.sum("bytes").alias("bytes"),
                 F.count(F.lit(1)).alias("grouped"))
            .where(F.col("grouped") > 0)
            .select(F.lit(OTHER).alias(key), "exchanges", "request_bytes", "response_bytes", "bytes",
                    F.lit(top + 1).alias("rank"), "grouped"))
    columns = [key, "exchanges", "request_bytes", "response_bytes", "bytes", "grouped"]
    return head.select(*columns, "rank").unionByName(tail.select(*columns, "rank")).transform(ordered, "rank").drop("rank")


def top_clients(aggs: Aggregates, top: int) -> DataFrame:
    rows = (aggs["exchanges"].groupBy("client_id")
            .agg(F.sum("n").alias("exchanges"), F.sum("request_bytes").alias("request_bytes"),
                 F.sum("response_bytes").alias("response_bytes")))
    return _top_with_other(rows, "client_id", top)


def top_topics(aggs: Aggregates, top: int) -> DataFrame:
    return _top_with_other(aggs["topics"], "topic", top)


def tagged_fields(aggs: Aggregates, top: int) -> DataFrame:
    return (aggs["tags"].select("location", "api", "path", "tag", "name", "known", "count", "bytes")
            .transform(ordered, "location", "api", "path", "tag", F.col("name").asc_nulls_first()))


def _saved_pct(saved: str, total: str) -> Column:
    return F.when(F.col(total) > 0, F.col(saved) * 100.0 / F.col(total))


def kip482_savings(aggs: Aggregates, top: int) -> DataFrame:
    def side(direction: str, version: str, prefix: str) -> DataFrame:
        return (aggs["exchanges"].where(F.col(f"{prefix}s") > 0)
                .select("api", F.lit(direction).alias("direction"), F.col(version).alias("version"),
                        F.col("first_flexible_version").alias("compact_version"), F.col(f"{prefix}s").alias("n"),
                        F.col(f"{prefix}_bytes").alias("today"), F.col(f"{prefix}_compact").alias("compact")))

    keys = ["api", "direction", "version", "compact_version"]
    return (side("request", "version", "kip_request").unionByName(side("response", "response_version", "kip_response"))
            .groupBy(*keys)
            .agg(F.sum("n").alias("count"), F.sum("today").alias("bytes_today"),
                 F.sum("compact").alias("bytes_compact"))
            .withColumn("saved", F.col("bytes_today") - F.col("bytes_compact"))
            .withColumn("saved_pct", _saved_pct("saved", "bytes_today"))
            .transform(ordered, "api", "direction", "version"))


def varint_savings(aggs: Aggregates, top: int) -> DataFrame:
    fixed, packed, upacked = F.col("fixed_bytes"), F.col("packed_bytes"), F.col("upacked_bytes")
    best = F.least(fixed, packed, upacked)
    return (aggs["integers"]
            .select("api", "location", "path", "type", "exchanges", "count", "fixed_bytes", "packed_bytes",
                    "upacked_bytes")
            .withColumn("best_bytes", best)
            # ties go to the simpler encoding: fixed, then packed
            .withColumn("best", F.when(best == fixed, "fixed").when(best == packed, "packed").otherwise("upacked"))
            .withColumn("saved_pct", F.when(fixed > 0, (fixed - best) * 100.0 / fixed))
            .transform(ordered, "api", "location", "path"))


def varint_histogram(aggs: Aggregates, top: int) -> DataFrame:
    slots = F.array(*[F.struct(F.lit(encoding).alias("encoding"), F.lit(i).alias("bytes"),
                               F.col(f"{encoding[0]}{i}").alias("count"))
                      for encoding in ("unsigned", "zigzag") for i in range(1, 11)])
    return (aggs["integers"].select("api", "location", "path", "type", F.inline(slots))
            .where(F.col("count") > 0)
            .transform(ordered, "api", "location", "path", "encoding", "bytes"))


def latency(aggs: Aggregates, top: int) -> DataFrame:
    rows = aggs["values"].where(F.col("direction") == A.LATENCY).select("api", "v", "n")
    return (with_ranks(rows, ["api"]).groupBy("api")
            .agg(F.sum("n").alias("count"), *percentiles(1000.0), (F.max("v") / 1000.0).alias("max"))
            .withColumnsRenamed({name: f"{name}_ms" for name, _ in PERCENTILES} | {"max": "max_ms"})
            .transform(ordered, "api"))


def error_codes(aggs: Aggregates, top: int) -> DataFrame:
    return (aggs["errors"].select("api", "code", "name", "count", "exchanges")
            .transform(ordered, "api", F.col("count").desc(), "code"))


# name -> (function, one-line description), in report order
TABLES: dict[str, tuple[Callable[[Aggregates, int], DataFrame], str]] = {
    "summary": (summary, "exchanges, bytes, time range and decode problems of the whole capture"),
    "api_sizes": (api_sizes, "message sizes per api, direction and version: count, p50, p90, p99, max, sum"),
    "size_histogram": (size_histogram, "message sizes per api and direction in power-of-two buckets"),
    "top_clients": (top_clients, "client ids by request + response bytes, the rest summed as (other)"),
    "top_topics": (top_topics, "topics by bytes of the exchanges that name them, the rest summed as (other)"),
    "tagged_fields": (tagged_fields, "KIP-482 tagged fields seen: where, which tag, how often, how many bytes"),
    "kip482_savings": (kip482_savings, "non-flexible messages: bytes today vs at the first flexible version"),
    "varint_savings": (varint_savings, "integer fields: bytes fixed today vs packed (zig-zag) vs upacked varints"),
    "varint_histogram": (varint_histogram, "integer values by the bytes their varint takes, per field and encoding"),
    "latency": (latency, "request to response latency per api, milliseconds"),
    "error_codes": (error_codes, "non-zero error codes per api (nested ones included)"),
}
