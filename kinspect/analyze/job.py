"""The analyze job: capture files in, tables (Parquet + CSV) and an HTML report out, on any SparkSession.

Use it from Python with a session of your own (`analyze(spark, paths, out)`), from the
`kinspect analyze` command, or with spark-submit, which supplies the master:

    spark-submit --py-files kinspect.zip kinspect/analyze/job.py s3a://bucket/captures --out s3a://bucket/report
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from kinspect.analyze.inputs import CAPTURE_GLOB, AnalyzeInputError, check_inputs, check_schema_version
from kinspect.capture.schema import COLUMN_NAMES

Progress = Callable[[str], None]


@dataclass
class Analysis:
    """What the job computed: every table's rows (as dicts) and Spark schema, in report order."""

    tables: dict[str, list[dict]] = field(default_factory=dict)
    schemas: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)


def read_captures(spark, paths: list[str]):
    """The capture rows of every capture-*.parquet under `paths` (local paths or URIs)."""
    from pyspark.errors import PySparkException

    try:
        df = spark.read.option("pathGlobFilter", CAPTURE_GLOB).parquet(*paths)
    except PySparkException as exc:
        raise AnalyzeInputError(f"cannot read captures at {', '.join(paths)}: {_first_line(exc)}") from None
    missing = [c for c in COLUMN_NAMES if c not in df.columns]
    if missing:
        raise AnalyzeInputError(f"malformed captures at {', '.join(paths)}: missing columns {', '.join(missing)}")
    return df.select(*COLUMN_NAMES)


def compute(spark, paths: list[str], top: int = 50, progress: Progress | None = None) -> Analysis:
    """Every table of the report, collected on the driver (they are small aggregates).

    Each table reads the files again, but only its own columns (Parquet column pruning):
    measured on 1M rows, that beat caching the captures in Spark (33 s against 39-51 s).
    """
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    from kinspect.analyze.tables import TABLES

    say = progress or (lambda _: None)
    paths = check_inputs(paths)
    df = read_captures(spark, paths)
    result = Analysis(paths=paths)
    for name, (build, _) in TABLES.items():
        started = time.perf_counter()
        frame = build(df, top)
        spark.sparkContext.setJobDescription(f"kinspect analyze: {name}")
        try:
            rows = [r.asDict(recursive=True) for r in frame.collect()]
        except (PySparkException, Py4JJavaError) as exc:
            if name != "summary":
                raise
            # the first table reads every file: a corrupt remote file shows up here
            raise AnalyzeInputError(f"cannot read captures at {', '.join(paths)}: {_first_line(exc)}") from None
        if name == "summary":
            if not rows or not rows[0]["exchanges"]:
                raise AnalyzeInputError(f"no capture rows in {', '.join(paths)}")
            check_schema_version(rows[0]["max_schema_version"], ", ".join(paths))
        result.tables[name] = rows
        result.schemas[name] = frame.schema
        result.seconds[name] = time.perf_counter() - started
        say(f"{name}: {len(rows)} rows ({result.seconds[name]:.1f} s)")
    return result


def analyze(spark, paths: list[str], out: str, top: int = 50, html: bool = True,
            progress: Progress | None = None) -> Analysis:
    """Compute every table and write REPORT/tables/<name>/ (Parquet), REPORT/tables/<name>.csv, REPORT/report.html."""
    from kinspect.analyze import output

    say = progress or (lambda _: None)
    result = compute(spark, paths, top, progress)
    output.ensure_dir(out)
    for name, rows in result.tables.items():
        output.write_table(spark, out, name, result.schemas[name], rows)
    say(f"tables written to {output.join(out, 'tables')}")
    if html:
        from kinspect.analyze.report import render_report

        output.write_bytes(spark, output.join(out, "report.html"), render_report(result).encode())
        say(f"report written to {output.join(out, 'report.html')}")
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


if __name__ == "__main__":
    sys.exit(main())
