"""The client inventory: per connection, who the client is and which (api, version) pairs and record formats it used.

One model for the three places that show it: the proxy's /clients endpoint (fed by
events), `kinspect clients --captures` (fed by capture rows) and `--from` (fed by the
endpoint's JSON). Bounded: at most `max_connections` connections are kept (the least
recently seen is forgotten first), and per connection at most MAX_CLIENT_IDS client ids
and MAX_PAIRS (api, version) pairs; the rest is counted, not kept.

Clients are connections grouped by software name and version, client ids and host:
what an operator asks about before an upgrade ("which of my clients would break").
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from dataclasses import dataclass, field

from kinspect.upgrade.targets import Target, incompatible

UNKNOWN = "unknown"
MAX_CLIENT_IDS = 16
MAX_PAIRS = 256
DEFAULT_MAX_CONNECTIONS = 10000


@dataclass(slots=True)
class ConnectionRecord:
    """What one client connection did, as far as an upgrade is concerned."""

    key: tuple  # (connection id, client address): ids restart with each proxy run
    address: str
    broker: str = ""
    software_name: str | None = None
    software_version: str | None = None
    client_ids: list[str] = field(default_factory=list)
    requests: dict[tuple[int, int], int] = field(default_factory=dict)  # (api key, version) -> count
    magics: dict[tuple[int, int], set[int]] = field(default_factory=dict)  # (api key, version) -> magics seen
    first_seen: float = 0.0  # UTC seconds
    last_seen: float = 0.0
    unsupported_version: int = 0  # responses with error 35 (UNSUPPORTED_VERSION)
    dropped_pairs: int = 0  # requests of pairs past MAX_PAIRS (counted, not kept)

    def note(self, api_key: int, version: int, magics, when: float, client_id: str | None,
             software: tuple[str | None, str | None]) -> None:
        if not self.first_seen or when < self.first_seen:
            self.first_seen = when
        if when > self.last_seen:
            self.last_seen = when
        if software[0] is not None or software[1] is not None:
            self.software_name, self.software_version = software
        if client_id is not None and client_id not in self.client_ids and len(self.client_ids) < MAX_CLIENT_IDS:
            self.client_ids.append(client_id)
        pair = (api_key, version)
        count = self.requests.get(pair)
        if count is None and len(self.requests) >= MAX_PAIRS:
            self.dropped_pairs += 1
            return
        self.requests[pair] = (count or 0) + 1
        if magics:
            self.magics.setdefault(pair, set()).update(magics)

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0] if ":" in self.address else self.address

    def to_json(self, api_name) -> dict:
        return {
            "connection_id": self.key[0],
            "address": self.address,
            "broker": self.broker,
            "software_name": self.software_name,
            "software_version": self.software_version,
            "client_ids": list(self.client_ids),
            "first_seen": _iso(self.first_seen),
            "last_seen": _iso(self.last_seen),
            "requests": [
                {"api_key": k, "api": api_name(k), "version": v, "count": n,
                 "record_magics": sorted(self.magics.get((k, v), ()))}
                for (k, v), n in sorted(self.requests.items())
            ],
            "unsupported_version_responses": self.unsupported_version,
            "dropped_requests": self.dropped_pairs,
        }

    @classmethod
    def from_json(cls, data: dict) -> "ConnectionRecord":
        record = cls((data.get("connection_id"), data.get("address", "")), data.get("address", ""),
                     data.get("broker", ""), data.get("software_name"), data.get("software_version"),
                     list(data.get("client_ids") or ()), first_seen=_epoch(data.get("first_seen")),
                     last_seen=_epoch(data.get("last_seen")),
                     unsupported_version=int(data.get("unsupported_version_responses") or 0),
                     dropped_pairs=int(data.get("dropped_requests") or 0))
        for item in data.get("requests") or ():
            pair = (int(item["api_key"]), int(item["version"]))
            record.requests[pair] = int(item.get("count", 0))
            if item.get("record_magics"):
                record.magics[pair] = {int(m) for m in item["record_magics"]}
        return record


class Inventory:
    """Connection records, least recently seen first; `api_name(key)` names apis for display."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS, api_name=None) -> None:
        self.max_connections = max_connections
        self.api_name = api_name or (lambda key: None)
        # By key, least recently seen first (InventoryObserver looks its requests' records up here directly).
        self._records: OrderedDict[tuple, ConnectionRecord] = OrderedDict()
        self.forgotten = 0  # connections dropped to stay under max_connections

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[ConnectionRecord]:
        return list(self._records.values())

    def record(self, key: tuple, address: str, broker: str = "") -> tuple[ConnectionRecord, bool]:
        """The record of a connection (made if new: then the second value is True)."""
        record = self._records.get(key)
        if record is not None:
            self._records.move_to_end(key)
            return record, False
        record = self._records[key] = ConnectionRecord(key, address, broker)
        while len(self._records) > self.max_connections:
            self._records.popitem(last=False)
            self.forgotten += 1
        return record, True

    def add(self, record: ConnectionRecord) -> None:
        self._records[record.key] = record

    # ------------------------------------------------------------------ reading it

    def to_json(self, targets: list[Target] = ()) -> dict:
        records = self.records()
        return {
            "connections": [r.to_json(self.api_name) for r in records],
            "clients": clients(records, targets, self.api_name),
            "targets": [t.name for t in targets],
            "forgotten_connections": self.forgotten,
        }

    @classmethod
    def from_json(cls, data: dict, api_name=None) -> "Inventory":
        inventory = cls(max_connections=max(DEFAULT_MAX_CONNECTIONS, len(data.get("connections") or ())),
                        api_name=api_name)
        for item in data.get("connections") or ():
            inventory.add(ConnectionRecord.from_json(item))
        inventory.forgotten = int(data.get("forgotten_connections") or 0)
        return inventory

    @classmethod
    def from_rows(cls, rows, api_name=None) -> "Inventory":
        """From capture rows (dicts with the capture schema's columns; v1 rows lack the software and magics)."""
        inventory = cls(max_connections=2**62, api_name=api_name)
        for row in rows:
            address = row.get("client_address") or ""
            record, _ = inventory.record((row.get("connection_id"), address), address, row.get("broker") or "")
            when = row.get("request_time")
            when = when.timestamp() if isinstance(when, dt.datetime) else float(when or 0) / 1e6
            software = (row.get("client_software_name"), row.get("client_software_version"))
            record.note(int(row["api_key"]), int(row["request_version"]), row.get("record_magics") or (), when,
                        row.get("client_id"), software)
            if any(e.get("code") == 35 for e in row.get("error_codes") or ()):
                record.unsupported_version += 1
        return inventory


def software_label(name: str | None) -> str:
    return name if name else UNKNOWN


def clients(records: list[ConnectionRecord], targets: list[Target] = (), api_name=None) -> list[dict]:
    """Connections grouped by (software, software version, client ids, host), with what each target rejects."""
    api_name = api_name or (lambda key: None)
    groups: dict[tuple, list[ConnectionRecord]] = {}
    for r in records:
        key = (software_label(r.software_name), software_label(r.software_version), tuple(sorted(r.client_ids)), r.host)
        groups.setdefault(key, []).append(r)
    out = []
    for (name, version, client_ids, host), members in sorted(groups.items()):
        requests: dict[tuple[int, int], int] = {}
        magics: dict[tuple[int, int], set[int]] = {}
        for r in members:
            for pair, n in r.requests.items():
                requests[pair] = requests.get(pair, 0) + n
            for pair, seen in r.magics.items():
                magics.setdefault(pair, set()).update(seen)
        rejected = {}
        for target in targets:
            rejected[target.name] = [
                {"api_key": k, "api": _name(api_name, target, k), "version": v, "count": n,
                 "reason": reason}
                for (k, v), n in sorted(requests.items())
                if (reason := incompatible(target, k, v, sorted(magics.get((k, v), ())))) is not None
            ]
        out.append({
            "software_name": name,
            "software_version": version,
            "client_ids": list(client_ids),
            "host": host,
            "addresses": sorted({r.address for r in members}),
            "connections": len(members),
            "first_seen": _iso(min(r.first_seen for r in members)),
            "last_seen": _iso(max(r.last_seen for r in members)),
            "requests": [
                {"api_key": k, "api": api_name(k) or str(k), "version": v, "count": n,
                 "record_magics": sorted(magics.get((k, v), ()))}
                for (k, v), n in sorted(requests.items())
            ],
            "unsupported_version_responses": sum(r.unsupported_version for r in members),
            "rejected": rejected,
        })
    return out


def _name(api_name, target: Target, key: int) -> str:
    return api_name(key) or target.api_names.get(key) or str(key)


def _iso(seconds: float) -> str | None:
    if not seconds:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _epoch(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


__all__ = ["ConnectionRecord", "Inventory", "UNKNOWN", "clients", "software_label"]
