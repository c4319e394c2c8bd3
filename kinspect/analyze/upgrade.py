"""Upgrade readiness: which clients (software, version, client ids, addresses) use what a target release rejects.

A target is a plain dict built on the driver and passed into the job:

    {target_name: {"accepted": {api_key: (min_version, max_version)}, "min_record_magic": int}}

`builtin_targets()` builds it from the shipped specs (one target per release); the CLI may
give another (e.g. from kinspect.upgrade.targets.load_target). A request is rejected when
the target has no such api ("api removed"), its version is below the target's lowest
("api version removed") or above its highest ("api version unknown to the target"), or
its record batches carry a magic below the target's `min_record_magic`
("record format v0/v1 removed"). Computed on the driver from the job's `exchanges` and
`addresses` aggregates (kinspect.analyze.aggregates), a verdict per use (software, api,
version, record magics) and target.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kinspect.analyze.groups import Groups, codes, distinct, whole
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


class _Usage:
    """What both upgrade tables group the `exchanges` aggregate by, computed once (numpy over
    packed keys, kinspect.analyze.groups): the client software of its rows (`software`: name
    and version), their uses (`uses`: a (software, api, version, record magics) each, a few
    hundred), and each row's client id as a code (0: none). A verdict depends only on a use's
    api key, version and magics: it is decided once per use and target, not per row."""

    def __init__(self, exchanges: pa.Table):
        e = self.exchanges = exchanges
        self.software = Groups.of([e["software"], e["software_version"]])
        self.uses = Groups.of([self.software.ids, e["api"], e["api_key"], e["version"], e["magic_mask"]])
        self.use_software = self.software.ids[self.uses.first].tolist()
        first = pa.array(self.uses.first)
        self.use = {name: whole(e[name]).take(first).to_pylist()
                    for name in ("api", "api_key", "version", "magic_mask")}
        self.use_n, self.use_lo, self.use_hi = self.uses.sum(e["n"]), self.uses.min(e["lo"]), self.uses.max(e["hi"])
        self.client, self.client_span = codes(e["client_id"])
        # a row of each client id code (any: they name the same id), to read the id's string from
        self.row_of_client = np.zeros(self.client_span, np.int64)
        self.row_of_client[self.client] = np.arange(len(self.client))
        at = pa.array(self.software.first)
        self.names = whole(e["software"]).take(at).to_pylist()
        self.versions = whole(e["software_version"]).take(at).to_pylist()

    def reasons(self, target: dict) -> list:
        """Each use's verdict under `target` (None: accepted)."""
        return [verdict(target, key, version, mask)
                for key, version, mask in zip(self.use["api_key"], self.use["version"], self.use["magic_mask"])]

    def client_ids(self, group_of_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (group, client id) of the rows (null ids left out): each one's group, and
        a row that has it."""
        named = np.flatnonzero(self.client > 0)
        pairs = distinct(group_of_row[named] * self.client_span + self.client[named])
        return pairs // self.client_span, self.row_of_client[pairs % self.client_span]


def _usage(aggs: Aggregates) -> _Usage:
    return shared(aggs, "upgrade usage", lambda: _Usage(aggs["exchanges"]))


def upgrade_versions(aggs: Aggregates, targets: dict) -> list[dict]:
    """Per target and client software: every (api, version) used, with counts, and the target's verdict."""
    usage = _usage(aggs)
    use = usage.use
    masks = np.array(use["magic_mask"], np.int64)
    rows = []
    for target_name, target in targets.items():
        reasons = usage.reasons(target)
        # the uses merged across their record magics: a group per (software, api, api key, version, verdict)
        numbered: dict[tuple, int] = {}
        use_group = np.array([numbered.setdefault((software, api, key, version, reason), len(numbered))
                              for software, api, key, version, reason in
                              zip(usage.use_software, use["api"], use["api_key"], use["version"], reasons)], np.int64)
        merged = Groups(use_group)  # its ids are use_group: numbered in order of appearance
        requests = merged.sum(usage.use_n).to_pylist()
        lo, hi = merged.min(usage.use_lo).to_pylist(), merged.max(usage.use_hi).to_pylist()
        mask = np.zeros(merged.number, np.int64)
        np.bitwise_or.at(mask, use_group, masks)
        group_of_id, _ = usage.client_ids(use_group[usage.uses.ids])
        clients = np.bincount(group_of_id, minlength=merged.number).tolist()
        for (software, api, key, version, reason), g in numbered.items():
            rows.append({"target": target_name, "software": usage.names[software],
                         "software_version": usage.versions[software], "api": api, "api_key": key,
                         "version": version, "requests": requests[g], "client_ids": clients[g],
                         "record_magics": [m for m in range(3) if int(mask[g]) & (1 << m)],
                         "first_seen_us": lo[g], "last_seen_us": hi[g], "rejected": reason})
    return sorted(rows, key=lambda r: (r["target"], r["software"], first(r["software_version"]), r["api"],
                                       r["version"], first(r["rejected"])))


def upgrade_clients(aggs: Aggregates, targets: dict) -> list[dict]:
    """Per target, every client software (name, version): its client ids, addresses, first and
    last seen, its requests, and those the target rejects."""
    usage = _usage(aggs)
    software, e = usage.software, usage.exchanges
    requests = software.sum(e["n"]).to_pylist()
    lo, hi = software.min(e["lo"]).to_pylist(), software.max(e["hi"]).to_pylist()
    of_id, row = usage.client_ids(software.ids)
    ids: list[list] = [[] for _ in range(software.number)]
    for s, client_id in zip(of_id.tolist(), whole(e["client_id"]).take(pa.array(row)).to_pylist()):
        ids[s].append(client_id)
    addresses = (aggs["addresses"].group_by(["software", "software_version"], use_threads=False)
                 .aggregate([("address", "distinct", pc.CountOptions("only_valid"))]).to_pylist())
    # software_version is null for clients that never said: they match null, as a null-safe join does
    listed = {(a["software"], a["software_version"]): sorted(a["address_distinct"]) for a in addresses}
    use_n = usage.use_n.to_pylist()
    out = []
    for target_name, target in targets.items():
        rejected_n = [0] * software.number
        rejected: list[set] = [set() for _ in range(software.number)]
        for s, api, version, reason, n in zip(usage.use_software, usage.use["api"], usage.use["version"],
                                              usage.reasons(target), use_n):
            if reason is not None:
                rejected_n[s] += n
                rejected[s].add(f"{api} v{version}: {reason}")
        for s in range(software.number):
            names = sorted(ids[s])
            seen = listed.get((usage.names[s], usage.versions[s]))
            out.append({"target": target_name, "software": usage.names[s], "software_version": usage.versions[s],
                        "client_ids": names[:LISTED], "client_id_count": len(names),
                        "addresses": seen[:LISTED] if seen is not None else None,
                        "address_count": len(seen) if seen is not None else None,
                        "first_seen_us": lo[s], "last_seen_us": hi[s], "requests": requests[s],
                        "rejected_requests": rejected_n[s], "rejected": sorted(rejected[s])[:REJECTED_LISTED]})
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
