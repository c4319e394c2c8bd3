"""The analyze job: capture files in, tables (Parquet + CSV) and an HTML report out, on any SparkSession.

Use it from Python with a session of your own (`analyze(spark, paths, out)`), from the
`kinspect analyze` command, or with spark-submit, which supplies the master:

    spark-submit --py-files kinspect.zip kinspect/analyze/job.py s3a://bucket/captures --out s3a://bucket/report
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from kinspect.analyze.inputs import AnalyzeInputError, check_inputs, check_schema_version

Progress = Callable[[str], None]


@dataclass
class Analysis:
    """What the job computed: every table's rows (as dicts) and Spark schema, in report order."""

    tables: dict[str, list[dict]] = field(default_factory=dict)
    schemas: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    fact_rows: int = 0


# the tables that take longest on the driver (the 5M capture's: 0.2, 0.1 and 0.05 s), started first
COSTLY = ("api_sizes", "upgrade_versions", "kip482_savings")

# Shuffle partitions: one per SHUFFLE_UNIT of input up to LINEAR_UNITS of them, then the
# geometric mean of the two, sqrt(LINEAR_UNITS x units): growing as the square root of the input.
SHUFFLE_UNIT = 64 << 20
LINEAR_UNITS = 9
MAX_PARTITIONS = 400


def size_shuffle(spark, input_bytes: int) -> int:
    """The shuffle's partitions, sized to the input: one per 64 MB of capture files up to 9,
    then 3 x the square root of that (22 for 3.3 GB); at least the cores once there are two
    or more, and one for a small input, whose tasks would be mostly scheduling.

    Every read task splits its partial rows into a bucket per partition, so the shuffle's
    blocks are read tasks x partitions: with partitions linear in the input they grew as its
    square, and each block costs a fixed part (its IPC stream and dictionaries, a record in
    the JVM, a table to cast and join in the merge). 50M rows (3.3 GB) with 53 partitions
    took 117-121 CPU s against 89-99 s with 24. The merge's rows per partition grow with the
    square root of the input instead: a worker's peak memory went from 590-830 to 700-930 MiB.
    """
    cores = spark.sparkContext.defaultParallelism
    units = input_bytes / SHUFFLE_UNIT
    partitions = min(MAX_PARTITIONS, math.ceil(min(units, math.sqrt(LINEAR_UNITS * units))))
    return 1 if partitions <= 1 else max(cores, partitions)


def compute(spark, paths: list[str], top: int = 50, progress: Progress | None = None,
            targets: dict | None = None, driver_rows: int | None = None) -> Analysis:
    """Every table of the report, derived on the driver from a few aggregates of the captures.

    The captures are read once, each needed column once: a few narrow aggregations
    (kinspect.analyze.aggregates), each reading its own columns with pyarrow in Spark's
    tasks and merged by Spark, run side by side and are collected on the driver (Arrow);
    every table is derived from them there (kinspect.analyze.tables, .upgrade). A local
    capture of at most `driver_rows` rows (default: kinspect.analyze.scan.DRIVER_ROWS with a
    local master, 0 on a cluster) is read and aggregated in this process instead; then
    `spark` may be None (no Spark at all: what the CLI does for a small local capture).
    `targets` are the upgrade targets (kinspect.analyze.upgrade; default: every release of
    the shipped specs).
    """
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import from_arrow_schema
    from py4j.protocol import Py4JJavaError

    from kinspect.analyze import aggregates, scan
    from kinspect.analyze.tables import TABLES, Aggregates
    from kinspect.analyze.upgrade import UPGRADE_TABLES, builtin_targets
    from kinspect.protocol.errors import SpecError

    say = progress or (lambda _: None)
    paths = check_inputs(paths)
    specs = None
    if targets is None:
        # the shipped specs are parsed (0.1 s) on a thread of their own while the captures are read
        loader = ThreadPoolExecutor(1, thread_name_prefix="kinspect-specs")
        specs = loader.submit(builtin_targets)
        loader.shutdown(wait=False)
    started = time.perf_counter()
    pieces = scan.plan(spark, paths, driver_rows)
    result = Analysis(paths=paths)
    if pieces.on_driver is not None:
        try:
            aggs = aggregates.on_driver(pieces)
        except ValueError as exc:  # a malformed file, found by the driver's own read
            raise AnalyzeInputError(str(exc)) from None
        how = "read on the driver"
    else:
        from kinspect.analyze.handoff import local_master

        partitions = size_shuffle(spark, pieces.input_bytes)
        try:
            aggs = aggregates.compute(spark, pieces, partitions)
        except (PySparkException, Py4JJavaError) as exc:
            # the one pass reads every file: a corrupt remote file shows up here
            raise AnalyzeInputError(f"cannot read captures at {', '.join(paths)}: {scan.first_line(exc)}") from None
        how = (f"{pieces.tasks} read tasks, {partitions} merging tasks, "
               f"{'partial rows through local files' if local_master(spark) else 'partial rows shuffled'}")
    aggs = Aggregates(aggs)  # what several tables derive from the aggregates is computed once
    result.fact_rows = sum(agg.num_rows for agg in aggs.values())
    result.seconds["read"] = time.perf_counter() - started
    say(f"read: captures aggregated into {result.fact_rows:,} rows "
        f"({', '.join(f'{name} {agg.num_rows:,}' for name, agg in aggs.items())}; "
        f"{how}, {result.seconds['read']:.1f} s)")
    started = time.perf_counter()
    if specs is not None:
        try:
            targets = specs.result()
        except SpecError as exc:  # e.g. a driver given the package without its specs/ (a --py-files zip)
            say(f"no upgrade tables: {exc}")
            targets = {}
    builders = {name: (lambda aggs, build=build: build(aggs, top), schema)
                for name, (build, _, schema) in TABLES.items()}
    if targets:
        builders |= {name: (lambda aggs, build=build: build(aggs, targets), schema)
                     for name, (build, _, schema) in UPGRADE_TABLES.items()}

    def timed(name, build):
        began = time.perf_counter()
        rows = build(aggs)
        result.seconds[name] = time.perf_counter() - began
        return rows

    # two threads: the tables' work is mostly numpy and Arrow kernels, which release the GIL
    # (the sorts of the values aggregate, the hashing of the upgrade tables), and the cores
    # are free once Spark's job is done; the costliest tables are started first
    with ThreadPoolExecutor(2, thread_name_prefix="kinspect-tables") as pool:
        first_ones = [name for name in COSTLY if name in builders]
        ordered = first_ones + [name for name in builders if name not in first_ones]
        futures = {name: pool.submit(timed, name, builders[name][0]) for name in ordered}
        for name, (_, schema) in builders.items():  # report order
            rows = futures[name].result()
            if name == "summary":
                if not rows or not rows[0]["exchanges"]:
                    raise AnalyzeInputError(f"no capture rows in {', '.join(paths)}")
                check_schema_version(rows[0]["max_schema_version"], ", ".join(paths))
            result.tables[name] = rows
            result.schemas[name] = from_arrow_schema(schema)
    result.seconds["tables"] = time.perf_counter() - started
    say(f"tables: {len(builders)} tables on the driver ({result.seconds['tables']:.1f} s)")
    return result


def analyze(spark, paths: list[str], out: str, top: int = 50, html: bool = True,
            progress: Progress | None = None, targets: dict | None = None,
            driver_rows: int | None = None) -> Analysis:
    """Compute every table and write REPORT/tables/<name>/ (Parquet), REPORT/tables/<name>.csv, REPORT/report.html."""
    from kinspect.analyze import output

    say = progress or (lambda _: None)
    result = compute(spark, paths, top, progress, targets, driver_rows)
    started = time.perf_counter()
    output.ensure_dir(out)
    for name, rows in result.tables.items():
        output.write_table(spark, out, name, result.schemas[name], rows)
    say(f"tables written to {output.join(out, 'tables')}")
    if html:
        from kinspect.analyze.report import render_report

        output.write_bytes(spark, output.join(out, "report.html"), render_report(result).encode())
        say(f"report written to {output.join(out, 'report.html')}")
    result.seconds["report"] = time.perf_counter() - started
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("captures", nargs="+", metavar="CAPTURES",
                        help="capture directory, file or URI (s3a://, hdfs://, file://...); several allowed")
    parser.add_argument("--out", required=True, metavar="REPORT",
                        help="output directory or URI: tables/ (Parquet and CSV) and report.html")
    parser.add_argument("--top", type=_positive, default=50, metavar="N", help="rows of top_clients and top_topics (50)")
    parser.add_argument("--no-html", dest="html", action="store_false", help="write the tables only")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--top must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry: the master and resources come from spark-submit's own options."""
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(prog="kinspect-analyze", description="kinspect's capture analysis job")
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("kinspect analyze").getOrCreate()
    try:
        analyze(spark, args.captures, args.out, args.top, args.html,
                progress=lambda line: print(f"kinspect analyze: {line}", file=sys.stderr, flush=True))
    except AnalyzeInputError as exc:
        print(f"kinspect analyze: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
