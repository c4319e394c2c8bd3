"""How long `kinspect analyze` takes on local[2], against a plain pyarrow read of the same files, and how it grows.

    python benchmarks/bench_analyze.py [--sizes 1000000,5000000] [--reps 3,2] [--data DIR] [--keep]

Captures with realistic variety are generated per size (numpy, vectorised, a million rows
in a few seconds): 5,000 client ids (Zipf-like, some null), 20,000 client addresses,
2,000 topics, 14 apis over their real version ranges and one unknown, lognormal sizes
and latencies, times spread over a day, tagged fields, error codes, integer fields with
their varint histograms, compact sizes for non-flexible versions. No row is repeated.
They go to a fresh temporary directory (removed at the end) unless --data names one
(kept, and reused by later runs).

Each repetition runs the whole job (every table, Parquet, CSV and report.html into a
fresh directory) on one SparkSession (local[2], 2 GB driver), after one untimed warm-up
run on the route the sizes take (Spark's read tasks above kinspect.analyze.scan.DRIVER_ROWS
rows, the driver's own read below). The peer, measured in the same run right after each job: a plain pyarrow read of
every column of the same files (`pyarrow.parquet.read_table`). Printed per size: median
job seconds with every repetition, rows per second, the median read and job/read ratio (and
each repetition's own: a job and the read right after it share the load of their moment),
all medians over the warm repetitions (the first of three or more runs cold: shown, not
counted),
where the job's time went (read into the aggregates, tables, report), the CPU seconds
each used (/proc: Spark's JVM with its Python workers plus this process for the job, this process
for the read),
a ratio that a busy machine skews less than the wall-clock one, the job's CPU split into the
JVM's own, its Python workers' and this process's (the driver), and the peak resident memory
during a job of the JVM (driver and local executors), of the largest Python worker, and of
this process (the Python driver) for a job that no pyarrow read preceded (the first size's
first repetition: run one size alone for its figure). Last,
time(largest) / time(smallest) against the ideal linear ratio of the sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proc_cpu import cpu_seconds, descendants, tree_cpu_seconds  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from kinspect.analyze.inputs import session_conf  # noqa: E402
from kinspect.analyze.job import analyze  # noqa: E402
from kinspect.analyze.scan import DRIVER_ROWS  # noqa: E402
from kinspect.capture.columns import trimmed_histograms  # noqa: E402  (the writer's own layout of the lists)

# api key, name (None: unknown to the specs), lowest and highest version, first flexible version, weight
APIS = ((0, "Produce", 3, 12, 9, 30), (1, "Fetch", 4, 17, 12, 30), (3, "Metadata", 1, 13, 9, 6),
        (18, "ApiVersions", 0, 4, 3, 2), (10, "FindCoordinator", 0, 6, 3, 2), (12, "Heartbeat", 0, 4, 4, 10),
        (8, "OffsetCommit", 2, 9, 8, 5), (9, "OffsetFetch", 1, 9, 6, 3), (11, "JoinGroup", 2, 9, 6, 1),
        (14, "SyncGroup", 0, 5, 4, 1), (19, "CreateTopics", 2, 7, 5, 1), (2, "ListOffsets", 1, 9, 6, 3),
        (22, "InitProducerId", 0, 5, 2, 1), (36, "SaslAuthenticate", 0, 2, 2, 1), (9999, None, 0, 1, -1, 0.2))
INTEGER_PATHS = (("request", "TopicData.PartitionData.Index", "int32", 4),
                 ("request", "TimeoutMs", "int32", 4), ("response", "Responses.Partitions.BaseOffset", "int64", 8),
                 ("response", "Responses.Partitions.ErrorCode", "int16", 2),
                 ("request", "Topics.Partitions.FetchOffset", "int64", 8), ("request", "GenerationId", "int32", 4))
ERRORS = ((6, "NOT_LEADER_OR_FOLLOWER"), (3, "UNKNOWN_TOPIC_OR_PARTITION"), (36, "TOPIC_ALREADY_EXISTS"),
          (-1, "UNKNOWN_SERVER_ERROR"), (27, "REBALANCE_IN_PROGRESS"), (25, "UNKNOWN_MEMBER_ID"),
          (7, "REQUEST_TIMED_OUT"), (29, "TOPIC_AUTHORIZATION_FAILED"))
TAGS = (("request_header", "", 3, "ClientTag"), ("response_body", "", 0, "ThrottleHint"),
        ("response_body", "Topics", 1, "TopicHint"), ("request_body", "", 1000, None))
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
DAY_US = 86_400_000_000
START_US = 1_767_225_600_000_000  # 2026-01-01 UTC


def _lists(pa, np, lengths, type_, children: list):
    """A list<struct> column from per-row lengths and the flat child arrays."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.StructArray.from_arrays(children, fields=list(type_.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=type_)


def _take(pa, vocabulary: list, index, null=None):
    return pa.array(vocabulary, pa.string()).take(pa.array(index, mask=null))


def generate(rows: int, seed: int, first_row: int):
    """`rows` capture rows as a pyarrow Table (the capture schema), vectorised with numpy."""
    import numpy as np
    import pyarrow as pa

    from kinspect.capture.schema import arrow_schema

    schema = arrow_schema()
    rng = np.random.default_rng(seed)
    n = rows
    weights = np.array([a[5] for a in APIS], float)
    which = rng.choice(len(APIS), n, p=weights / weights.sum())
    key = np.array([a[0] for a in APIS])[which]
    low, high = np.array([a[2] for a in APIS])[which], np.array([a[3] for a in APIS])[which]
    version = (low + (rng.random(n) * (high - low + 1)).astype(np.int64)).astype(np.int16)
    first_flex = np.array([a[4] for a in APIS])[which]
    flexible = (first_flex >= 0) & (version >= first_flex)
    acks0 = (key == 0) & (rng.random(n) < 0.05)
    t_us = START_US + np.sort(rng.integers(0, DAY_US, n)) + first_row  # a day of traffic
    latency = np.exp(rng.normal(7.5, 1.3, n)).astype(np.int64) + 50
    req_size = np.exp(rng.normal(5.5, 1.6, n)).astype(np.int64) + 30
    resp_size = np.exp(rng.normal(6.5, 2.0, n)).astype(np.int64) + 12
    client = (rng.zipf(1.3, n) - 1) % 5000
    address = (client * 4 + rng.integers(0, 4, n)) % 20000
    null_client = rng.random(n) < 0.02
    hosts = [f"10.{i // 4000}.{i // 250 % 16}.{i % 250 + 1}:{30000 + i % 30000}" for i in range(20000)]
    resp_mask = acks0
    cols = {
        "schema_version": pa.array(np.full(n, int(schema.metadata[b"kinspect.capture.schema_version"]), np.int16)),
        "request_time": pa.array(t_us).cast(pa.timestamp("us", tz="UTC")),
        "response_time": pa.array(t_us + latency, mask=resp_mask).cast(pa.timestamp("us", tz="UTC")),
        "latency_us": pa.array(latency, mask=resp_mask),
        "connection_id": pa.array(address.astype(np.int64) * 7 + rng.integers(0, 7, n)),
        "client_address": _take(pa, hosts, address),
        "client_id": _take(pa, [f"service-{i}" for i in range(5000)], client, null_client),
        "broker": _take(pa, [f"10.0.0.{i}:9092" for i in range(1, 7)], rng.integers(0, 6, n)),
        "node_id": pa.array(rng.integers(1, 7, n).astype(np.int32), mask=rng.random(n) < 0.3),
        "api_key": pa.array(key.astype(np.int16)),
        "api_name": _take(pa, [a[1] or "" for a in APIS], which, key == 9999),
        "request_version": pa.array(version),
        "response_version": pa.array(version, mask=resp_mask),
        "request_header_version": pa.array(np.where(flexible, 2, 1).astype(np.int8)),
        "response_header_version": pa.array(np.where(flexible, 1, 0).astype(np.int8), mask=resp_mask),
        "flexible": pa.array(flexible),
        "correlation_id": pa.array(((np.arange(n) + first_row) & 0x7FFFFFFF).astype(np.int32)),
        "request_size": pa.array(req_size.astype(np.int32)),
        "response_size": pa.array(resp_size.astype(np.int32), mask=resp_mask),
        "request_header_size": pa.array(rng.integers(10, 40, n).astype(np.int32)),
        "response_header_size": pa.array(np.where(flexible, 5, 4).astype(np.int32), mask=resp_mask),
        "request_inspected": pa.array(rng.random(n) > 0.01),
        "response_inspected": pa.array(rng.random(n) > 0.01, mask=resp_mask),
        "request_decode_error": _take(pa, ["truncated at Topics"], np.zeros(n, np.int64), rng.random(n) > 0.002),
        "response_decode_error": _take(pa, ["truncated at Responses"], np.zeros(n, np.int64), rng.random(n) > 0.001),
        "request_tag_section_bytes": pa.array(np.where(flexible, 1, 0).astype(np.int32)),
        "response_tag_section_bytes": pa.array(np.where(flexible, 1, 0).astype(np.int32), mask=resp_mask),
    }
    # tagged fields: flexible rows carry 0-2
    lengths = np.where(flexible, rng.integers(0, 3, n), 0)
    m = int(lengths.sum())
    tag = rng.choice(len(TAGS), m, p=[0.45, 0.3, 0.2, 0.05])
    names = [t[3] for t in TAGS]
    cols["tagged_fields"] = _lists(pa, np, lengths, schema.field("tagged_fields").type, [
        _take(pa, [t[0] for t in TAGS], tag), _take(pa, [t[1] for t in TAGS], tag),
        pa.array(np.array([t[2] for t in TAGS], np.int32)[tag] + rng.integers(0, 3, m).astype(np.int32) * (tag == 3)),
        _take(pa, [x or "" for x in names], tag, tag == 3),
        pa.array(rng.integers(1, 40, m).astype(np.int32)), pa.array(tag != 3)])
    # error codes: 10% of the responses
    lengths = np.where(~acks0 & (rng.random(n) < 0.1), rng.integers(1, 3, n), 0)
    m = int(lengths.sum())
    err = rng.integers(0, len(ERRORS), m)
    cols["error_codes"] = _lists(pa, np, lengths, schema.field("error_codes").type, [
        pa.array(np.array([e[0] for e in ERRORS], np.int16)[err]), _take(pa, [e[1] for e in ERRORS], err),
        pa.array(rng.integers(1, 5, m).astype(np.int32))])
    # topics: Produce, Fetch, Metadata and ListOffsets name 1-3 of 2,000 topics
    named = np.isin(key, (0, 1, 2, 3))
    lengths = np.where(named, rng.integers(1, 4, n), 0)
    m = int(lengths.sum())
    cols["topic_partitions"] = _lists(pa, np, lengths, schema.field("topic_partitions").type, [
        _take(pa, [f"events.{i}" for i in range(2000)], (rng.zipf(1.2, m) - 1) % 2000),
        pa.array(rng.integers(1, 12, m).astype(np.int32))])
    batches = np.where(np.isin(key, (0, 1)), rng.integers(1, 6, n), 0).astype(np.int32)
    records = (batches * rng.integers(1, 300, n)).astype(np.int64)
    cols["record_batches"] = pa.array(batches)
    cols["record_count"] = pa.array(records)
    lengths = (batches > 0).astype(np.int64)
    m = int(lengths.sum())
    cols["compression"] = _lists(pa, np, lengths, schema.field("compression").type, [
        _take(pa, list(CODECS), rng.integers(0, len(CODECS), m)), pa.array(batches[batches > 0]),
        pa.array(records[batches > 0]), pa.array(req_size[batches > 0])])
    # integer fields: 1-3 per Produce / Fetch / Heartbeat / OffsetCommit row, 1-6 values each
    lengths = np.where(np.isin(key, (0, 1, 8, 12)), rng.integers(1, 4, n), 0)
    m = int(lengths.sum())
    path = rng.integers(0, len(INTEGER_PATHS), m)
    width = np.array([p[3] for p in INTEGER_PATHS])[path]
    count = rng.integers(1, 7, m)
    most = np.where(width == 2, 3, np.where(width == 4, 5, 10))
    # each value's varint length, skewed to small values
    values = int(count.sum())
    owner = np.repeat(np.arange(m), count)
    u_len = np.minimum(rng.geometric(0.55, values), most[owner])
    z_len = np.minimum(np.maximum(u_len + rng.integers(-1, 2, values), 1), most[owner])
    hist_u = np.bincount(owner * 10 + u_len - 1, minlength=m * 10).astype(np.int32)
    hist_z = np.bincount(owner * 10 + z_len - 1, minlength=m * 10).astype(np.int32)
    cols["integer_fields"] = _lists(pa, np, lengths, schema.field("integer_fields").type, [
        _take(pa, [p[0] for p in INTEGER_PATHS], path), _take(pa, [p[1] for p in INTEGER_PATHS], path),
        _take(pa, [p[2] for p in INTEGER_PATHS], path), pa.array(count.astype(np.int32)),
        pa.array((count * width).astype(np.int64)),
        pa.array(np.bincount(owner, weights=u_len, minlength=m).astype(np.int64)),
        pa.array(np.bincount(owner, weights=z_len, minlength=m).astype(np.int64)),
        trimmed_histograms(pa, np, hist_u.reshape(m, 10)), trimmed_histograms(pa, np, hist_z.reshape(m, 10))])
    compact = (first_flex >= 0) & ~flexible
    cols["first_flexible_version"] = pa.array(first_flex.astype(np.int16), mask=first_flex < 0)
    cols["request_compact_size"] = pa.array((req_size - rng.integers(0, 8, n)).astype(np.int32), mask=~compact)
    cols["response_compact_size"] = pa.array((resp_size - rng.integers(0, 8, n)).astype(np.int32),
                                             mask=~compact | acks0)
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def dataset(root: Path, rows: int, chunk: int = 1_000_000) -> Path:
    """`rows` generated exchanges in capture-*.parquet files of up to 5M rows under root/<rows>."""
    import pyarrow.parquet as pq

    where = root / str(rows)
    done = where / "COMPLETE"
    if done.exists():
        return where
    started = time.perf_counter()
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    per_file = 5_000_000
    written, file_no = 0, 0
    while written < rows:
        in_file = min(per_file, rows - written)
        table = generate(min(chunk, in_file), seed=written + 1, first_row=written)
        with pq.ParquetWriter(where / f"capture-{file_no:05d}.parquet", table.schema) as writer:
            done_in_file = 0
            while True:
                writer.write_table(table, row_group_size=256 * 1024)
                done_in_file += table.num_rows
                if done_in_file >= in_file:
                    break
                table = generate(min(chunk, in_file - done_in_file), seed=written + done_in_file + 1,
                                 first_row=written + done_in_file)
        written += in_file
        file_no += 1
    done.write_text(str(rows))
    print(f"generated {rows:,} rows in {time.perf_counter() - started:.1f} s -> {where}", flush=True)
    return where


def pyarrow_read(where: Path) -> tuple[float, float]:
    """Seconds and CPU seconds of a pyarrow read of every column of every capture file."""
    import pyarrow.parquet as pq

    cpu, started = cpu_seconds(os.getpid()), time.perf_counter()
    for file in sorted(where.glob("capture-*.parquet")):
        pq.read_table(file)
    return time.perf_counter() - started, cpu_seconds(os.getpid()) - cpu


def peak_mib(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), MiB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def _processes(spark) -> list[int]:
    """Spark's JVM (the driver, and the executors of a local master), this process (the Python
    driver), and the JVM's Python workers."""
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    return [jvm, os.getpid(), *descendants(jvm)]


def reset_peaks(spark) -> None:
    """Each process's peak resident memory (VmHWM) starts again from its current one (clear_refs 5)."""
    for pid in _processes(spark):
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peaks(spark) -> tuple[float, float, float]:
    """Peak resident MiB since reset_peaks of Spark's JVM, of this process, and of the largest
    Python worker alive."""
    jvm, me, *workers = _processes(spark)
    return peak_mib(jvm), peak_mib(me), max((peak_mib(p) for p in workers), default=0.0)


def run_job(spark, where: Path, driver_rows: int | None = None) -> tuple[float, dict, dict]:
    """Seconds, where they went, and CPU seconds of the whole job: in all (Spark's JVM with its
    Python workers, and this process), and split into the JVM's own, the Python workers' (the
    rest of the JVM's process tree) and this process's (the driver)."""
    out = Path(tempfile.mkdtemp(prefix="kinspect-bench-report-"))
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    me = os.getpid()
    try:
        (own, tree), driver = tree_cpu_seconds(jvm), cpu_seconds(me)
        started = time.perf_counter()
        result = analyze(spark, [str(where)], str(out), driver_rows=driver_rows)
        seconds = time.perf_counter() - started
        (own_after, tree_after), driver = tree_cpu_seconds(jvm), cpu_seconds(me) - driver
        tree, own = tree_after - tree, own_after - own
        # The JVM's own share comes from the same reading as the tree's, so the JVM running on
        # between two readings cannot turn up as the workers'. A worker reaped between the
        # reading of its parent and its own still moves a tick or two out of sight, which on a
        # tiny job would read as a negative share: it is at least nothing.
        workers = max(tree - own, 0.0)
        return seconds, result.seconds, {"job": tree + driver, "jvm": own, "workers": workers, "driver": driver}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _spread(values: list[float], digits: int = 1) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def counted(repetitions: int) -> int:
    """How many first repetitions of a size the medians leave out: the first runs cold (its job
    and its read both pay for fresh memory and pages: 1.3-3x the later ones here, the read
    more than the job, which had a warm-up run), so with three or more it is shown, not counted."""
    return 1 if repetitions >= 3 else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--reps", default="3,2", help="repetitions per size (comma list, last one repeats)")
    parser.add_argument("--data", type=Path, help="where to generate (and keep) the captures; default: a "
                        "temporary directory removed at the end")
    parser.add_argument("--warm-rows", type=int, default=50_000, help="rows of the untimed warm-up run (0: none)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = [int(r) for r in args.reps.split(",")]
    reps += [reps[-1]] * (len(sizes) - len(reps))

    root = args.data or Path(tempfile.mkdtemp(prefix="kinspect-bench-analyze-"))
    try:
        return measure(args, root, sizes, reps)
    finally:
        if args.data is None:
            shutil.rmtree(root, ignore_errors=True)


def measure(args, root: Path, sizes: list[int], reps: list[int]) -> int:
    datasets = {rows: dataset(root, rows) for rows in sizes}
    warm = dataset(root, args.warm_rows) if args.warm_rows > 0 else None
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the tasks' Python: this one, with pyarrow
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).appName("kinspect bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "2g"))
    # what `kinspect analyze` starts its session with for the largest capture measured
    conf = session_conf([str(datasets[max(sizes)])], args.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    print(f"session settings of kinspect analyze for {max(sizes):,} rows on {args.master}: {conf}", flush=True)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = {}
    try:
        if warm is not None:
            # the route the measured sizes take: Spark's read tasks above DRIVER_ROWS, else the driver
            run_job(spark, warm, driver_rows=0 if max(sizes) > DRIVER_ROWS else None)
        for rows, n in zip(sizes, reps):
            jobs, reads, parts, job_cpus, read_cpus, memory, splits = [], [], [], [], [], [], []
            for _ in range(n):
                reset_peaks(spark)
                seconds, where_time, cpu_split = run_job(spark, datasets[rows])
                job_cpu = cpu_split["job"]
                splits.append(cpu_split)
                jvm_peak, driver_peak, worker_peak = peaks(spark)
                # once a pyarrow read of whole files has run here, this process's resident
                # memory holds what its allocator kept of it: no longer the job's own peak
                memory.append((jvm_peak, None if read_cpus or results else driver_peak, worker_peak))
                jobs.append(seconds)
                parts.append(where_time)
                job_cpus.append(job_cpu)
                read, read_cpu = pyarrow_read(datasets[rows])
                reads.append(read)
                read_cpus.append(read_cpu)
            kept = counted(n)
            job, read = statistics.median(jobs[kept:]), statistics.median(reads[kept:])
            job_cpu, read_cpu = statistics.median(job_cpus[kept:]), statistics.median(read_cpus[kept:])
            ratios = [j / r for j, r in zip(jobs, reads)]
            results[rows] = job
            split = {k: statistics.median(p[k] for p in parts[kept:]) for k in ("read", "tables", "report")}
            print(f"{rows:>11,} rows  job {job:7.1f} s (median of {n - kept}{' warm' if kept else ''}: "
                  f"{_spread(jobs)})  {rows / job:>9,.0f} rows/s  "
                  f"pyarrow read {read:6.1f} s ({_spread(reads)})  job/read {job / read:5.2f}x, "
                  f"per repetition {_spread(ratios, 2)} (median {statistics.median(ratios[kept:]):.2f}x)  "
                  f"[read+aggregate {split['read']:.1f} s, tables {split['tables']:.1f} s, "
                  f"report {split['report']:.1f} s]  CPU: job {job_cpu:.1f} s ({_spread(job_cpus)}), "
                  f"read {read_cpu:.1f} s ({_spread(read_cpus)}), job/read {job_cpu / max(read_cpu, 0.01):.2f}x; "
                  f"the job's CPU: JVM {statistics.median(c['jvm'] for c in splits[kept:]):.1f} s, Python workers "
                  f"{statistics.median(c['workers'] for c in splits[kept:]):.1f} s, driver "
                  f"{statistics.median(c['driver'] for c in splits[kept:]):.1f} s  "
                  f"peak RSS in a job: JVM {max(m[0] for m in memory):.0f} MiB, Python driver "
                  + (f"{max(m[1] for m in memory if m[1] is not None):.0f} MiB (its first job)"
                     if memory[0][1] is not None else "n/a (a pyarrow read ran in this process before)")
                  + f", a Python worker {max(m[2] for m in memory):.0f} MiB", flush=True)
    finally:
        spark.stop()
    small, large = sizes[0], sizes[-1]
    if large != small:
        print(f"time({large:,}) / time({small:,}) = {results[large] / results[small]:.2f} "
              f"(ideal linear: {large / small:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
