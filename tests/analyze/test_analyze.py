"""The analyze job's tables against a plain-Python computation of the same figures from the same files.

Generated captures (tests/support/sample_data.py: several files in two directories, every
api shape, nulls, acks=0 rows, tagged and integer fields, error codes) are analyzed once
on the test run's SparkSession; every table is then recomputed here with pyarrow and plain
loops, and the two must agree row for row and value for value. The input checks, the
CLI end to end (one subprocess with its own Spark) and the written files are tested too.
"""

from __future__ import annotations

import collections
import csv
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kinspect.analyze.inputs import AnalyzeInputError, check_inputs, check_java
from kinspect.analyze.job import analyze, compute
from kinspect.analyze.upgrade import builtin_targets
from tests.support.sample_data import write_captures
from kinspect.capture.schema import METADATA_VERSION_KEY, SCHEMA_VERSION, arrow_schema
from tests.support.paths import ROOT

TOP = 5  # fewer than the generated clients and topics, so the cut is tested
TARGETS = builtin_targets()  # one per release of the shipped specs (3.9.2, 4.3.1)


# ----------------------------------------------------------------------------- the plain-Python side


def read_rows(dirs: list[Path]) -> list[dict]:
    rows = []
    for d in dirs:
        for file in sorted(d.glob("capture-*.parquet")):
            rows.extend(pq.read_table(file).to_pylist())
    return rows


def nearest_rank(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def api_of(row: dict) -> str:
    return row["api_name"] if row["api_name"] is not None else f"api_{row['api_key']}"


def messages(rows: list[dict]):
    """(api, direction, version, size) of every request and response."""
    for r in rows:
        yield api_of(r), "request", r["request_version"], r["request_size"]
        if r["response_size"] is not None:
            version = r["response_version"] if r["response_version"] is not None else r["request_version"]
            yield api_of(r), "response", version, r["response_size"]


def by_bytes(groups: dict, key: str, top: int) -> list[dict]:
    """The top rows by bytes, then one "(other)" row summing the rest."""
    out = [{key: k, "exchanges": v[0], "request_bytes": v[1], "response_bytes": v[2], "bytes": v[1] + v[2],
            "grouped": 1} for k, v in groups.items()]
    out.sort(key=lambda r: (-r["bytes"], r[key] is not None, r[key] or ""))
    rest = out[top:]
    if rest:
        other = {key: "(other)", "grouped": len(rest)}
        for column in ("exchanges", "request_bytes", "response_bytes", "bytes"):
            other[column] = sum(r[column] for r in rest)
        return out[:top] + [other]
    return out


def pct(saved: int, total: int):
    return saved * 100.0 / total if total > 0 else None


def reference(rows: list[dict], top: int) -> dict[str, list[dict]]:
    t = {}
    epoch_us = [int(r["request_time"].timestamp()) * 1_000_000 + r["request_time"].microsecond for r in rows]
    t["summary"] = [{
        "exchanges": len(rows), "responses": sum(r["response_size"] is not None for r in rows),
        "first_request_us": min(epoch_us), "last_request_us": max(epoch_us),
        "request_bytes": sum(r["request_size"] for r in rows),
        "response_bytes": sum(r["response_size"] or 0 for r in rows),
        "apis": len({api_of(r) for r in rows}),
        "client_ids": len({r["client_id"] for r in rows if r["client_id"] is not None}),
        "request_decode_errors": sum(r["request_decode_error"] is not None for r in rows),
        "response_decode_errors": sum(r["response_decode_error"] is not None for r in rows),
        "requests_not_inspected": sum(not r["request_inspected"] for r in rows),
        "min_schema_version": min(r["schema_version"] for r in rows),
        "max_schema_version": max(r["schema_version"] for r in rows),
    }]

    sizes = collections.defaultdict(list)
    histogram = collections.Counter()
    for api, direction, version, size in messages(rows):
        sizes[(api, direction, version)].append(size)
        histogram[(api, direction, size.bit_length() - 1)] += 1
    t["api_sizes"] = [{"api": a, "direction": d, "version": v, "count": len(s),
                       "p50": nearest_rank(s, 0.5), "p90": nearest_rank(s, 0.9), "p99": nearest_rank(s, 0.99),
                       "max": max(s), "sum": sum(s)} for (a, d, v), s in sorted(sizes.items())]
    t["size_histogram"] = [{"api": a, "direction": d, "bucket": b, "min_bytes": 1 << b, "count": n}
                           for (a, d, b), n in sorted(histogram.items())]

    clients = collections.defaultdict(lambda: [0, 0, 0])
    topics = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        keys = [clients[r["client_id"]]] + [topics[name] for name in {tp["topic"] for tp in r["topic_partitions"]}]
        for k in keys:
            k[0] += 1
            k[1] += r["request_size"]
            k[2] += r["response_size"] or 0
    t["top_clients"] = by_bytes(clients, "client_id", top)
    t["top_topics"] = by_bytes(topics, "topic", top)

    tags = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        for f in r["tagged_fields"]:
            k = tags[(f["location"], api_of(r), f["path"], f["tag"], f["name"], f["known"])]
            k[0] += 1
            k[1] += f["size"]
    t["tagged_fields"] = [{"location": k[0], "api": k[1], "path": k[2], "tag": k[3], "name": k[4], "known": k[5],
                           "count": v[0], "bytes": v[1]}
                          for k, v in sorted(tags.items(), key=lambda kv: (kv[0][:4], kv[0][4] is not None,
                                                                             kv[0][4] or ""))]

    kip = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        if r["flexible"] or r["first_flexible_version"] is None:
            continue
        if r["request_compact_size"] is not None:
            k = kip[(api_of(r), "request", r["request_version"], r["first_flexible_version"])]
            k[0] += 1
            k[1] += r["request_size"]
            k[2] += r["request_compact_size"]
        if r["response_compact_size"] is not None and r["response_size"] is not None:
            version = r["response_version"] if r["response_version"] is not None else r["request_version"]
            k = kip[(api_of(r), "response", version, r["first_flexible_version"])]
            k[0] += 1
            k[1] += r["response_size"]
            k[2] += r["response_compact_size"]
    t["kip482_savings"] = [{"api": a, "direction": d, "version": v, "compact_version": c, "count": n,
                            "bytes_today": today, "bytes_compact": compact, "saved": today - compact,
                            "saved_pct": pct(today - compact, today)}
                           for (a, d, v, c), (n, today, compact) in sorted(kip.items())]

    fields = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    hist = collections.Counter()
    for r in rows:
        for f in r["integer_fields"]:
            key = (api_of(r), f["location"], f["path"], f["type"])
            k = fields[key]
            for i, n in enumerate((1, f["count"], f["fixed_bytes"], f["zigzag_bytes"], f["uvarint_bytes"])):
                k[i] += n
            for encoding, counts in (("unsigned", f["uvarint_hist"]), ("zigzag", f["zigzag_hist"])):
                for slot, n in enumerate(counts):
                    if n > 0:
                        hist[(*key, encoding, slot + 1)] += n
    t["varint_savings"] = []
    for (a, loc, path, kind), (exchanges, count, fixed, packed, upacked) in sorted(fields.items()):
        best = min(fixed, packed, upacked)
        name = "fixed" if best == fixed else "packed" if best == packed else "upacked"
        t["varint_savings"].append({"api": a, "location": loc, "path": path, "type": kind, "exchanges": exchanges,
                                    "count": count, "fixed_bytes": fixed, "packed_bytes": packed,
                                    "upacked_bytes": upacked, "best_bytes": best, "best": name,
                                    "saved_pct": pct(fixed - best, fixed)})
    t["varint_histogram"] = [{"api": a, "location": loc, "path": p, "type": ty, "encoding": e, "bytes": b, "count": n}
                             for (a, loc, p, ty, e, b), n in sorted(hist.items(),
                                                                    key=lambda kv: (kv[0][:3], kv[0][4], kv[0][5]))]

    latencies = collections.defaultdict(list)
    for r in rows:
        if r["latency_us"] is not None:
            latencies[api_of(r)].append(r["latency_us"])
    t["latency"] = [{"api": a, "count": len(v), "p50_ms": nearest_rank(v, 0.5) / 1000.0,
                     "p90_ms": nearest_rank(v, 0.9) / 1000.0, "p99_ms": nearest_rank(v, 0.99) / 1000.0,
                     "max_ms": max(v) / 1000.0} for a, v in sorted(latencies.items())]

    errors = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        for e in r["error_codes"]:
            k = errors[(api_of(r), e["code"], e["name"])]
            k[0] += e["count"]
            k[1] += 1
    t["error_codes"] = [{"api": a, "code": c, "name": n, "count": v[0], "exchanges": v[1]}
                        for (a, c, n), v in sorted(errors.items(), key=lambda kv: (kv[0][0], -kv[1][0], kv[0][1]))]
    t.update(upgrade_reference(rows, TARGETS))
    return t


def verdict(target: dict, api_key: int, version: int, magics: list[int]) -> str | None:
    accepted = target["accepted"].get(api_key)
    if accepted is None:
        return "api removed"
    if version < accepted[0]:
        return "api version removed"
    if version > accepted[1]:
        return "api version unknown to the target"
    if any(m < target["min_record_magic"] for m in magics):
        return "record format v0/v1 removed"
    return None


def upgrade_reference(rows: list[dict], targets: dict) -> dict[str, list[dict]]:
    versions = collections.defaultdict(lambda: {"requests": 0, "ids": set(), "magics": set(), "lo": None, "hi": None})
    clients = collections.defaultdict(lambda: {"ids": set(), "addresses": set(), "lo": None, "hi": None,
                                               "requests": 0, "rejected_requests": 0, "rejected": set()})
    for r in rows:
        software = r.get("client_software_name") or "unknown"
        software_version = r.get("client_software_version")
        magics = r.get("record_magics") or []
        t_us = int(r["request_time"].timestamp()) * 1_000_000 + r["request_time"].microsecond
        for name, target in targets.items():
            reason = verdict(target, r["api_key"], r["request_version"], magics)
            v = versions[(name, software, software_version, api_of(r), r["api_key"], r["request_version"], reason)]
            c = clients[(name, software, software_version)]
            for g in (v, c):
                g["requests"] += 1
                g["lo"] = t_us if g["lo"] is None else min(g["lo"], t_us)
                g["hi"] = t_us if g["hi"] is None else max(g["hi"], t_us)
            if r["client_id"] is not None:
                v["ids"].add(r["client_id"])
                c["ids"].add(r["client_id"])
            v["magics"].update(magics)
            c["addresses"].add(r["client_address"])
            if reason:
                c["rejected_requests"] += 1
                c["rejected"].add(f"{api_of(r)} v{r['request_version']}: {reason}")
    out = {"upgrade_versions": [
        {"target": k[0], "software": k[1], "software_version": k[2], "api": k[3], "api_key": k[4], "version": k[5],
         "requests": v["requests"], "client_ids": len(v["ids"]), "record_magics": sorted(v["magics"]),
         "first_seen_us": v["lo"], "last_seen_us": v["hi"], "rejected": k[6]}
        for k, v in sorted(versions.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] is not None,
                                                              kv[0][2] or "", kv[0][3], kv[0][5],
                                                              kv[0][6] is not None, kv[0][6] or ""))]}
    out["upgrade_clients"] = [
        {"target": k[0], "software": k[1], "software_version": k[2], "client_ids": sorted(c["ids"])[:20],
         "client_id_count": len(c["ids"]), "addresses": sorted(c["addresses"])[:20],
         "address_count": len(c["addresses"]), "first_seen_us": c["lo"], "last_seen_us": c["hi"],
         "requests": c["requests"], "rejected_requests": c["rejected_requests"],
         "rejected": sorted(c["rejected"])[:50]}
        for k, c in sorted(clients.items(), key=lambda kv: (kv[0][0], -kv[1]["rejected_requests"], kv[0][1],
                                                             kv[0][2] is not None, kv[0][2] or ""))]
    return out


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[list[Path], Path]:
    base = tmp_path_factory.mktemp("captures")
    first, second = base / "run-a", base / "run-b"
    write_captures(first, 4000, files=3, seed=7)
    write_captures(second, 700, files=2, seed=8, v2=False)  # files without the client software columns
    # what a capture directory may also hold and the job must skip: a file being written,
    # and Parquet that is not a capture file
    (first / "capture-00009.parquet.tmp").write_bytes(b"PAR1 half written")
    pq.write_table(pa.table({"x": [1, 2, 3]}), first / "notes.parquet")
    return [first, second], base / "report"


@pytest.fixture(scope="module")
def analyzed(spark, generated):
    dirs, out = generated
    lines = []
    # driver_rows=0: Spark's read tasks, as on a cluster or for a large capture, even for these few rows
    result = analyze(spark, [str(d) for d in dirs], str(out), top=TOP, progress=lines.append, targets=TARGETS,
                     driver_rows=0)
    return result, reference(read_rows(dirs), TOP), lines


# ----------------------------------------------------------------------------- the tables


TABLE_NAMES = ("summary", "api_sizes", "size_histogram", "top_clients", "top_topics", "tagged_fields",
               "kip482_savings", "varint_savings", "varint_histogram", "latency", "error_codes",
               "upgrade_clients", "upgrade_versions")


@pytest.mark.integration
@pytest.mark.parametrize("name", TABLE_NAMES)
def test_table_matches_plain_python(analyzed, name):
    result, want, _ = analyzed
    got = result.tables[name]
    assert got, f"{name} is empty: the generated captures should fill every table"
    assert got == want[name]


@pytest.mark.integration
def test_read_on_the_driver_gives_the_same_tables(spark, analyzed, generated):
    """A small local capture is read and grouped in the driver's process (no Python workers):
    the same tables as Spark's read tasks, which `analyzed` used."""
    result, _, lines = analyzed
    assert any("read tasks" in line for line in lines)
    dirs, _ = generated
    said = []
    on_driver = compute(spark, [str(d) for d in dirs], top=TOP, targets=TARGETS, progress=said.append)
    assert any("read on the driver" in line for line in said)
    assert on_driver.tables == result.tables


@pytest.mark.integration
def test_tasks_reading_several_pieces_give_the_same_tables(spark, analyzed, generated, monkeypatch):
    """One read task per core (WAVES 1): each task reads a bin of several pieces in turn. The
    same tables as a task per piece."""
    from kinspect.analyze import scan

    result, _, _ = analyzed
    dirs, _ = generated
    monkeypatch.setattr(scan, "WAVES", 1)
    said = []
    binned = compute(spark, [str(d) for d in dirs], top=TOP, targets=TARGETS, progress=said.append, driver_rows=0)
    assert any(f"{spark.sparkContext.defaultParallelism} read tasks" in line for line in said)
    assert binned.tables == result.tables


@pytest.mark.integration
def test_partial_rows_shuffled_give_the_same_tables(spark, analyzed, generated, monkeypatch):
    """On a local master the read tasks hand their partial rows to the merging tasks through local files
    (kinspect.analyze.handoff), which `analyzed` used; through Spark's shuffle, as on a cluster, the same tables."""
    from kinspect.analyze import handoff

    result, _, lines = analyzed
    assert any("partial rows through local files" in line for line in lines)
    dirs, _ = generated
    monkeypatch.setattr(handoff, "local_master", lambda spark: False)
    said = []
    shuffled = compute(spark, [str(d) for d in dirs], top=TOP, targets=TARGETS, progress=said.append, driver_rows=0)
    assert any("partial rows shuffled" in line for line in said)
    assert shuffled.tables == result.tables


@pytest.mark.integration
def test_the_handoff_files_are_removed_whatever_happens(spark, generated, tmp_path, monkeypatch):
    """The job's files are gone when it ends, and when a task fails."""
    import tempfile

    from kinspect.analyze import handoff

    made = []

    def work_directory(spark):
        made.append(tempfile.mkdtemp(prefix="kinspect-analyze-", dir=tmp_path))
        return made[-1]

    monkeypatch.setattr(handoff, "work_directory", work_directory)
    dirs, _ = generated
    compute(spark, [str(d) for d in dirs], top=TOP, targets=TARGETS, driver_rows=0)

    def failing_merger(directory):
        def merge(partitions):
            raise RuntimeError("a merging task failed")
        return merge

    monkeypatch.setattr(handoff, "file_merger", failing_merger)  # shipped to the Python workers with the job
    with pytest.raises(AnalyzeInputError, match="a merging task failed"):
        compute(spark, [str(d) for d in dirs], top=TOP, targets=TARGETS, driver_rows=0)
    assert len(made) == 2 and not any(Path(d).exists() for d in made)


def test_a_task_retried_hands_over_its_partial_rows_once(tmp_path):
    """A read task's files count once however often it ran: an attempt that failed part way leaves none, the one
    that completed is renamed into place, and a later attempt of the same task is dropped."""
    from kinspect.analyze.handoff import commit, partial_rows

    def blobs(fail: bool = False):
        yield 0, ("values", b"first")
        if fail:
            raise RuntimeError("the task failed part way")
        yield 1, ("values", b"second")
        yield 0, ("exchanges", b"third")

    with pytest.raises(RuntimeError, match="part way"):
        commit(str(tmp_path), 3, blobs(fail=True))
    assert list(tmp_path.iterdir()) == []
    assert commit(str(tmp_path), 3, blobs()) is True
    assert commit(str(tmp_path), 3, blobs()) is False
    assert [p.name for p in tmp_path.iterdir()] == ["task-3"]
    assert sorted(partial_rows(str(tmp_path), 0)) == [(0, ("exchanges", b"third")), (0, ("values", b"first"))]
    assert list(partial_rows(str(tmp_path), 1)) == [(1, ("values", b"second"))]
    assert list(partial_rows(str(tmp_path), 2)) == []


@pytest.mark.integration
def test_small_capture_without_spark_gives_the_same_tables(analyzed, generated):
    """What the CLI does for a small local capture on a local master: the job with no Spark at
    all (`spark` None), every aggregate and table in this process. The same tables."""
    result, _, _ = analyzed
    dirs, _ = generated
    said = []
    alone = compute(None, [str(d) for d in dirs], top=TOP, targets=TARGETS, progress=said.append)
    assert any("read on the driver" in line for line in said)
    assert alone.tables == result.tables
    with pytest.raises(AnalyzeInputError, match="the job needs a SparkSession"):
        compute(None, [str(d) for d in dirs], top=TOP, targets=TARGETS, driver_rows=10)


@pytest.mark.integration
def test_shared_derivations_are_computed_once(analyzed, generated, monkeypatch):
    """The job's Aggregates compute what several tables derive from them (the upgrade tables'
    grouping of the exchanges, the sorted sizes and latencies) once; a plain dict of the same
    aggregates gives the same tables."""
    from kinspect.analyze import aggregates, scan, tables, upgrade

    result, _, _ = analyzed
    dirs, _ = generated
    plain = aggregates.on_driver(scan.plan(None, check_inputs([str(d) for d in dirs])))
    calls = collections.Counter()
    for module, name in ((upgrade, "_Usage"), (tables, "_sorted_values")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, _name=name, _original=original:
                            (calls.update([_name]), _original(*args))[1])
    for aggs, once in ((tables.Aggregates(plain), True), (dict(plain), False)):
        calls.clear()
        got = {name: build(aggs, TOP) for name, (build, _, _) in tables.TABLES.items()}
        got |= {name: build(aggs, TARGETS) for name, (build, _, _) in upgrade.UPGRADE_TABLES.items()}
        assert got == result.tables
        assert calls == ({"_Usage": 1, "_sorted_values": 1} if once else {"_Usage": 2, "_sorted_values": 2})


@pytest.mark.integration
def test_row_groups_with_dictionaries_of_their_own_give_the_same_tables(analyzed, generated, tmp_path):
    """Capture files of many small row groups, each with dictionaries of its own: the string
    columns (nested ones too) are read as dictionaries, a row group at a time, and unified.
    The same tables."""
    result, _, _ = analyzed
    dirs, _ = generated
    copies = []
    for directory in dirs:
        copy = tmp_path / directory.name
        copy.mkdir()
        for file in sorted(directory.glob("capture-*.parquet")):
            pq.write_table(pq.read_table(file), copy / file.name, row_group_size=300)
        copies.append(copy)
    assert pq.ParquetFile(copies[0] / "capture-00000.parquet").num_row_groups > 3
    alone = compute(None, [str(c) for c in copies], top=TOP, targets=TARGETS)
    assert alone.tables == result.tables


@pytest.mark.integration
def test_read_through_spark_filesystems_gives_the_same_tables(spark, analyzed, generated, monkeypatch):
    """The route of URIs that are not local files (s3a://, hdfs://...): Spark lists and reads each
    file's bytes through its Hadoop filesystems, and pyarrow reads them from memory. Taken here
    by file: URIs that the job is told are not local."""
    from kinspect.analyze import scan

    result, _, _ = analyzed
    dirs, _ = generated
    monkeypatch.setattr(scan, "is_local", lambda path: False)
    said = []
    remote = compute(spark, [d.as_uri() for d in dirs], top=TOP, targets=TARGETS, progress=said.append)
    assert any("5 read tasks" in line for line in said)  # one per capture file: 3 + 2
    assert remote.tables == result.tables


@pytest.mark.integration
def test_malformed_file_through_spark_filesystems(spark, tmp_path, monkeypatch):
    """A capture file that Spark's tasks find malformed: one line naming the file and what is wrong."""
    from kinspect.analyze import scan

    table = pq.read_table(write_captures(tmp_path / "src", 5, files=1)[0]).drop_columns(["api_key"])
    (tmp_path / "run").mkdir()
    pq.write_table(table, tmp_path / "run" / "capture-00000.parquet")
    monkeypatch.setattr(scan, "is_local", lambda path: False)
    with pytest.raises(AnalyzeInputError) as raised:
        compute(spark, [(tmp_path / "run").as_uri()])
    message = str(raised.value)
    assert "\n" not in message
    assert re.search(r"malformed capture file .*capture-00000\.parquet: missing columns api_key$", message), message


def test_histograms_of_any_length():
    """Integer fields' varint histograms, summed per group slot by slot: lists of 10 counts
    (schema versions 1 and 2), shorter ones (version 3 leaves trailing zero counts out), empty
    and null lists, where a count past a list's end is 0; chunked columns too."""
    import numpy as np

    from kinspect.analyze.groups import Groups
    from kinspect.analyze.partials import _hist_sums

    full = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    lists = [full, [4, 5], None, [], [0, 3], [7], [10 * c for c in full]]
    group_of = [0, 1, 0, 1, 0, 1, 0]

    def want(lists, group_of):  # slot by slot, the groups in the order they first appear (Groups' ids)
        order = list(dict.fromkeys(group_of))
        return [[sum(h[i] for h, g in zip(lists, group_of) if g == group and h is not None and i < len(h))
                 for group in order] for i in range(10)]

    hists = pa.array(lists, pa.list_(pa.int32()))
    sums = _hist_sums(Groups(np.array(group_of)), hists, "u")
    assert [sums[f"u{i + 1}"].to_pylist() for i in range(10)] == want(lists, group_of)
    assert want(lists, group_of)[2] == [33, 0]
    rotated = _hist_sums(Groups(np.array(group_of[3:] + group_of[:3])),
                         pa.chunked_array([hists.slice(3), hists.slice(0, 3)]), "z")
    assert [rotated[f"z{i + 1}"].to_pylist() for i in range(10)] == want(lists[3:] + lists[:3],
                                                                         group_of[3:] + group_of[:3])


def test_equal_keys_share_a_bucket_in_every_task():
    """Partial rows with equal keys must meet in one bucket whichever task computed them: the
    bucket is a hash of the key values alone (not of a task's dictionary or row order), nulls
    included, and spreads distinct keys over every bucket."""
    from kinspect.analyze.partials import buckets_of

    keys = [(f"client-{i % 37}" if i % 11 else None, i % 5, i % 3 == 0) for i in range(1000)]

    def table(rows):
        return pa.table({"client": [r[0] for r in rows], "version": pa.array([r[1] for r in rows], pa.int32()),
                         "flag": [r[2] for r in rows]})

    one = buckets_of(table(keys), ["client", "version", "flag"], 8)
    shuffled = keys[::-1][500:] + keys[::-1][:500]
    other_table = pa.concat_tables([table(shuffled[:300]), table(shuffled[300:])])  # chunked, other dictionaries
    other = buckets_of(other_table, ["client", "version", "flag"], 8)
    # the client as a dictionary (how partial rows hold strings), in another order and with a value twice
    names = sorted({r[0] for r in keys if r[0]}, reverse=True)
    names.insert(3, names[0])
    dictionary = pa.DictionaryArray.from_arrays(
        pa.array([names.index(r[0]) if r[0] else None for r in keys], pa.int32()), pa.array(names))
    encoded = buckets_of(table(keys).set_column(0, "client", dictionary), ["client", "version", "flag"], 8)
    first_bucket = {}
    for key, bucket in list(zip(keys, one)) + list(zip(shuffled, other)) + list(zip(keys, encoded)):
        assert first_bucket.setdefault(key, bucket) == bucket, key
    assert set(one) == set(range(8))


def test_partial_rows_shrink_for_the_shuffle_and_widen_back():
    """Partial rows cross Spark in their narrowest types (shrunk) and are cast back to the
    partial schema's on arrival: every value comes back, at each type's edges and null. A
    table of a few rows crosses as it is."""
    from kinspect.analyze.partials import arrow_schema_of, from_ipc, ipc_bytes, shrunk

    schema = arrow_schema_of("errors")  # api_key int, api_name string, code int, name string, count, exchanges
    edges = [None, 0, 127, -128, 128, -129, 32767, 32768, -(1 << 31), (1 << 31) - 1] * 100
    rows = len(edges)
    names = pa.array([f"api-{i % 3}" if i % 4 else None for i in range(rows)])
    table = pa.table({"api_key": pa.array(edges, pa.int32()), "api_name": names.cast(schema[1].type),
                      "code": pa.array([5] * rows, pa.int32()),
                      "name": pa.array([f"name-{i}" for i in range(rows)]).cast(schema[3].type),
                      "count": pa.array(edges[:-1] + [1 << 40], pa.int64()),
                      "exchanges": pa.array([None] * rows, pa.int64())}, schema=schema)
    small = shrunk(table)
    assert [small[c].type for c in ("api_key", "code", "exchanges")] == [pa.int32(), pa.int8(), pa.int8()]
    assert small["api_name"].type.index_type == pa.int8() and small["count"].type == pa.int64()
    assert from_ipc(ipc_bytes(small)).cast(schema).equals(table)
    assert shrunk(table.slice(0, 999)).schema == schema


def test_buckets_spread_over_the_partitions():
    """The merge's buckets are spread over the shuffle's partitions: each large aggregate puts
    one bucket in every partition, each small one its single bucket in one of them, round the
    partitions; the shuffle's partitioner takes a pair's key as its partition."""
    from kinspect.analyze.aggregates import LARGE, placement
    from kinspect.analyze.scan import partition_of

    for partitions in (1, 2, 6, 13):
        where = placement(partitions)
        for name in LARGE:
            assert where[name] == list(range(partitions))
        small = [named for name, named in where.items() if name not in LARGE]
        assert {len(named) for named in small} == {1}
        assert all(0 <= named[0] < partitions for named in small)
        if partitions >= len(small):
            assert len({named[0] for named in small}) == len(small)
        assert [partition_of(p) % partitions for p in range(partitions)] == list(range(partitions))


def test_shuffle_partitions_grow_linearly_then_as_the_square_root_of_the_input():
    """One partition per 64 MB up to 9, then 3 x the square root: the shuffle's blocks (read tasks
    x partitions) grow as the input to the power 1.5, not squared; the cores at least, one for
    a small input, 400 at most."""
    from types import SimpleNamespace

    from kinspect.analyze.job import size_shuffle

    def partitions(megabytes: float, cores: int = 2) -> int:
        spark = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=cores))
        return size_shuffle(spark, int(megabytes * (1 << 20)))

    assert [partitions(mb) for mb in (0, 1, 64)] == [1, 1, 1]
    assert [partitions(mb) for mb in (65, 128, 334, 576)] == [2, 2, 6, 9]  # linear, the cores at least
    assert partitions(65, cores=8) == 8
    assert [partitions(mb) for mb in (3300, 33_000)] == [22, 69]  # 50M and 500M rows of bench_analyze
    assert partitions(10 ** 8) == 400
    sizes = [2 ** k for k in range(6, 27)]
    counts = [partitions(mb) for mb in sizes]
    assert counts == sorted(counts)  # never fewer for more input
    for small, large in zip(sizes[4:], sizes[5:]):  # beyond the linear part, doubling the input:
        assert partitions(large) <= partitions(small) * 1.5 or partitions(large) == 400  # about sqrt(2) x


def test_buckets_hash_a_subset_of_the_merge_keys():
    """A bucket is hashed from some of the merge keys only: rows with equal merge keys then still
    share a bucket."""
    from kinspect.analyze.merge import BUCKET_KEYS, MERGES

    assert BUCKET_KEYS.keys() == MERGES.keys()
    for name, keys in BUCKET_KEYS.items():
        assert keys and set(keys) <= set(MERGES[name][0]), name


@pytest.mark.integration
def test_generated_captures_cover_the_cases(analyzed):
    result, want, lines = analyzed
    s = want["summary"][0]
    assert s["exchanges"] == 4700 and s["responses"] < s["exchanges"]  # acks=0 rows
    apis = {r["api"] for r in want["api_sizes"]}
    assert "api_9999" in apis and "Produce" in apis
    assert any(not r["known"] for r in want["tagged_fields"]) and any(r["known"] for r in want["tagged_fields"])
    assert {r["best"] for r in want["varint_savings"]} >= {"packed", "upacked"}
    assert {r["type"] for r in want["varint_histogram"]} == {"int16", "int32", "int64"}
    assert any(r["direction"] == "response" and r["version"] == 0 for r in want["kip482_savings"]
               if r["api"] == "ApiVersions")
    assert None in {r["client_id"] for r in result.tables["top_clients"]} | {r["client_id"] for r in want["top_clients"]}
    assert len(result.tables["top_clients"]) == TOP + 1 and len(result.tables["top_topics"]) == TOP + 1
    assert result.tables["top_topics"][-1]["topic"] == "(other)" and result.tables["top_topics"][-1]["grouped"] > 1
    upgrade = {(r["target"], r["rejected"]) for r in want["upgrade_versions"]}
    assert ("4.3.1", "record format v0/v1 removed") in upgrade and ("4.3.1", "api version removed") in upgrade
    assert ("3.9.2", "record format v0/v1 removed") not in upgrade and ("3.9.2", "api removed") in upgrade
    assert "unknown" in {r["software"] for r in want["upgrade_clients"]}  # the v1 files, and software not sent
    assert lines[0].startswith("read: captures aggregated into ")
    assert "5 read tasks" in lines[0]  # one per piece (a capture file here): fewer than 4 waves of the 2 cores
    assert lines[1].startswith(f"tables: {len(TABLE_NAMES)} tables on the driver")
    assert list(result.tables) == list(TABLE_NAMES)  # in report order


def test_pieces_in_bins_of_about_equal_rows():
    """A local capture's pieces go to at most WAVES read tasks per core, a bin of pieces each,
    about equal in rows, the largest bin first; every piece exactly once."""
    from kinspect.analyze.scan import _bins

    pieces = [(f"file:///c/{i}", [i], rows) for i, rows in enumerate([476, 476, 300, 262, 262, 262, 262, 214])]
    bins = _bins(pieces, 4)
    assert sorted(piece for b in bins for piece in b) == sorted(pieces)
    totals = [sum(piece[2] for piece in b) for b in bins]
    assert totals == sorted(totals, reverse=True) and max(totals) - min(totals) <= 214
    assert _bins(pieces[:3], 3) == [[pieces[0]], [pieces[1]], [pieces[2]]]


def test_row_groups_in_runs_about_the_target():
    """Consecutive row groups go into runs of about the target rows: a group joins the run before it when
    more than half of it fits within the target and the run stays within a quarter over it. Groups just
    over half the target pair up (the previous rule left each alone: half the rows a piece); one group
    larger than the target stays alone; every group once, in order."""
    from kinspect.analyze.inputs import row_runs

    assert row_runs([262_144] * 4 + [213_568], 500_000) == [[0, 1], [2, 3], [4]]
    assert row_runs([300, 300, 300], 500) == [[0, 1], [2]]  # 600 is within a quarter over 500
    assert row_runs([400, 300], 500) == [[0], [1]]  # 700: more than a quarter over
    assert row_runs([200, 200, 200], 500) == [[0, 1], [2]]  # 500 would be reached only halfway through the third
    assert row_runs([10, 900, 10, 10], 500) == [[0], [1], [2, 3]]
    assert row_runs([], 500) == []
    runs = row_runs([7, 130, 45, 400, 12, 260, 260, 90] * 5, 500)
    assert [i for run in runs for i in run] == list(range(40))


def test_local_pieces_of_row_groups_just_over_half_a_piece(tmp_path, monkeypatch):
    """The benchmark's layout scaled down (row groups a little over half a piece, one file): a piece is two
    row groups, not one."""
    from kinspect.analyze import scan

    monkeypatch.setattr(scan, "PIECE_ROWS", 500)
    path, = write_captures(tmp_path, 2_630, files=1, distinct=50)
    pq.write_table(pq.read_table(path), path, row_group_size=263)
    pieces, _, rows = scan._local_pieces([str(tmp_path)], 2)
    assert rows == 2_630 and sorted(g for _, groups, _ in pieces for g in groups) == list(range(10))
    assert [len(groups) for _, groups, _ in pieces] == [2] * 5 and [n for *_, n in pieces] == [526] * 5


def test_percentiles_are_nearest_rank():
    """Exact nearest-rank percentiles for every group size 1..400, ties and all, from distinct
    values with their counts (what the `values` aggregate holds), in groups given in any order."""
    from kinspect.analyze.tables import _percentile_table

    rows = [(n, (i * 7919) % (n + 3)) for n in range(1, 401) for i in range(n)]
    counted = collections.Counter(rows)  # one row per distinct value, with its count
    items = sorted(counted.items(), key=lambda kv: (kv[0][1] * 31 + kv[0][0]) % 97)  # not in group order
    table = pa.table({"g": [g for (g, _), _ in items], "v": pa.array([v for (_, v), _ in items], pa.int64()),
                      "n": pa.array([c for _, c in items], pa.int64())})
    got = {r["g"]: (r["p50"], r["p90"], r["p99"], r["count"], r["max"], r["sum"])
           for r in _percentile_table(table, ["g"], None)}
    values = collections.defaultdict(list)
    for n, v in rows:
        values[n].append(v)
    want = {n: tuple(nearest_rank(v, p) for p in (0.5, 0.9, 0.99)) + (len(v), max(v), sum(v))
            for n, v in values.items()}
    assert got == want


@pytest.mark.parametrize("wide", [False, True])
def test_sizes_and_latencies_from_one_sort(wide):
    """api_sizes and latency from one sort of a `values` aggregate (sizes and latencies, apis,
    versions, counts): packed into one int64 with the counts, or, the spans too wide for one
    int64, by np.lexsort. Either way, the plain-Python figures of the values each row stands for."""
    from kinspect.analyze.partials import LATENCY, REQUEST, RESPONSE
    from kinspect.analyze.tables import Aggregates, api_sizes, latency

    import random

    counted = collections.Counter()
    pick = random.Random(3 if wide else 4)
    for _ in range(3000):
        direction = pick.choice((REQUEST, RESPONSE, LATENCY))
        version = None if direction == LATENCY else pick.choice((None, 0, 3, 12))
        # a few values far apart (their sums still fit an int64, as the figures' do)
        v = pick.choice((-1, 1)) * (1 << 59) if wide and pick.random() < 0.03 else pick.randrange(-50, 5000)
        counted[(pick.choice(("Fetch", "Produce", "api_77")), direction, version, v)] += pick.randrange(1, 4)
    keys = list(counted)
    values = pa.table({"api": [k[0] for k in keys], "direction": pa.array([k[1] for k in keys], pa.int8()),
                       "version": pa.array([k[2] for k in keys], pa.int32()),
                       "v": pa.array([k[3] for k in keys], pa.int64()), "n": pa.array(list(counted.values()), pa.int64())})
    expanded = collections.defaultdict(list)
    for (api, direction, version, v), n in counted.items():
        expanded[(api, direction, version)] += [v] * n
    want = []
    for (api, direction, version), vs in sorted(expanded.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] is not None,
                                                                                  kv[0][2] or 0)):
        if direction != LATENCY:
            want.append({"api": api, "direction": "request" if direction == REQUEST else "response",
                         "version": version, "count": len(vs), **{name: nearest_rank(vs, p) for name, p in
                                                                   (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
                         "max": max(vs), "sum": sum(vs)})
    aggs = Aggregates({"values": values})
    assert api_sizes(aggs, TOP) == want
    assert latency(aggs, TOP) == [{"api": api, "count": len(vs), **{f"{name}_ms": nearest_rank(vs, p) / 1000.0
                                                                    for name, p in (("p50", 0.5), ("p90", 0.9),
                                                                                    ("p99", 0.99))},
                                   "max_ms": max(vs) / 1000.0}
                                  for (api, direction, _), vs in sorted(expanded.items(), key=lambda kv: kv[0][0])
                                  if direction == LATENCY]


def test_percentile_order_packed_or_not():
    """Rows sort by their keys' ranks, then v: packed into one int64 when they fit, by np.lexsort
    when they do not (v spanning 2^62). Either way, the same sequence of keys and values."""
    import numpy as np

    from kinspect.analyze.tables import _order

    rng = np.random.default_rng(5)
    ranks = [rng.integers(0, 4, 3000), rng.integers(0, 50, 3000)]
    for v in (rng.integers(-1000, 1000, 3000), rng.integers(-(1 << 62), 1 << 62, 3000)):
        order = _order(ranks, v)
        got = list(zip(ranks[0][order].tolist(), ranks[1][order].tolist(), v[order].tolist()))
        assert got == sorted(zip(ranks[0].tolist(), ranks[1].tolist(), v.tolist()))


# ----------------------------------------------------------------------------- what is written


@pytest.mark.integration
def test_parquet_and_csv_hold_the_tables(analyzed, generated):
    result, _, _ = analyzed
    _, out = generated
    for name, rows in result.tables.items():
        table = pq.read_table(out / "tables" / name)
        assert table.to_pylist() == rows, name
        with open(out / "tables" / f"{name}.csv", newline="") as f:
            lines = list(csv.reader(f))
        assert lines[0] == list(result.schemas[name].names)
        assert len(lines) == len(rows) + 1
        for line, row in zip(lines[1:], rows):
            assert line == ["" if v is None else repr(v) if isinstance(v, float) else str(v) for v in row.values()]


@pytest.mark.integration
def test_report_is_self_contained_with_plots_and_figures(analyzed, generated):
    result, want, _ = analyzed
    _, out = generated
    html = (out / "report.html").read_text()
    assert_self_contained(html)
    assert html.count('<div class="chart">') >= 10
    for name in ("headline", *TABLE_NAMES):
        assert f'id="{name}"' in html
    s = want["summary"][0]
    assert f"{s['exchanges']:,}" in html and f"{s['request_bytes']:,}" in html
    top = want["top_topics"][0]
    assert f'"{top["topic"]}"' in html and str(top["bytes"]) in html  # the chart's data
    today = sum(r["bytes_today"] for r in want["kip482_savings"])
    saved = sum(r["saved"] for r in want["kip482_savings"])
    assert f"{saved:,} of the {today:,} bytes of non-flexible messages" in html


def assert_self_contained(html: str) -> None:
    """One page: scripts inline (plotly.js among them), nothing loaded from anywhere."""
    assert html.startswith("<!DOCTYPE html>")
    assert "Plotly.newPlot" in html
    outside_scripts = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", outside_scripts, re.I)
    assert "<link" not in outside_scripts.lower()
    assert not re.search(r"<script[^>]*\ssrc\s*=", html, re.I)


# ----------------------------------------------------------------------------- bad input


def test_missing_directory(tmp_path):
    with pytest.raises(AnalyzeInputError, match=r"^capture directory not found: .*nowhere$"):
        check_inputs([str(tmp_path / "nowhere")])


def test_session_conf_small_captures_get_a_cheaper_jit(tmp_path):
    from kinspect.analyze.inputs import SMALL_ROWS, local_rows, session_conf

    small = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", "spark.sql.codegen.wholeStage": "false"}
    write_captures(tmp_path / "c", 300, files=2)
    assert local_rows([str(tmp_path / "c")]) == 300
    assert session_conf([str(tmp_path / "c")], "local[2]") == small
    # the driver runs here on a cluster too (client mode); the executors' settings stay the cluster's
    assert session_conf([str(tmp_path / "c")], "spark://127.0.0.1:7077") == small
    # rows unknown before Spark reads them: a larger capture's settings
    assert session_conf(["s3a://bucket/captures"], "local[2]") == {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    assert session_conf(["s3a://bucket/captures"], "spark://127.0.0.1:7077") == {}
    assert local_rows(["s3a://bucket/captures"]) is None
    table = pq.read_table(next((tmp_path / "c").glob("capture-*.parquet")))
    big = tmp_path / "big"
    big.mkdir()
    with pq.ParquetWriter(big / "capture-00000.parquet", table.schema) as writer:
        for _ in range(SMALL_ROWS // table.num_rows + 1):
            writer.write_table(table)
    assert local_rows([str(big)]) > SMALL_ROWS
    # a larger capture on a local master (executors in the driver's JVM, moving bytes): C1, code generation on
    assert session_conf([str(big)], "local[2]") == {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    assert session_conf([str(big)], "spark://127.0.0.1:7077") == {}


def test_directory_without_captures(tmp_path):
    (tmp_path / "capture-00001.parquet.tmp").write_bytes(b"")
    with pytest.raises(AnalyzeInputError, match=r"^no capture files \(capture-\*\.parquet\) in "):
        check_inputs([str(tmp_path)])


def test_corrupt_capture_file(tmp_path):
    write_captures(tmp_path, 10, files=1)
    (tmp_path / "capture-00001.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(AnalyzeInputError, match=r"^malformed capture file .*capture-00001\.parquet: "):
        check_inputs([str(tmp_path)])


def test_file_without_schema_version(tmp_path):
    pq.write_table(pq.read_table(write_captures(tmp_path / "src", 5, files=1)[0]).replace_schema_metadata({}),
                   tmp_path / "capture-00000.parquet")
    with pytest.raises(AnalyzeInputError, match="no kinspect.capture.schema_version metadata"):
        check_inputs([str(tmp_path / "capture-00000.parquet")])


def test_file_with_missing_columns(tmp_path):
    table = pq.read_table(write_captures(tmp_path / "src", 5, files=1)[0]).drop_columns(["latency_us", "broker"])
    pq.write_table(table, tmp_path / "capture-00000.parquet")
    with pytest.raises(AnalyzeInputError, match="missing columns latency_us, broker$"):
        check_inputs([str(tmp_path)])


def test_newer_schema_version(tmp_path):
    write_captures(tmp_path, 20, files=2, schema_version=99)
    with pytest.raises(AnalyzeInputError, match=rf"has capture schema version 99; this kinspect reads versions up to {SCHEMA_VERSION}"):
        check_inputs([str(tmp_path)])


@pytest.mark.integration
def test_newer_schema_version_in_the_rows(spark, tmp_path):
    """A file whose footer says the current version but whose rows say 99: only the job's own check (through Spark) sees it."""
    path = write_captures(tmp_path / "src", 20, files=1)[0]
    table = pq.read_table(path)
    table = table.set_column(0, "schema_version", pa.array([99] * table.num_rows, pa.int16()))
    (tmp_path / "run").mkdir()
    pq.write_table(table.replace_schema_metadata(arrow_schema().metadata), tmp_path / "run" / "capture-00000.parquet")
    assert pq.read_metadata(tmp_path / "run" / "capture-00000.parquet").metadata[METADATA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    with pytest.raises(AnalyzeInputError, match="capture schema version 99"):
        compute(spark, [str(tmp_path / "run")])


def run_cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinspect.cli.main", "analyze", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_cli_bad_input_exits_2_before_spark(tmp_path):
    result = run_cli(str(tmp_path / "missing"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"kinspect analyze: capture directory not found: {tmp_path / 'missing'}"
    write_captures(tmp_path / "v99", 5, files=1, schema_version=99)
    result = run_cli(str(tmp_path / "v99"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "schema version 99" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.integration
@pytest.mark.parametrize("case", ["out is a file", "out under a file", "bad master", "bad conf",
                                  "capture is a directory"])
def test_cli_checks_every_argument_before_spark(tmp_path, case):
    """Each bad argument: one line on stderr, exit 2, and Spark never started (so it is quick)."""
    write_captures(tmp_path / "c", 5, files=1)
    (tmp_path / "report.html").write_text("an existing file")
    args = [str(tmp_path / "c"), "--out", str(tmp_path / "out")]
    expect = {
        "out is a file": (["--out", str(tmp_path / "report.html")], f"--out {tmp_path / 'report.html'} is an "
                          "existing file, not a directory"),
        "out under a file": (["--out", str(tmp_path / "report.html" / "x")], "is a file, not a directory"),
        "bad master": (["--master", "locl[2]"], "--master 'locl[2]' is not a Spark master URL"),
        "bad conf": (["--conf", "spark.ui.enabled"], "--conf 'spark.ui.enabled': expected KEY=VALUE"),
        "capture is a directory": ([], "malformed capture file"),
    }[case]
    if case == "capture is a directory":
        (tmp_path / "c" / "capture-00099.parquet").mkdir()
    result = run_cli(*args, *expect[0], timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kinspect analyze: ") and expect[1] in lines[0], lines
    assert "starting Spark" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.integration
def test_cli_without_java(tmp_path):
    write_captures(tmp_path / "c", 5, files=1)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java there
    assert check_java()  # this machine has one; the child must not find it
    result = run_cli(str(tmp_path / "c"), "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("kinspect analyze: Java not found: no `java` on PATH and JAVA_HOME is not set")
    env["JAVA_HOME"] = str(tmp_path / "no-jdk")
    result = run_cli(str(tmp_path / "c"), "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 2 and "no-jdk/bin/java is not an executable" in result.stderr


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_cli_end_to_end(tmp_path):
    """`kinspect analyze` on a small local capture (--master local[1]): no Spark started;
    the tables, the report and the progress lines."""
    write_captures(tmp_path / "c", 300, files=2, seed=3)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = run_cli(str(tmp_path / "c"), "--out", str(tmp_path / "report"), "--master", "local[1]", "--top", "3",
                     "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # Spark's log at ERROR: no WARN line on a normal run
    assert not re.search(r"\bWARN\b", result.stderr), result.stderr[-3000:]
    progress = [line for line in result.stderr.splitlines() if line.startswith("kinspect analyze: ")]
    # a small local capture: aggregated in the command's own process, no JVM started
    assert progress[0].startswith("kinspect analyze: 300 capture rows, all local (at most 200,000): "
                                  "aggregated in this process, Spark not started")
    assert not any("starting Spark" in line for line in progress)
    assert any(line.startswith("kinspect analyze: read: ") and "read on the driver" in line for line in progress)
    assert any(line.startswith("kinspect analyze: tables: 13 tables on the driver") for line in progress)
    assert re.match(r"kinspect analyze: done: Spark not started, read [\d.]+ s, tables [\d.]+ s, "
                    r"report [\d.]+ s", progress[-1]), progress[-1]
    want = reference(read_rows([tmp_path / "c"]), 3)  # the CLI's targets: every shipped release, as TARGETS
    for name in ("api_sizes", "top_topics", "latency"):
        assert pq.read_table(tmp_path / "report" / "tables" / name).to_pylist() == want[name]
    html = (tmp_path / "report" / "report.html").read_text()
    assert_self_contained(html)
    assert '<div class="chart">' in html and f"{want['summary'][0]['exchanges']:,}" in html


# ----------------------------------------------------------------------------- real traffic


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_captures_of_real_traffic(spark, codec, tmp_path):
    """The proxy captures what confluent-kafka (acks=all and acks=0) and kafka-python did against
    Tansu; the job's tables over those files equal the plain-Python ones, and hold what was done."""
    import gc

    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    from kinspect.capture.observer import CaptureObserver
    from kinspect.session import Exchange
    from tests.support.proxy_harness import ProxyHarness
    from tests.support.tansu import TansuBroker, free_port

    topic, records, timeout = "analyze.topic", 25, 20.0
    captures = tmp_path / "captures"
    captures.mkdir()
    listen_port = free_port()
    capture = CaptureObserver(captures, codec)
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}, codec=codec, observers=(capture,))
        capture.start()
        proxy.start()
        try:
            base = {"bootstrap.servers": f"127.0.0.1:{listen_port}", "client.id": "analyze-confluent"}
            admin = AdminClient(dict(base))
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout)
            with pytest.raises(KafkaException):  # TOPIC_ALREADY_EXISTS: an error code for the table
                admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout)
            for acks in ("all", "0"):
                producer = Producer({**base, "acks": acks, "linger.ms": 5})
                for i in range(records):
                    producer.produce(topic, value=b"analyze %d " % i * (i + 1))
                assert producer.flush(timeout) == 0
            legacy = KafkaProducer(bootstrap_servers=f"127.0.0.1:{listen_port}", client_id="analyze-kafka-python")
            for i in range(records):
                legacy.send(topic, b"kafka-python %d" % i)
            legacy.flush(timeout)
            legacy.close(timeout)
            del admin, producer
            gc.collect()
            proxy.wait_idle()
        finally:
            proxy.stop()
            capture.close()

    exchanges = proxy.events_of(Exchange)
    result = analyze(spark, [str(captures)], str(tmp_path / "report"), top=TOP)
    rows = read_rows([captures])
    assert len(rows) == len(exchanges) == result.tables["summary"][0]["exchanges"] > 10
    want = reference(rows, TOP)
    for name in TABLE_NAMES:
        assert result.tables[name] == want[name], name

    # and the tables hold what the clients did
    t = result.tables
    produce = [r for r in t["api_sizes"] if r["api"] == "Produce" and r["direction"] == "request"]
    assert sum(r["count"] for r in produce) >= 3
    responses = sum(r["count"] for r in t["api_sizes"] if r["api"] == "Produce" and r["direction"] == "response")
    assert responses < sum(r["count"] for r in produce)  # acks=0 produces have none
    assert t["top_topics"][0]["topic"] == topic
    assert {r["client_id"] for r in t["top_clients"]} >= {"analyze-confluent", "analyze-kafka-python"}
    assert any(r["api"] == "CreateTopics" and r["name"] == "TOPIC_ALREADY_EXISTS" for r in t["error_codes"])
    assert {"Produce", "Metadata", "ApiVersions"} <= {r["api"] for r in t["latency"]}
    # librdkafka's CreateTopics v4 is not flexible (v5 is); ApiVersions v3+ responses carry tagged fields
    assert any(r["api"] == "CreateTopics" and r["saved"] > 0 for r in t["kip482_savings"])
    assert any(r["api"] == "ApiVersions" and r["known"] for r in t["tagged_fields"])
    assert t["varint_savings"] and t["varint_histogram"]
    assert_self_contained((tmp_path / "report" / "report.html").read_text())


@pytest.mark.integration
def test_outputs_through_hadoop_filesystems(spark, analyzed, tmp_path):
    """The paths taken for URIs (s3a://, hdfs://...), exercised here with file:// URIs."""
    from kinspect.analyze.output import hadoop_write, spark_parquet

    result, _, _ = analyzed
    hadoop_write(spark, (tmp_path / "deep" / "report.html").as_uri(), "<p>é</p>".encode())
    assert (tmp_path / "deep" / "report.html").read_text() == "<p>é</p>"
    rows = result.tables["latency"]
    spark_parquet(spark, (tmp_path / "latency").as_uri(), result.schemas["latency"], rows)
    assert pq.read_table(tmp_path / "latency").to_pylist() == rows


# ----------------------------------------------------------------------------- the report in a browser


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_report_in_headless_chromium(analyzed, generated, tmp_path):
    """report.html opened by Debian's chromium, offline: no console error, every chart drawn with
    data, and a screenshot (KINSPECT_REPORT_SCREENSHOT=path keeps one, e.g. docs/images/report.png)."""
    from tests.support.chromium import Page

    _, out = generated
    page = Page(width=1280, height=1600)
    try:
        page.open((out / "report.html").as_uri())
        charts = page.evaluate("""(() => [...document.querySelectorAll('.js-plotly-plot')].map(p => ({
            title: (p.layout && p.layout.title && p.layout.title.text) || '',
            traces: (p.data || []).length,
            points: p.querySelectorAll('.point').length})))()""")
        headline = page.evaluate("document.querySelector('#headline + .headline').innerText")
        shot = Path(os.environ.get("KINSPECT_REPORT_SCREENSHOT") or tmp_path / "report.png")
        page.screenshot(shot, full_height=1600)
        errors = list(page.errors)
    finally:
        page.close()
    assert errors == []
    assert len(charts) >= 10
    empty = [c["title"] for c in charts if not c["traces"] or not c["points"]]
    assert empty == [], f"charts drawn without data: {empty}"
    assert "KIP-482 compact encodings would save" in headline and "top clients" in headline
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- a standalone cluster


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_cli_on_a_standalone_cluster(tmp_path):
    """`kinspect analyze --master spark://...` on a real standalone cluster (master and worker on
    loopback): every table equals the local run's.

    The local run's tables are the plain-Python ones (test_table_matches_plain_python holds them
    equal), so this test compares with those and needs no local session of its own: it runs
    beside the tests that share the run's SparkSession instead of after them."""
    from tests.support.spark import StandaloneCluster

    write_captures(tmp_path / "c", 1500, files=3, seed=11)
    want = reference(read_rows([tmp_path / "c"]), TOP)  # the CLI's targets: every shipped release, as TARGETS
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    with StandaloneCluster(tmp_path / "cluster", cores=2) as cluster:
        result = run_cli(str(tmp_path / "c"), "--out", str(tmp_path / "report"), "--master", cluster.url,
                         "--top", str(TOP), "--conf", "spark.ui.enabled=false",
                         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                         "--conf", "spark.executor.memory=512m",
                         # a small capture: the executor too compiles with C1 only (less CPU for the test run)
                         "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1", env=env, timeout=800)
        executors = list((tmp_path / "cluster" / "work").glob("app-*/*/stderr"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert executors, "no executor ran on the cluster's worker"
    written = sorted(p.name for p in (tmp_path / "report" / "tables").iterdir() if p.is_dir())
    assert written == sorted(TABLE_NAMES) == sorted(want)
    for name in TABLE_NAMES:
        assert pq.read_table(tmp_path / "report" / "tables" / name).to_pylist() == want[name], name


def test_apis_kept_as_a_dictionary_rank_as_their_strings():
    """The driver keeps the values aggregate's api as a dictionary (aggregates.DICTIONARIES): its
    ranks are those of the plain strings, also when chunks have dictionaries of their own and
    when a dictionary holds a name twice."""
    from kinspect.analyze.tables import _ranked_values

    names = [["Produce", "Fetch", None, "Fetch"], ["Metadata", "Produce"]]
    plain = pa.chunked_array([pa.array(chunk) for chunk in names])
    twice = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1]), pa.array(["Produce", "Fetch", "Produce"]))
    for column, strings in (
            (pa.chunked_array([pa.array(chunk).dictionary_encode() for chunk in names]), plain),
            (twice, pa.array(["Produce", "Fetch", "Produce", "Fetch"]))):
        ranks, values = _ranked_values(column)
        expected_ranks, expected_values = _ranked_values(strings)
        assert ranks.tolist() == expected_ranks.tolist() and values.equals(expected_values)
    assert _ranked_values(twice)[0].tolist() == [2, 1, 2, 1]  # both Produce one rank


@pytest.mark.parametrize("kind", [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64()])
def test_integers_rank_by_their_range_as_by_hashing(kind):
    """Versions and directions are ranked by a table of their range (a few values): the same ranks,
    dense and null 0, and the same distinct values as the general path, which a wide range takes."""
    from kinspect.analyze.tables import _ranked_values

    signed = pa.types.is_signed_integer(kind)
    chunks = [[5, None, 3, 5], [9, -2 if signed else 2, None, 3]]
    column = pa.chunked_array([pa.array(chunk, kind) for chunk in chunks])
    ranks, values = _ranked_values(column)
    low = -2 if signed else 2
    assert ranks.tolist() == [3, 0, 2, 3, 4, 1, 0, 2] and values.to_pylist() == [low, 3, 5, 9]
    assert values.type == kind
    padded = [[None if v is None else f"{v + 1000:08d}" for v in chunk] for chunk in ([5, None, 3, 5], [9, low, None, 3])]
    as_strings, _ = _ranked_values(pa.chunked_array([pa.array(chunk) for chunk in padded]))
    assert as_strings.tolist() == ranks.tolist()  # the hashing path orders these strings as the numbers
    if kind.bit_width >= 32:
        wide = pa.array([70_000, None, 3, 70_000], kind)  # a range too wide for the table: hashed and sorted
        ranked, distinct = _ranked_values(wide)
        assert ranked.tolist() == [2, 0, 1, 2] and distinct.to_pylist() == [3, 70_000]
    assert _ranked_values(pa.array([None, None], kind))[0].tolist() == [0, 0]
