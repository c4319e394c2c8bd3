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

import collections

import pyarrow as pa

from kinspect.analyze.tables import Aggregates, first

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


def _exchanges(aggs: Aggregates) -> list[dict]:
    return aggs["exchanges"].select(["software", "software_version", "client_id", "api", "api_key", "version",
                                     "magic_mask", "n", "lo", "hi"]).to_pylist()


def _widen(group: dict, row: dict) -> None:
    group["requests"] += row["n"]
    group["lo"] = row["lo"] if group["lo"] is None else min(group["lo"], row["lo"])
    group["hi"] = row["hi"] if group["hi"] is None else max(group["hi"], row["hi"])


def upgrade_versions(aggs: Aggregates, targets: dict) -> list[dict]:
    """Per target and client software: every (api, version) used, with counts, and the target's verdict."""
    groups = collections.defaultdict(lambda: {"requests": 0, "ids": set(), "mask": 0, "lo": None, "hi": None})
    for row in _exchanges(aggs):
        for name, target in targets.items():
            reason = verdict(target, row["api_key"], row["version"], row["magic_mask"])
            group = groups[(name, row["software"], row["software_version"], row["api"], row["api_key"],
                            row["version"], reason)]
            _widen(group, row)
            if row["client_id"] is not None:
                group["ids"].add(row["client_id"])
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
    groups = collections.defaultdict(lambda: {"requests": 0, "ids": set(), "lo": None, "hi": None,
                                              "rejected_requests": 0, "rejected": set()})
    for row in _exchanges(aggs):
        for name, target in targets.items():
            reason = verdict(target, row["api_key"], row["version"], row["magic_mask"])
            group = groups[(name, row["software"], row["software_version"])]
            _widen(group, row)
            if row["client_id"] is not None:
                group["ids"].add(row["client_id"])
            if reason is not None:
                group["rejected_requests"] += row["n"]
                group["rejected"].add(f"{row['api']} v{row['version']}: {reason}")
    addresses = collections.defaultdict(set)
    for row in aggs["addresses"].to_pylist():
        if row["address"] is not None:
            addresses[(row["software"], row["software_version"])].add(row["address"])
    rows = []
    for (name, software, version), g in groups.items():
        ids = sorted(g["ids"])
        # software_version is null for clients that never said: they match null, as a null-safe join does
        seen = addresses.get((software, version))
        listed = sorted(seen) if seen is not None else None
        rows.append({"target": name, "software": software, "software_version": version,
                     "client_ids": ids[:LISTED], "client_id_count": len(ids),
                     "addresses": listed[:LISTED] if listed is not None else None,
                     "address_count": len(listed) if listed is not None else None,
                     "first_seen_us": g["lo"], "last_seen_us": g["hi"], "requests": g["requests"],
                     "rejected_requests": g["rejected_requests"], "rejected": sorted(g["rejected"])[:REJECTED_LISTED]})
    return sorted(rows, key=lambda r: (r["target"], -r["rejected_requests"], r["software"],
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
