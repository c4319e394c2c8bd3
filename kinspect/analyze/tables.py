"""The report's tables, each a function from the captures DataFrame to a small aggregate DataFrame.

Definitions shared by every table (the README's "Analyze captures" section repeats them):
- `api` is the api name, or `api_<key>` for an api the specs do not know.
- A request's version is `request_version`; a response's is `response_version` (the version
  its body was read at), or the request's when that is null.
- Percentiles are exact, by nearest rank: pN of n values is the value at rank ceil(N/100 * n)
  of the sorted values (Spark's percentile_disc). Latencies are microseconds in the
  captures and milliseconds (value / 1000) in the tables.
- Size histogram buckets are powers of two: bucket k holds sizes in [2^k, 2^(k+1)).
- A topic's bytes are the request and response bytes of every exchange that names it; an
  exchange naming three topics counts in full for each of them (frames are not split
  by topic, so this is an upper bound per topic, not a share).
- Rows that never got a response (acks=0 produces) count as requests only.
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def api_column() -> Column:
    return F.coalesce(F.col("api_name"), F.concat(F.lit("api_"), F.col("api_key").cast("string")))


def _percentiles(column: str, scale: float | None = None) -> list[Column]:
    out = []
    for name, p in PERCENTILES:
        value = F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})")
        out.append((value.cast("long") / scale if scale else value.cast("long")).alias(name))
    return out


def _by_direction(df: DataFrame) -> DataFrame:
    """One row per message: api, direction, version, size."""
    requests = df.select(api_column().alias("api"), F.lit("request").alias("direction"),
                         F.col("request_version").cast("int").alias("version"), F.col("request_size").alias("size"))
    responses = df.where(F.col("response_size").isNotNull()).select(
        api_column().alias("api"), F.lit("response").alias("direction"),
        F.coalesce("response_version", "request_version").cast("int").alias("version"),
        F.col("response_size").alias("size"))
    return requests.unionByName(responses)


def summary(df: DataFrame, top: int) -> DataFrame:
    return df.agg(
        F.count(F.lit(1)).alias("exchanges"),
        F.count("response_size").alias("responses"),
        # microseconds since the epoch, UTC: collect() would turn a timestamp into the driver's local time
        F.unix_micros(F.min("request_time")).alias("first_request_us"),
        F.unix_micros(F.max("request_time")).alias("last_request_us"),
        F.sum("request_size").alias("request_bytes"),
        F.coalesce(F.sum("response_size"), F.lit(0)).alias("response_bytes"),
        F.countDistinct(api_column()).alias("apis"),
        F.countDistinct("client_id").alias("client_ids"),
        F.sum(F.when(F.col("request_decode_error").isNotNull(), 1).otherwise(0)).alias("request_decode_errors"),
        F.sum(F.when(F.col("response_decode_error").isNotNull(), 1).otherwise(0)).alias("response_decode_errors"),
        F.sum(F.when(F.col("request_inspected"), 0).otherwise(1)).alias("requests_not_inspected"),
        F.min("schema_version").cast("int").alias("min_schema_version"),
        F.max("schema_version").cast("int").alias("max_schema_version"),
    )


def api_sizes(df: DataFrame, top: int) -> DataFrame:
    return (_by_direction(df).groupBy("api", "direction", "version")
            .agg(F.count(F.lit(1)).alias("count"), *_percentiles("size"),
                 F.max("size").cast("long").alias("max"), F.sum("size").alias("sum"))
            .orderBy("api", "direction", "version"))


def size_histogram(df: DataFrame, top: int) -> DataFrame:
    # bin() is the exact binary string of the size: its length - 1 is floor(log2(size)),
    # with no floating-point log at powers of two.
    bucket = (F.length(F.bin(F.col("size").cast("long"))) - 1).cast("int")
    return (_by_direction(df).withColumn("bucket", bucket).groupBy("api", "direction", "bucket")
            .agg(F.count(F.lit(1)).alias("count"))
            .withColumn("min_bytes", F.expr("shiftleft(CAST(1 AS BIGINT), bucket)"))
            .select("api", "direction", "bucket", "min_bytes", "count")
            .orderBy("api", "direction", "bucket"))


def _exchange_bytes() -> list[Column]:
    return [F.count(F.lit(1)).alias("exchanges"), F.sum("request_size").alias("request_bytes"),
            F.coalesce(F.sum("response_size"), F.lit(0)).alias("response_bytes")]


def top_clients(df: DataFrame, top: int) -> DataFrame:
    return (df.groupBy("client_id").agg(*_exchange_bytes())
            .withColumn("bytes", F.col("request_bytes") + F.col("response_bytes"))
            .orderBy(F.col("bytes").desc(), F.col("client_id").asc_nulls_first()).limit(top))


def top_topics(df: DataFrame, top: int) -> DataFrame:
    # A topic named twice in one exchange (request and response, say) counts once.
    names = F.array_distinct(F.transform("topic_partitions", lambda t: t["topic"]))
    return (df.select(F.explode(names).alias("topic"), "request_size", "response_size")
            .groupBy("topic").agg(*_exchange_bytes())
            .withColumn("bytes", F.col("request_bytes") + F.col("response_bytes"))
            .orderBy(F.col("bytes").desc(), F.col("topic").asc_nulls_first()).limit(top))


def tagged_fields(df: DataFrame, top: int) -> DataFrame:
    t = df.select(api_column().alias("api"), F.explode("tagged_fields").alias("t"))
    return (t.groupBy(F.col("t.location").alias("location"), "api", F.col("t.path").alias("path"),
                      F.col("t.tag").alias("tag"), F.col("t.name").alias("name"), F.col("t.known").alias("known"))
            .agg(F.count(F.lit(1)).alias("count"), F.sum("t.size").alias("bytes"))
            .orderBy("location", "api", "path", "tag", F.col("name").asc_nulls_first()))


def _saved_pct(saved: str, total: str) -> Column:
    return F.when(F.col(total) > 0, F.col(saved) * 100.0 / F.col(total))


def kip482_savings(df: DataFrame, top: int) -> DataFrame:
    base = df.where(~F.col("flexible") & F.col("first_flexible_version").isNotNull())
    common = [api_column().alias("api"), F.col("first_flexible_version").cast("int").alias("compact_version")]
    requests = base.where(F.col("request_compact_size").isNotNull()).select(
        *common, F.lit("request").alias("direction"), F.col("request_version").cast("int").alias("version"),
        F.col("request_size").alias("today"), F.col("request_compact_size").alias("compact"))
    responses = base.where(F.col("response_compact_size").isNotNull() & F.col("response_size").isNotNull()).select(
        *common, F.lit("response").alias("direction"),
        F.coalesce("response_version", "request_version").cast("int").alias("version"),
        F.col("response_size").alias("today"), F.col("response_compact_size").alias("compact"))
    return (requests.unionByName(responses).groupBy("api", "direction", "version", "compact_version")
            .agg(F.count(F.lit(1)).alias("count"), F.sum("today").alias("bytes_today"),
                 F.sum("compact").alias("bytes_compact"))
            .withColumn("saved", F.col("bytes_today") - F.col("bytes_compact"))
            .withColumn("saved_pct", _saved_pct("saved", "bytes_today"))
            .select("api", "direction", "version", "compact_version", "count", "bytes_today", "bytes_compact",
                    "saved", "saved_pct")
            .orderBy("api", "direction", "version"))


def _integer_fields(df: DataFrame) -> DataFrame:
    return df.select(api_column().alias("api"), F.explode("integer_fields").alias("f"))


def varint_savings(df: DataFrame, top: int) -> DataFrame:
    fixed, packed, upacked = F.col("fixed_bytes"), F.col("packed_bytes"), F.col("upacked_bytes")
    best = F.least(fixed, packed, upacked)
    return (_integer_fields(df)
            .groupBy("api", F.col("f.location").alias("location"), F.col("f.path").alias("path"),
                     F.col("f.type").alias("type"))
            .agg(F.count(F.lit(1)).alias("exchanges"), F.sum("f.count").alias("count"),
                 F.sum("f.fixed_bytes").alias("fixed_bytes"), F.sum("f.zigzag_bytes").alias("packed_bytes"),
                 F.sum("f.uvarint_bytes").alias("upacked_bytes"))
            .withColumn("best_bytes", best)
            # ties go to the simpler encoding: fixed, then packed
            .withColumn("best", F.when(best == fixed, "fixed").when(best == packed, "packed").otherwise("upacked"))
            .withColumn("saved", F.col("fixed_bytes") - F.col("best_bytes"))
            .withColumn("saved_pct", _saved_pct("saved", "fixed_bytes"))
            .drop("saved")
            .orderBy("api", "location", "path"))


def varint_histogram(df: DataFrame, top: int) -> DataFrame:
    f = _integer_fields(df)
    keys = ["api", F.col("f.location").alias("location"), F.col("f.path").alias("path"), F.col("f.type").alias("type")]
    unsigned = f.select(*keys, F.lit("unsigned").alias("encoding"), F.posexplode("f.uvarint_hist").alias("slot", "n"))
    zigzag = f.select(*keys, F.lit("zigzag").alias("encoding"), F.posexplode("f.zigzag_hist").alias("slot", "n"))
    return (unsigned.unionByName(zigzag).where(F.col("n") > 0)
            .groupBy("api", "location", "path", "type", "encoding", (F.col("slot") + 1).alias("bytes"))
            .agg(F.sum("n").alias("count"))
            .orderBy("api", "location", "path", "encoding", "bytes"))


def latency(df: DataFrame, top: int) -> DataFrame:
    return (df.where(F.col("latency_us").isNotNull()).groupBy(api_column().alias("api"))
            .agg(F.count(F.lit(1)).alias("count"), *_percentiles("latency_us", 1000.0),
                 (F.max("latency_us") / 1000.0).alias("max"))
            .withColumnsRenamed({name: f"{name}_ms" for name, _ in PERCENTILES} | {"max": "max_ms"})
            .orderBy("api"))


def error_codes(df: DataFrame, top: int) -> DataFrame:
    e = df.select(api_column().alias("api"), F.explode("error_codes").alias("e"))
    return (e.groupBy("api", F.col("e.code").cast("int").alias("code"), F.col("e.name").alias("name"))
            .agg(F.sum("e.count").alias("count"), F.count(F.lit(1)).alias("exchanges"))
            .orderBy("api", F.col("count").desc(), "code"))


# name -> (function, one-line description), in report order
TABLES: dict[str, tuple[Callable[[DataFrame, int], DataFrame], str]] = {
    "summary": (summary, "exchanges, bytes, time range and decode problems of the whole capture"),
    "api_sizes": (api_sizes, "message sizes per api, direction and version: count, p50, p90, p99, max, sum"),
    "size_histogram": (size_histogram, "message sizes per api and direction in power-of-two buckets"),
    "top_clients": (top_clients, "client ids by request + response bytes"),
    "top_topics": (top_topics, "topics by bytes of the exchanges that name them"),
    "tagged_fields": (tagged_fields, "KIP-482 tagged fields seen: where, which tag, how often, how many bytes"),
    "kip482_savings": (kip482_savings, "non-flexible messages: bytes today vs at the first flexible version"),
    "varint_savings": (varint_savings, "integer fields: bytes fixed today vs packed (zig-zag) vs upacked varints"),
    "varint_histogram": (varint_histogram, "integer values by the bytes their varint takes, per field and encoding"),
    "latency": (latency, "request to response latency per api, milliseconds"),
    "error_codes": (error_codes, "non-zero error codes per api (nested ones included)"),
}
