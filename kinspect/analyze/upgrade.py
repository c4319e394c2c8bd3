"""Upgrade readiness: which clients (software, version, client ids, addresses) use what a target release rejects.

A target is a plain dict built on the driver and passed into the job:

    {target_name: {"accepted": {api_key: (min_version, max_version)}, "min_record_magic": int}}

`builtin_targets()` builds it from the shipped specs (one target per release); the CLI may
give another (e.g. from kinspect.upgrade.targets.load_target). A request is rejected when
the target has no such api ("api removed"), its version is below the target's lowest
("api version removed") or above its highest ("api version unknown to the target"), or
its record batches carry a magic below the target's `min_record_magic`
("record format v0/v1 removed"). Computed on the driver from the job's `exchanges` and
`addresses` aggregates (kinspect.analyze.aggregates), a verdict per aggregate row and target.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from kinspect.analyze.tables import Aggregates, first, shared

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


def verdict(target: dict, api_key: int, version: int, magic_mask: int) -> str | None:
    """Why `target` rejects a request of this api and version whose record batches carried the
    magics of `magic_mask` (bit m: magic m), or None when it accepts it."""
    accepted = target["accepted"].get(api_key)
    if accepted is None:
        return "api removed"
    if version < accepted[0]:
        return "api version removed"
    if version > accepted[1]:
        return "api version unknown to the target"
    if magic_mask & ((1 << target["min_record_magic"]) - 1):
        return "record format v0/v1 removed"
    return None


def _with_verdicts(aggs: Aggregates, targets: dict) -> pa.Table:
    """`_verdicts`, computed once for both upgrade tables (for the same targets)."""
    return shared(aggs, f"verdicts {id(targets)}", lambda: _verdicts(aggs, targets))


def _verdicts(aggs: Aggregates, targets: dict) -> pa.Table:
    """The `exchanges` aggregate's rows (narrowed to what the upgrade tables use) once per
    target, with its verdict: a verdict depends only on (api_key, version, magic_mask), so
    it is decided once per distinct triple and joined back, not once per row."""
    used = (aggs["exchanges"].select(["software", "software_version", "client_id", "api", "api_key", "version",
                                      "magic_mask", "n", "lo", "hi"])
            .group_by(["software", "software_version", "client_id", "api", "api_key", "version", "magic_mask"],
                      use_threads=False)
            .aggregate([("n", "sum"), ("lo", "min"), ("hi", "max")])
            .rename_columns({"n_sum": "n", "lo_min": "lo", "hi_max": "hi"}))
    triples = used.select(["api_key", "version", "magic_mask"]).group_by(
        ["api_key", "version", "magic_mask"], use_threads=False).aggregate([]).to_pylist()
    per_target = []
    for name, target in targets.items():
        decided = pa.table({
            "api_key": pa.array([t["api_key"] for t in triples], used.schema.field("api_key").type),
            "version": pa.array([t["version"] for t in triples], used.schema.field("version").type),
            "magic_mask": pa.array([t["magic_mask"] for t in triples], used.schema.field("magic_mask").type),
            "reason": pa.array([verdict(target, t["api_key"], t["version"], t["magic_mask"]) for t in triples],
                               pa.string())})
        joined = used.join(decided, ["api_key", "version", "magic_mask"], join_type="left outer", use_threads=False)
        per_target.append(joined.append_column("target", pa.array([name] * joined.num_rows, pa.string())))
    return pa.concat_tables(per_target) if per_target else used.append_column("reason", pa.nulls(0, pa.string()))


def upgrade_versions(aggs: Aggregates, targets: dict) -> list[dict]:
    """Per target and client software: every (api, version) used, with counts, and the target's verdict."""
    keys = ["target", "software", "software_version", "api", "api_key", "version", "reason"]
    grouped = _with_verdicts(aggs, targets).group_by(keys + ["magic_mask"], use_threads=False).aggregate(
        [("n", "sum"), ("lo", "min"), ("hi", "max"), ("client_id", "distinct", pc.CountOptions("only_valid"))])
    groups = {}
    for row in grouped.to_pylist():  # a row per (group, magic mask): few
        key = tuple(row[k] for k in keys)
        group = groups.setdefault(key, {"requests": 0, "ids": set(), "mask": 0, "lo": None, "hi": None})
        group["requests"] += row["n_sum"]
        group["lo"] = row["lo_min"] if group["lo"] is None else min(group["lo"], row["lo_min"])
        group["hi"] = row["hi_max"] if group["hi"] is None else max(group["hi"], row["hi_max"])
        group["ids"].update(row["client_id_distinct"])
        group["mask"] |= row["magic_mask"]
    rows = [{"target": k[0], "software": k[1], "software_version": k[2], "api": k[3], "api_key": k[4],
             "version": k[5], "requests": g["requests"], "client_ids": len(g["ids"]),
             "record_magics": [m for m in range(3) if g["mask"] & (1 << m)],
             "first_seen_us": g["lo"], "last_seen_us": g["hi"], "rejected": k[6]} for k, g in groups.items()]
    return sorted(rows, key=lambda r: (r["target"], r["software"], first(r["software_version"]), r["api"],
                                       r["version"], first(r["rejected"])))


def upgrade_clients(aggs: Aggregates, targets: dict) -> list[dict]:
    """Per target, every client software (name, version): its client ids, addresses, first and
    last seen, its requests, and those the target rejects."""
    keys = ["target", "software", "software_version"]
    rows = _with_verdicts(aggs, targets)
    rejected = pc.is_valid(rows["reason"])
    rows = rows.append_column("rejected_n", pc.if_else(rejected, rows["n"], 0)).append_column(
        "rejected", pc.if_else(rejected, pc.binary_join_element_wise(
            rows["api"], " v", pc.cast(rows["version"], pa.string()), ": ", rows["reason"], ""), None))
    grouped = rows.group_by(keys, use_threads=False).aggregate(
        [("n", "sum"), ("lo", "min"), ("hi", "max"), ("rejected_n", "sum"),
         ("client_id", "distinct", pc.CountOptions("only_valid")),
         ("rejected", "distinct", pc.CountOptions("only_valid"))])
    addresses = (aggs["addresses"].group_by(["software", "software_version"], use_threads=False)
                 .aggregate([("address", "distinct", pc.CountOptions("only_valid"))]).to_pylist())
    # software_version is null for clients that never said: they match null, as a null-safe join does
    listed = {(a["software"], a["software_version"]): sorted(a["address_distinct"]) for a in addresses}
    out = []
    for g in grouped.to_pylist():
        ids = sorted(g["client_id_distinct"])
        seen = listed.get((g["software"], g["software_version"]))
        out.append({"target": g["target"], "software": g["software"], "software_version": g["software_version"],
                    "client_ids": ids[:LISTED], "client_id_count": len(ids),
                    "addresses": seen[:LISTED] if seen is not None else None,
                    "address_count": len(seen) if seen is not None else None,
                    "first_seen_us": g["lo_min"], "last_seen_us": g["hi_max"], "requests": g["n_sum"],
                    "rejected_requests": g["rejected_n_sum"],
                    "rejected": sorted(g["rejected_distinct"])[:REJECTED_LISTED]})
    return sorted(out, key=lambda r: (r["target"], -r["rejected_requests"], r["software"],
                                      first(r["software_version"])))


_STR, _I32, _I64 = pa.string(), pa.int32(), pa.int64()

# name -> (function, one-line description, Arrow schema of its rows), in report order
UPGRADE_TABLES = {
    "upgrade_clients": (upgrade_clients, "upgrade readiness: every client software with its client ids, addresses, "
                        "first and last seen, and the requests each target release rejects", pa.schema([
                            ("target", _STR), ("software", _STR), ("software_version", _STR),
                            ("client_ids", pa.list_(_STR)), ("client_id_count", _I32), ("addresses", pa.list_(_STR)),
                            ("address_count", _I32), ("first_seen_us", _I64), ("last_seen_us", _I64),
                            ("requests", _I64), ("rejected_requests", _I64), ("rejected", pa.list_(_STR))])),
    "upgrade_versions": (upgrade_versions, "upgrade readiness: every (api, version) each client software used, "
                         "with counts and record magics, and whether each target release rejects it", pa.schema([
                             ("target", _STR), ("software", _STR), ("software_version", _STR), ("api", _STR),
                             ("api_key", _I32), ("version", _I32), ("requests", _I64), ("client_ids", _I64),
                             ("record_magics", pa.list_(_I32)), ("first_seen_us", _I64), ("last_seen_us", _I64),
                             ("rejected", _STR)])),
}
