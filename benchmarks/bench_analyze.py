"""How long `kinspect analyze` takes on local[2] for 1M and 5M captured exchanges, and how it grows.

    python benchmarks/bench_analyze.py [--sizes 1000000,5000000] [--reps 3,2] [--data DIR]

Captures are generated once per size into --data (default /tmp/kinspect-bench-analyze/<rows>/,
reused by later runs): 200k distinct generated exchanges (kinspect.analyze.sample_data)
repeated to the size, 4 files. Each repetition runs the whole job (every table, Parquet,
CSV and report.html into a fresh directory) on one SparkSession (local[2], 2 GB driver),
after one warm-up run on 50k rows. Printed per size: median seconds, rows per second, and
the peer measured in the same run: a plain pyarrow read of the same files (all columns).
Last, time(largest) / time(smallest) against the ideal ratio of the sizes.
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

from kinspect.analyze.job import analyze  # noqa: E402
from kinspect.analyze.sample_data import write_captures  # noqa: E402


def dataset(root: Path, rows: int) -> Path:
    where = root / str(rows)
    if not (where / "capture-00003.parquet").exists():
        started = time.perf_counter()
        shutil.rmtree(where, ignore_errors=True)
        write_captures(where, rows, files=4, seed=1, distinct=min(rows, 200_000))
        print(f"generated {rows:,} rows in {time.perf_counter() - started:.0f} s -> {where}", flush=True)
    return where


def pyarrow_read(where: Path) -> float:
    import pyarrow.parquet as pq

    started = time.perf_counter()
    for file in sorted(where.glob("capture-*.parquet")):
        pq.read_table(file)
    return time.perf_counter() - started


def run_job(spark, where: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="kinspect-bench-report-"))
    try:
        started = time.perf_counter()
        analyze(spark, [str(where)], str(out))
        return time.perf_counter() - started
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--reps", default="3,2", help="repetitions per size (comma list, last one repeats)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/kinspect-bench-analyze"))
    parser.add_argument("--warm-rows", type=int, default=50_000, help="rows of the untimed warm-up run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = [int(r) for r in args.reps.split(",")]
    reps += [reps[-1]] * (len(sizes) - len(reps))

    datasets = {rows: dataset(args.data, rows) for rows in sizes}
    warm = dataset(args.data, args.warm_rows)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("kinspect bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        run_job(spark, warm)
        results = {}
        for rows, n in zip(sizes, reps):
            times = [run_job(spark, datasets[rows]) for _ in range(n)]
            peer = statistics.median(pyarrow_read(datasets[rows]) for _ in range(n))
            results[rows] = statistics.median(times)
            print(f"{rows:>10,} rows  job {results[rows]:7.1f} s (median of {n}: "
                  f"{', '.join(f'{t:.1f}' for t in times)})  {rows / results[rows]:>9,.0f} rows/s  "
                  f"pyarrow read {peer:5.1f} s  job/read {results[rows] / peer:5.1f}x", flush=True)
    finally:
        spark.stop()
    small, large = sizes[0], sizes[-1]
    if large != small:
        print(f"time({large:,}) / time({small:,}) = {results[large] / results[small]:.2f} "
              f"(ideal linear: {large / small:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
