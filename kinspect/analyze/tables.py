"""The report's tables, each derived on the driver from the job's aggregates (kinspect.analyze.aggregates), never from the captures.

The aggregates are small (a row per distinct key, not per exchange): Spark computes them
and the driver holds them as pyarrow Tables; each table here is a few vectorised Arrow
or numpy steps over them, and a sort of its (few) rows.

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

import threading
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kinspect.analyze.groups import sorted_keys
from kinspect.analyze.partials import LATENCY, REQUEST



class Aggregates(dict):
    """name -> aggregate (kinspect.analyze.aggregates), and what several tables derive from
    them, computed once for all (`shared`), whichever thread asks first: the job hands the
    tables one of these."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.derived: dict = {}
        self.locks: dict[str, threading.Lock] = {}
        self.guard = threading.Lock()


def shared(aggs: dict, key: str, make: Callable[[], object]):
    """make(), computed once per Aggregates (each time for a plain dict of aggregates); a
    thread asking while another computes it waits for that one."""
    if not isinstance(aggs, Aggregates):
        return make()
    with aggs.guard:
        lock = aggs.locks.setdefault(key, threading.Lock())
    with lock:
        if key not in aggs.derived:
            aggs.derived[key] = make()
        return aggs.derived[key]

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
OTHER = "(other)"
_I32, _I64, _F64, _STR, _BOOL = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()


def _schema(*fields) -> pa.Schema:
    return pa.schema([pa.field(name, kind) for name, kind in fields])


def first(value):
    """A sort key putting None first, as Spark's ascending order does."""
    return (value is not None, value if value is not None else "")


def _rows(table: pa.Table, columns: list[str]) -> list[dict]:
    return table.select(columns).to_pylist()


def _sum(table: pa.Table, column: str):
    return pc.sum(table[column]).as_py() if table.num_rows else None


def summary(aggs: Aggregates, top: int) -> list[dict]:
    e = aggs["exchanges"]
    client_ids = pc.drop_null(e["client_id"])
    return [{
        "exchanges": _sum(e, "n"), "responses": _sum(e, "responses"),
        "first_request_us": pc.min(e["lo"]).as_py(), "last_request_us": pc.max(e["hi"]).as_py(),
        "request_bytes": _sum(e, "request_bytes"), "response_bytes": _sum(e, "response_bytes"),
        "apis": len(pc.unique(e["api"])), "client_ids": len(pc.unique(client_ids)),
        "request_decode_errors": _sum(e, "request_decode_errors"),
        "response_decode_errors": _sum(e, "response_decode_errors"),
        "requests_not_inspected": _sum(e, "requests_not_inspected"),
        "min_schema_version": pc.min(e["schema_version"]).as_py(),
        "max_schema_version": pc.max(e["schema_version"]).as_py()}]


def _ranks(column) -> np.ndarray:
    """Each value's rank in the sorted distinct values of `column` (nulls first, rank 0): an
    integer sort key that orders strings as Spark does, without comparing strings per row."""
    return _ranked_values(column)[0]


def _ranked_values(column) -> tuple[np.ndarray, pa.Array]:
    """`_ranks` of `column`, and its distinct non-null values in rank order (rank r: [r - 1])."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if (pa.types.is_signed_integer(kind) or pa.types.is_unsigned_integer(kind) and kind.bit_width < 64) \
            and len(column) > column.null_count:
        low, high = (value.as_py() for value in pc.min_max(column).values())
        if high - low < 1 << 16:  # versions, directions: ranked by a table of the range, not hashed and sorted
            offset = pc.fill_null(column, low).to_numpy().astype(np.int64) - low
            present = np.zeros(high - low + 1, np.int64)
            present[offset] = 1
            rank = np.cumsum(present)  # the rank of each present value, 1 for the lowest
            valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
            ranks = np.where(valid, rank[offset], 0)
            return ranks, pa.array(np.flatnonzero(present) + low, column.type)
    if pa.types.is_dictionary(column.type) and (column.dictionary.null_count or
                                                len(pc.unique(column.dictionary)) != len(column.dictionary)):
        column = column.cast(column.type.value_type)  # a value twice in the dictionary: one rank for both
    encoded = pc.dictionary_encode(column)  # a dictionary column (of distinct values) stays as it is
    order = pc.array_sort_indices(encoded.dictionary).to_numpy()
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(1, len(order) + 1)
    indices = encoded.indices
    ranks = np.where(pc.is_null(indices).to_numpy(zero_copy_only=False), 0,
                     rank[pc.fill_null(indices, 0).to_numpy()] if len(order) else 0)
    return ranks, encoded.dictionary.take(pa.array(order))


def _ranked(values: pa.Table, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order of `values` (rows of v and its count n) by keys then v; the start and end of
    each group of keys in that order."""
    if not values.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _runs([_ranks(values[k]) for k in keys], values["v"].to_numpy())


def _runs(ranks: list[np.ndarray], v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order of rows by their ranks then v (`_order`), and the start and end of each run
    of equal ranks in it."""
    order = _order(ranks, v)
    change = np.zeros(len(order), bool)
    change[0] = True
    for rank in ranks:
        ranked = rank[order]
        change[1:] |= ranked[1:] != ranked[:-1]
    starts = np.flatnonzero(change)
    return order, starts, np.append(starts[1:], len(order))


def _order(ranks: list[np.ndarray], v: np.ndarray) -> np.ndarray:
    """Rows sorted by their ranks (the first sorts first), then v: the ranks and v packed into
    one int64 when they fit (one argsort, several times faster than np.lexsort of them), else
    np.lexsort. Rows with equal ranks and v may come in any order: they are the same value."""
    low = int(v.min())
    spans = [int(rank.max()) + 1 for rank in ranks] + [int(v.max()) - low + 1]
    if np.prod([float(span) for span in spans]) >= 2.0 ** 62:
        return np.lexsort([v] + ranks[::-1])  # the last key given sorts first
    key = np.zeros(len(v), np.int64)
    for column, span in zip(ranks + [v - low], spans):
        key = key * span + column
    return np.argsort(key)


def _percentiles(v: np.ndarray, n: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 scale: float | None) -> dict[str, list]:
    """Per run [start, end) of the values `v` (sorted within each run) with their counts `n`:
    count, exact nearest-rank percentiles, max and sum (of the unscaled values)."""
    running = np.cumsum(n)
    before = np.where(starts > 0, running[starts - 1], 0)
    total = running[ends - 1] - before
    out = {"count": total.tolist()}
    for name, p in PERCENTILES:
        rank = np.maximum(1, np.ceil(p * total.astype(np.float64))).astype(np.int64)
        at = np.searchsorted(running, before + rank, side="left")
        out[name] = (v[at] / scale).tolist() if scale else v[at].tolist()
    out["max"] = ((v[ends - 1] / scale).tolist() if scale else v[ends - 1].tolist())
    weighted = np.cumsum(v * n)  # the runs need not cover v: each sum is its own difference
    out["sum"] = (weighted[ends - 1] - np.where(starts > 0, weighted[starts - 1], 0)).tolist()
    return out


def _percentile_table(values: pa.Table, keys: list[str], scale: float | None) -> list[dict]:
    """Per group of keys: count, exact nearest-rank percentiles of v (weighted by n), max, sum."""
    order, starts, ends = _ranked(values, keys)
    if not len(starts):
        return []
    firsts = pa.array(order[starts])
    out = {k: values[k].take(firsts).to_pylist() for k in keys}
    out |= _percentiles(values["v"].to_numpy()[order], values["n"].to_numpy()[order], starts, ends, scale)
    names = list(out)
    return [dict(zip(names, row)) for row in zip(*out.values())]


def _sorted_values(aggs: Aggregates) -> dict:
    """The `values` aggregate sorted once for api_sizes and latency: the sizes, then the
    latencies, each by api, direction (request before response, as their names), version
    and v. Returns each sorted row's v and count n, the runs of equal (api, direction,
    version) in that order (a latency's version is null: its runs are per api), and each
    run's api, direction and version."""
    values = aggs["values"]
    api, api_names = shared(aggs, "api ranks", lambda: _ranked_values(values["api"]))
    version, versions = _ranked_values(values["version"])
    direction = values["direction"].to_numpy().astype(np.int64)
    ranks = [(direction == LATENCY).astype(np.int64), api, direction, version]
    v, n = values["v"].to_numpy(), values["n"].to_numpy()
    if not len(v):
        return {"v": v, "n": n, "starts": np.zeros(0, np.int64), "ends": np.zeros(0, np.int64),
                "api": [], "direction": np.zeros(0, np.int64), "version": []}
    spans = [int(rank.max()) + 1 for rank in ranks]
    v_low, n_low = int(v.min()), int(n.min())
    v_span, n_span = int(v.max()) - v_low + 1, int(n.max()) - n_low + 1
    group = np.zeros(len(v), np.int64)
    if np.prod([float(span) for span in spans + [v_span, n_span]]) < 2.0 ** 62:
        # ranks, v and n packed into one int64 and sorted as values (numpy's sort is about
        # twice as fast as its argsort, and nothing is gathered after it; a radix sort where
        # built): n only orders rows of equal ranks and v, which the aggregate does not hold
        for column, span in zip(ranks, spans):
            group = group * span + column
        key, n = np.divmod(sorted_keys((group * v_span + (v - v_low)) * n_span + (n - n_low)), n_span)
        group, v = np.divmod(key, v_span)
        v, n = v + v_low, n + n_low
    else:
        order = _order(ranks, v)
        for rank, span in zip(ranks, spans):
            group = group * span + rank[order]
        v, n = v[order], n[order]
    change = np.ones(len(group), bool)
    change[1:] = group[1:] != group[:-1]
    starts = np.flatnonzero(change)
    rest, version_rank = np.divmod(group[starts], spans[3])
    rest, run_direction = np.divmod(rest, spans[2])
    api_rank = rest % spans[1]
    api_names, versions = api_names.to_pylist(), versions.to_pylist()
    return {"v": v, "n": n, "starts": starts, "ends": np.append(starts[1:], len(group)),
            "api": [api_names[r - 1] for r in api_rank.tolist()], "direction": run_direction,
            "version": [versions[r - 1] if r else None for r in version_rank.tolist()]}


def _values_table(aggs: Aggregates, latencies: bool, scale: float | None) -> list[dict]:
    """api_sizes' rows (api, direction, version and the figures of its sizes), or with
    `latencies` latency's (api and the figures of its latencies)."""
    runs = shared(aggs, "sorted values", lambda: _sorted_values(aggs))
    chosen = np.flatnonzero((runs["direction"] == LATENCY) if latencies else (runs["direction"] != LATENCY))
    if not len(chosen):
        return []
    out = {"api": [runs["api"][i] for i in chosen.tolist()]}
    if not latencies:
        out["direction"] = ["request" if d == REQUEST else "response" for d in runs["direction"][chosen].tolist()]
        out["version"] = [runs["version"][i] for i in chosen.tolist()]
    out |= _percentiles(runs["v"], runs["n"], runs["starts"][chosen], runs["ends"][chosen], scale)
    names = list(out)
    return [dict(zip(names, row)) for row in zip(*out.values())]


def api_sizes(aggs: Aggregates, top: int) -> list[dict]:
    return _values_table(aggs, False, None)


def size_histogram(aggs: Aggregates, top: int) -> list[dict]:
    """Counts per api, direction and power-of-two bucket, summed by one np.bincount of the
    three packed into one code (the api by its rank: the rows come out in table order)."""
    values = aggs["values"]
    direction = values["direction"].to_numpy()
    sizes = np.flatnonzero(direction != LATENCY)
    if not len(sizes):
        return []
    api, names = shared(aggs, "api ranks", lambda: _ranked_values(values["api"]))
    # the exact power of two at or below each size (bucket k: [2^k, 2^(k+1))), integers only
    powers = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))
    bucket = np.maximum(np.searchsorted(powers, values["v"].to_numpy(zero_copy_only=False)[sizes], side="right") - 1,
                        0)
    code = (api[sizes] * 2 + direction[sizes]) * 64 + bucket
    counts = np.bincount(code, weights=values["n"].to_numpy()[sizes])
    present = np.flatnonzero(counts)
    names = names.to_pylist()
    return [{"api": names[c // 128 - 1], "direction": "request" if c // 64 % 2 == REQUEST else "response",
             "bucket": c % 64, "min_bytes": 1 << (c % 64), "count": int(counts[c])} for c in present.tolist()]


def _top_with_other(rows: list[dict], key: str, top: int) -> list[dict]:
    """The top `top` rows by bytes, then one row summing the rest (if any), named OTHER."""
    for r in rows:
        r["bytes"] = r["request_bytes"] + r["response_bytes"]
        r["grouped"] = 1
    rows.sort(key=lambda r: (-r["bytes"], first(r[key])))
    columns = [key, "exchanges", "request_bytes", "response_bytes", "bytes", "grouped"]
    head = [{c: r[c] for c in columns} for r in rows[:top]]
    rest = rows[top:]
    if rest:
        head.append({key: OTHER, **{c: sum(r[c] for r in rest) for c in columns[1:5]}, "grouped": len(rest)})
    return head


def top_clients(aggs: Aggregates, top: int) -> list[dict]:
    per_client = (aggs["exchanges"].group_by("client_id", use_threads=False)
                  .aggregate([("n", "sum"), ("request_bytes", "sum"), ("response_bytes", "sum")]))
    rows = [{"client_id": r["client_id"], "exchanges": r["n_sum"], "request_bytes": r["request_bytes_sum"],
             "response_bytes": r["response_bytes_sum"]} for r in per_client.to_pylist()]
    return _top_with_other(rows, "client_id", top)


def top_topics(aggs: Aggregates, top: int) -> list[dict]:
    return _top_with_other(aggs["topics"].to_pylist(), "topic", top)


def tagged_fields(aggs: Aggregates, top: int) -> list[dict]:
    rows = _rows(aggs["tags"], ["location", "api", "path", "tag", "name", "known", "count", "bytes"])
    return sorted(rows, key=lambda r: (r["location"], r["api"], r["path"], r["tag"], first(r["name"])))


def _saved_pct(saved: int, total: int):
    return saved * 100.0 / total if total > 0 else None


def kip482_savings(aggs: Aggregates, top: int) -> list[dict]:
    e = aggs["exchanges"]
    sides = []
    for direction, version, prefix in (("request", "version", "kip_request"),
                                       ("response", "response_version", "kip_response")):
        # only the side's columns filtered: filtering all 27 of the aggregate's took 60% of this table's time
        side = e.select(["api", version, "first_flexible_version", f"{prefix}s", f"{prefix}_bytes",
                         f"{prefix}_compact"]).filter(pc.greater(e[f"{prefix}s"], 0))
        sides.append(pa.table({"api": side["api"], "direction": pa.repeat(pa.scalar(direction, _STR), side.num_rows),
                               "version": side[version], "compact_version": side["first_flexible_version"],
                               "n": side[f"{prefix}s"], "today": side[f"{prefix}_bytes"],
                               "compact": side[f"{prefix}_compact"]}))
    grouped = (pa.concat_tables(sides).group_by(["api", "direction", "version", "compact_version"], use_threads=False)
               .aggregate([("n", "sum"), ("today", "sum"), ("compact", "sum")]))
    rows = [{"api": r["api"], "direction": r["direction"], "version": r["version"],
             "compact_version": r["compact_version"], "count": r["n_sum"], "bytes_today": r["today_sum"],
             "bytes_compact": r["compact_sum"], "saved": r["today_sum"] - r["compact_sum"],
             "saved_pct": _saved_pct(r["today_sum"] - r["compact_sum"], r["today_sum"])} for r in grouped.to_pylist()]
    return sorted(rows, key=lambda r: (r["api"], r["direction"], first(r["version"])))


def varint_savings(aggs: Aggregates, top: int) -> list[dict]:
    rows = _rows(aggs["integers"], ["api", "location", "path", "type", "exchanges", "count", "fixed_bytes",
                                     "packed_bytes", "upacked_bytes"])
    for r in rows:
        fixed, packed, upacked = r["fixed_bytes"], r["packed_bytes"], r["upacked_bytes"]
        best = min(fixed, packed, upacked)
        r["best_bytes"] = best
        # ties go to the simpler encoding: fixed, then packed
        r["best"] = "fixed" if best == fixed else "packed" if best == packed else "upacked"
        r["saved_pct"] = (fixed - best) * 100.0 / fixed if fixed > 0 else None
    return sorted(rows, key=lambda r: (r["api"], r["location"], r["path"]))


def varint_histogram(aggs: Aggregates, top: int) -> list[dict]:
    rows = []
    for r in aggs["integers"].to_pylist():
        for encoding in ("unsigned", "zigzag"):
            for i in range(1, 11):
                count = r[f"{encoding[0]}{i}"]
                if count is not None and count > 0:
                    rows.append({"api": r["api"], "location": r["location"], "path": r["path"], "type": r["type"],
                                 "encoding": encoding, "bytes": i, "count": count})
    return sorted(rows, key=lambda r: (r["api"], r["location"], r["path"], r["encoding"], r["bytes"]))


def latency(aggs: Aggregates, top: int) -> list[dict]:
    rows = _values_table(aggs, True, 1000.0)
    return [{"api": r["api"], "count": r["count"], **{f"{name}_ms": r[name] for name, _ in PERCENTILES},
             "max_ms": r["max"]} for r in rows]


def error_codes(aggs: Aggregates, top: int) -> list[dict]:
    rows = _rows(aggs["errors"], ["api", "code", "name", "count", "exchanges"])
    return sorted(rows, key=lambda r: (r["api"], -r["count"], r["code"]))


# name -> (function, one-line description, Arrow schema of its rows), in report order
TABLES: dict[str, tuple[Callable[[Aggregates, int], list[dict]], str, pa.Schema]] = {
    "summary": (summary, "exchanges, bytes, time range and decode problems of the whole capture", _schema(
        ("exchanges", _I64), ("responses", _I64), ("first_request_us", _I64), ("last_request_us", _I64),
        ("request_bytes", _I64), ("response_bytes", _I64), ("apis", _I64), ("client_ids", _I64),
        ("request_decode_errors", _I64), ("response_decode_errors", _I64), ("requests_not_inspected", _I64),
        ("min_schema_version", _I32), ("max_schema_version", _I32))),
    "api_sizes": (api_sizes, "message sizes per api, direction and version: count, p50, p90, p99, max, sum", _schema(
        ("api", _STR), ("direction", _STR), ("version", _I32), ("count", _I64), ("p50", _I64), ("p90", _I64),
        ("p99", _I64), ("max", _I64), ("sum", _I64))),
    "size_histogram": (size_histogram, "message sizes per api and direction in power-of-two buckets", _schema(
        ("api", _STR), ("direction", _STR), ("bucket", _I32), ("min_bytes", _I64), ("count", _I64))),
    "top_clients": (top_clients, "client ids by request + response bytes, the rest summed as (other)", _schema(
        ("client_id", _STR), ("exchanges", _I64), ("request_bytes", _I64), ("response_bytes", _I64),
        ("bytes", _I64), ("grouped", _I64))),
    "top_topics": (top_topics, "topics by bytes of the exchanges that name them, the rest summed as (other)",
                   _schema(("topic", _STR), ("exchanges", _I64), ("request_bytes", _I64), ("response_bytes", _I64),
                           ("bytes", _I64), ("grouped", _I64))),
    "tagged_fields": (tagged_fields, "KIP-482 tagged fields seen: where, which tag, how often, how many bytes",
                      _schema(("location", _STR), ("api", _STR), ("path", _STR), ("tag", _I32), ("name", _STR),
                              ("known", _BOOL), ("count", _I64), ("bytes", _I64))),
    "kip482_savings": (kip482_savings, "non-flexible messages: bytes today vs at the first flexible version",
                       _schema(("api", _STR), ("direction", _STR), ("version", _I32), ("compact_version", _I32),
                               ("count", _I64), ("bytes_today", _I64), ("bytes_compact", _I64), ("saved", _I64),
                               ("saved_pct", _F64))),
    "varint_savings": (varint_savings, "integer fields: bytes fixed today vs packed (zig-zag) vs upacked varints",
                       _schema(("api", _STR), ("location", _STR), ("path", _STR), ("type", _STR),
                               ("exchanges", _I64), ("count", _I64), ("fixed_bytes", _I64), ("packed_bytes", _I64),
                               ("upacked_bytes", _I64), ("best_bytes", _I64), ("best", _STR),
                               ("saved_pct", _F64))),
    "varint_histogram": (varint_histogram, "integer values by the bytes their varint takes, per field and encoding",
                         _schema(("api", _STR), ("location", _STR), ("path", _STR), ("type", _STR),
                                 ("encoding", _STR), ("bytes", _I32), ("count", _I64))),
    "latency": (latency, "request to response latency per api, milliseconds", _schema(
        ("api", _STR), ("count", _I64), ("p50_ms", _F64), ("p90_ms", _F64), ("p99_ms", _F64), ("max_ms", _F64))),
    "error_codes": (error_codes, "non-zero error codes per api (nested ones included)", _schema(
        ("api", _STR), ("code", _I32), ("name", _STR), ("count", _I64), ("exchanges", _I64))),
}
