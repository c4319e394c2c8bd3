"""`kinspect analyze CAPTURES --out REPORT`: run the PySpark analysis job on its own SparkSession."""

from __future__ import annotations

import argparse
import sys
import time

from kinspect.analyze.inputs import AnalyzeInputError, check_inputs, check_java


def add_parser(commands) -> None:
    from kinspect.analyze.job import add_arguments

    p = commands.add_parser(
        "analyze", help="analyze capture files with PySpark: tables and an HTML report",
        description="Reads capture-*.parquet files (local paths or any URI Spark's Hadoop filesystems read) and "
        "writes REPORT/tables/<name>/ (Parquet), REPORT/tables/<name>.csv and REPORT/report.html. "
        "For a cluster, use --master or spark-submit with kinspect/analyze/job.py (deploy/spark/README.md).",
    )
    add_arguments(p)
    p.add_argument("--master", default="local[*]", help="Spark master URL (local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark configuration property (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()

    def say(line: str) -> None:
        print(f"kinspect analyze: {line} [{time.perf_counter() - started:.1f} s]", file=sys.stderr, flush=True)

    try:
        conf = dict(_key_value(item) for item in args.conf)
        # Both checks run before Spark starts: a missing Java otherwise shows up as a
        # py4j stack trace, and a bad local capture only after the JVM's start-up.
        check_java()
        check_inputs(args.captures)
        spark_session = _import_spark()
    except AnalyzeInputError as exc:
        print(f"kinspect analyze: {exc}", file=sys.stderr)
        return 2
    from kinspect.analyze.job import analyze

    say(f"starting Spark ({args.master})")
    spark = spark_session(args.master, conf, progress_bar=sys.stderr.isatty())
    try:
        say(f"Spark {spark.version} ready; reading {', '.join(args.captures)}")
        analyze(spark, args.captures, args.out, args.top, args.html, progress=say)
    except AnalyzeInputError as exc:
        print(f"kinspect analyze: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    say("done")
    return 0


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise AnalyzeInputError(f"--conf {item!r}: expected KEY=VALUE")
    return key, value


def _import_spark():
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise AnalyzeInputError("pyspark is not installed: pip install 'kinspect[pipeline]'") from None

    def build(master: str, conf: dict, progress_bar: bool):
        builder = (SparkSession.builder.master(master).appName("kinspect analyze")
                   # Spark's own progress bar only where someone watches it
                   .config("spark.ui.showConsoleProgress", str(progress_bar).lower()))
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        return spark

    return build
