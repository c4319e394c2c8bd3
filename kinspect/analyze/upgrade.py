"""Upgrade readiness: which clients (software, version, client ids, addresses) use what a target release rejects.

A target is a plain dict built on the driver and passed into the job:

    {target_name: {"accepted": {api_key: (min_version, max_version)}, "min_record_magic": int}}

`builtin_targets()` builds it from the shipped specs (one target per release); the CLI may
give another (e.g. from kinspect.upgrade.targets.load_target). A request is rejected when
the target has no such api ("api removed"), its version is below the target's lowest
("api version removed") or above its highest ("api version unknown to the target"), or
its record batches carry a magic below the target's `min_record_magic`
("record format v0/v1 removed"). Computed in Spark from the job's `exchanges` and `addresses`
aggregates (kinspect.analyze.aggregates).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kinspect.analyze.tables import Aggregates

LISTED = 20  # client ids and addresses listed per client; the rest are counted
REJECTED_LISTED = 50


def builtin_targets(spec_dirs: list = ()) -> dict:
    """One target per release of the shipped specs (and per extra spec directory): the request
    versions each api accepts (its validVersions), and 2 as the lowest record magic when
    the release's lowest Produce version is 3 or more (KIP-724/KIP-896), else 0."""
    from pathlib import Path

    from kinspect.protocol.specs.registry import load_builtin_layers, load_directory

    layers = load_builtin_layers() + [load_directory(Path(d)) for d in spec_dirs]
    targets = {}
    for layer in layers:
        accepted = {}
        for msg in layer.messages:
            if msg.kind == "request" and not msg.valid_versions.empty:
                accepted[msg.api_key] = (msg.valid_versions.low, msg.valid_versions.high)
        produce = accepted.get(0)
        targets[layer.name] = {"accepted": accepted,
                               "min_record_magic": 2 if produce and produce[0] >= 3 else 0}
    return targets


def _with_reasons(aggs: Aggregates, targets: dict) -> DataFrame:
    """Every row of the `exchanges` aggregate once per target, with the target's verdict (`reason`)."""
    exchanges = aggs["exchanges"]
    spark = exchanges.sparkSession
    accepted = spark.createDataFrame(
        [(name, int(key), int(lo), int(hi)) for name, t in targets.items() for key, (lo, hi) in t["accepted"].items()],
        "target string, api_key int, min_version int, max_version int")
    floors = spark.createDataFrame([(name, int(t["min_record_magic"])) for name, t in targets.items()],
                                   "target string, min_record_magic int")
    used = exchanges.select("software", "software_version", "client_id", "api", "api_key", "version", "magic_mask",
                            "n", "lo", "hi")
    old_magics = F.col("magic_mask").bitwiseAND(F.expr("shiftleft(1L, min_record_magic) - 1"))
    reason = (F.when(F.col("min_version").isNull(), "api removed")
              .when(F.col("version") < F.col("min_version"), "api version removed")
              .when(F.col("version") > F.col("max_version"), "api version unknown to the target")
              .when(old_magics != 0, "record format v0/v1 removed"))
    return (F.broadcast(floors).crossJoin(used)
            .join(F.broadcast(accepted), ["target", "api_key"], "left")
            .withColumn("reason", reason))


def _ordered(df: DataFrame, *columns) -> DataFrame:
    return df.coalesce(1).sortWithinPartitions(*columns)


def upgrade_versions(aggs: Aggregates, targets: dict) -> DataFrame:
    """Per target and client software: every (api, version) used, with counts, and the target's verdict."""
    magics = F.expr("filter(array(0, 1, 2), m -> (mask & shiftleft(1L, m)) != 0)")  # a few rows: not the row path
    return (_with_reasons(aggs, targets)
            .groupBy("target", "software", "software_version", "api", "api_key", "version", "reason")
            .agg(F.sum("n").alias("requests"), F.countDistinct("client_id").alias("client_ids"),
                 F.bit_or("magic_mask").alias("mask"),
                 F.min("lo").alias("first_seen_us"), F.max("hi").alias("last_seen_us"))
            .withColumn("record_magics", magics.cast("array<int>"))
            .select("target", "software", "software_version", "api", "api_key", "version", "requests", "client_ids",
                    "record_magics", "first_seen_us", "last_seen_us", F.col("reason").alias("rejected"))
            .transform(_ordered, "target", "software", F.col("software_version").asc_nulls_first(), "api",
                       "version", F.col("rejected").asc_nulls_first()))


def upgrade_clients(aggs: Aggregates, targets: dict) -> DataFrame:
    """Per target, every client software (name, version): its client ids, addresses, first and
    last seen, its requests, and those the target rejects."""
    rejected = F.when(F.col("reason").isNotNull(),
                      F.concat(F.col("api"), F.lit(" v"), F.col("version").cast("string"), F.lit(": "),
                               F.col("reason")))
    ids = F.sort_array(F.collect_set("client_id"))
    clients = (_with_reasons(aggs, targets)
               .groupBy("target", "software", "software_version")
               .agg(F.slice(ids, 1, LISTED).alias("client_ids"), F.size(ids).alias("client_id_count"),
                    F.min("lo").alias("first_seen_us"), F.max("hi").alias("last_seen_us"),
                    F.sum("n").alias("requests"),
                    F.coalesce(F.sum(F.when(F.col("reason").isNotNull(), F.col("n"))), F.lit(0))
                    .alias("rejected_requests"),
                    F.slice(F.sort_array(F.collect_set(rejected)), 1, REJECTED_LISTED).alias("rejected")))
    listed = F.sort_array(F.collect_set("address"))
    addresses = (aggs["addresses"].groupBy("software", "software_version")
                 .agg(F.slice(listed, 1, LISTED).alias("addresses"), F.size(listed).alias("address_count")))
    # software_version is null for clients that never said: a null-safe join keeps them
    same = ((clients["software"] == addresses["software"])
            & clients["software_version"].eqNullSafe(addresses["software_version"]))
    return (clients.join(F.broadcast(addresses), same, "left")
            .select("target", clients["software"], clients["software_version"], "client_ids", "client_id_count",
                    "addresses", "address_count", "first_seen_us", "last_seen_us", "requests", "rejected_requests",
                    "rejected")
            .transform(_ordered, "target", F.col("rejected_requests").desc(), "software",
                       F.col("software_version").asc_nulls_first()))


# name -> (function, one-line description), in report order
UPGRADE_TABLES = {
    "upgrade_clients": (upgrade_clients, "upgrade readiness: every client software with its client ids, addresses, "
                        "first and last seen, and the requests each target release rejects"),
    "upgrade_versions": (upgrade_versions, "upgrade readiness: every (api, version) each client software used, "
                         "with counts and record magics, and whether each target release rejects it"),
}
