"""`kinspect analyze CAPTURES --out REPORT`: run the PySpark analysis job on its own SparkSession."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from kinspect.analyze.inputs import (SMALL_ROWS, AnalyzeInputError, check_inputs, check_java, is_local, local_path,
                                     local_rows, session_conf)

# The masters spark-submit knows; anything else fails only after the JVM's start-up.
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]"
    r"|spark://[^\s/:,]+:\d{1,5}(,[^\s/:,]+:\d{1,5})*"
    r"|yarn|k8s://\S+|connect://\S+)$")
# Spark's console logging at ERROR (no WARN lines on a normal run); --verbose keeps Spark's own.
QUIET_LOG4J2 = """\
# The root stays at WARN (at any other level Spark announces a default level of its own);
# the console shows ERROR and up only.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


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
    p.add_argument("--verbose", action="store_true", help="Spark's own log lines (WARN and up); quiet otherwise")
    p.set_defaults(run=run)


def check_master(master: str) -> None:
    if not _MASTER.match(master):
        raise AnalyzeInputError(f"--master {master!r} is not a Spark master URL (local[*], local[N], "
                                "spark://HOST:PORT, yarn, k8s://...)")


def check_out(out: str) -> None:
    """--out must be a directory that exists or can be made (local paths; URIs are Spark's to check)."""
    if not is_local(out):
        return
    where = local_path(out)
    if where.exists() and not where.is_dir():
        raise AnalyzeInputError(f"--out {out} is an existing file, not a directory")
    parent = where
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise AnalyzeInputError(f"--out {out}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AnalyzeInputError(f"--out {out}: {parent} is not writable")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    marks: dict[str, float] = {}

    def say(line: str) -> None:
        print(f"kinspect analyze: {line} [{time.perf_counter() - started:.1f} s]", file=sys.stderr, flush=True)

    try:
        # Every argument is checked before Spark starts (its start alone takes seconds): a
        # missing Java otherwise shows up as a py4j stack trace, a bad path after the job.
        conf = dict(_key_value(item) for item in args.conf)
        check_master(args.master)
        check_out(args.out)
        check_java()
        check_inputs(args.captures)
        conf = {**session_conf(args.captures, args.master), **conf}  # small captures: a cheaper JIT
        spark_session = _import_spark()
    except AnalyzeInputError as exc:
        print(f"kinspect analyze: {exc}", file=sys.stderr)
        return 2
    from kinspect.analyze.job import analyze

    rows = local_rows(args.captures)  # None when a capture path is a URI
    if args.master.startswith("local") and is_local(args.out) and rows is not None and rows <= SMALL_ROWS:
        # A small local capture is read and aggregated in this process (the job's own route for it
        # on a local master): starting Spark would cost more than the whole analysis.
        say(f"{rows:,} capture rows, all local (at most {SMALL_ROWS:,}): aggregated in this process, "
            "Spark not started")
        try:
            result = analyze(None, args.captures, args.out, args.top, args.html, progress=say)
        except AnalyzeInputError as exc:
            print(f"kinspect analyze: {exc}", file=sys.stderr)
            return 2
        s = result.seconds
        say(f"done: Spark not started, read {s.get('read', 0):.1f} s, tables {s.get('tables', 0):.1f} s, "
            f"report {s.get('report', 0):.1f} s")
        return 0
    say(f"starting Spark ({args.master})")
    with tempfile.TemporaryDirectory(prefix="kinspect-analyze-") as scratch:
        spark = spark_session(args.master, conf, progress_bar=sys.stderr.isatty(), verbose=args.verbose,
                              scratch=Path(scratch))
        marks["start"] = time.perf_counter() - started
        try:
            say(f"Spark {spark.version} ready; reading {', '.join(args.captures)}")
            result = analyze(spark, args.captures, args.out, args.top, args.html, progress=say)
        except AnalyzeInputError as exc:
            print(f"kinspect analyze: {exc}", file=sys.stderr)
            return 2
        finally:
            spark.stop()
    s = result.seconds
    say(f"done: Spark start {marks['start']:.1f} s, read {s.get('read', 0):.1f} s, tables {s.get('tables', 0):.1f} s, "
        f"report {s.get('report', 0):.1f} s")
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
        raise AnalyzeInputError("pyspark is not installed: pip install 'kinspect[pipeline]' "
                                "(from a checkout: pip install -e '.[pipeline]')") from None

    def build(master: str, conf: dict, progress_bar: bool, verbose: bool, scratch: Path):
        # Executors start Python workers for some of Spark's own work: they must run this
        # interpreter (the one kinspect and pyspark are installed in), not whatever
        # `python3` comes first on a worker's PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (SparkSession.builder.master(master).appName("kinspect analyze")
                   .config("spark.pyspark.python", sys.executable)
                   .config("spark.pyspark.driver.python", sys.executable)
                   # Spark's own progress bar only where someone watches it
                   .config("spark.ui.showConsoleProgress", str(progress_bar).lower()))
        if not verbose:
            log4j = scratch / "log4j2.properties"
            log4j.write_text(QUIET_LOG4J2, "utf-8")
            options = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
            conf = {**conf, "spark.driver.extraJavaOptions":
                    f"{conf.get('spark.driver.extraJavaOptions', '')} {options}".strip()}
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
        return spark

    return build
