"""Checks on what the analyze job is given: Java, capture paths, capture files and their schema version.

Each failure is an `AnalyzeInputError` whose message is one line naming the path or
the thing missing; the CLI prints it and exits with status 2. Local paths are checked
file by file (Parquet footers only) before Spark starts; other URIs (s3a://, hdfs://...)
are checked by the job itself through Spark.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from kinspect.capture.schema import COLUMN_NAMES, METADATA_VERSION_KEY, SCHEMA_VERSION, column_names

# columns every capture file has (schema v1); the v2 ones (issue 13) are optional and read as null
OPTIONAL_COLUMNS = ("client_software_name", "client_software_version", "record_magics")
REQUIRED_COLUMNS = tuple(name for name in COLUMN_NAMES if name not in OPTIONAL_COLUMNS)
CAPTURE_GLOB = "capture-*.parquet"  # writers write *.parquet.tmp and rename, so .tmp never matches
MALFORMED = "malformed capture file"  # how every error about one bad file starts
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def row_runs(rows, target: int) -> list[list[int]]:
    """Consecutive runs of items of `rows` rows each (row groups), about `target` rows a run, as
    lists of the items' indices: an item joins the run before it when more than half of it fits
    within `target` and the run stays within a quarter over it. (Closing a run before any item
    that would pass `target` made the 5M benchmark capture's row groups of 262,144 rows into
    pieces of one group each, for a target of 500,000: half the rows a piece, and every
    piece's partial rows grouped and shuffled again.)"""
    runs: list[list[int]] = []
    run_rows = 0
    for index, more in enumerate(rows):
        if runs and run_rows + more / 2 < target and run_rows + more <= target * 5 // 4:
            runs[-1].append(index)
            run_rows += more
        else:
            runs.append([index])
            run_rows = more
    return runs


class AnalyzeInputError(Exception):
    """Bad input for the analyze job (the message is one line, meant for a user)."""


def is_local(path: str) -> bool:
    return path.startswith("file://") or not _URI.match(path)


def local_path(path: str) -> Path:
    return Path(path[len("file://"):] if path.startswith("file://") else path)


def check_java() -> str:
    """The java executable Spark will start, or an error saying how to provide one."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        raise AnalyzeInputError(f"JAVA_HOME is {home} but {java} is not an executable; "
                                "Spark needs Java 17 or 21")
    found = shutil.which("java")
    if found:
        return found
    raise AnalyzeInputError("Java not found: no `java` on PATH and JAVA_HOME is not set; "
                            "Spark needs Java 17 or 21 (install a JDK or set JAVA_HOME)")


def capture_files(path: str) -> list[Path]:
    """The capture files of a local directory (or the one file named), checked."""
    where = local_path(path)
    if not where.exists():
        raise AnalyzeInputError(f"capture directory not found: {path}")
    if not os.access(where, os.R_OK | (os.X_OK if where.is_dir() else 0)):
        raise AnalyzeInputError(f"cannot read {path}: permission denied")
    if where.is_file():
        files = [where]
    else:
        files = sorted(where.glob(CAPTURE_GLOB))
        if not files:
            raise AnalyzeInputError(f"no capture files ({CAPTURE_GLOB}) in {path}")
    for file in files:
        if not file.is_file():
            raise AnalyzeInputError(f"{MALFORMED} {file}: not a file")
        if not os.access(file, os.R_OK):
            raise AnalyzeInputError(f"cannot read capture file {file}: permission denied")
        check_capture_file(file)
    return files


def check_capture_file(file: Path) -> int:
    """The schema version of one capture file, read from its Parquet footer."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(file)
        names = set(pq.read_schema(file).names)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError... for a bad footer
        raise AnalyzeInputError(f"{MALFORMED} {file}: {_one_line(exc)}") from None
    raw = (meta.metadata or {}).get(METADATA_VERSION_KEY)
    if raw is None:
        raise AnalyzeInputError(f"{MALFORMED} {file}: no {METADATA_VERSION_KEY.decode()} metadata")
    try:
        version = int(raw)
    except ValueError:
        raise AnalyzeInputError(f"{MALFORMED} {file}: schema version {raw!r} is not a number") from None
    check_schema_version(version, str(file))
    missing = [name for name in column_names(version) if name not in names]
    if missing:
        raise AnalyzeInputError(f"{MALFORMED} {file}: missing columns {', '.join(missing)}")
    return version


def check_schema_version(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise AnalyzeInputError(f"{where} has capture schema version {version}; this kinspect reads "
                                f"versions up to {SCHEMA_VERSION} (upgrade kinspect)")
    if version < 1:
        raise AnalyzeInputError(f"{where} has capture schema version {version}, which does not exist")


def check_inputs(paths: list[str]) -> list[str]:
    """Check every local path now; return the paths for Spark to read (local ones as absolute)."""
    if not paths:
        raise AnalyzeInputError("no capture paths given")
    out = []
    for path in paths:
        if is_local(path):
            capture_files(path)
            # a file: URI, so that a cluster's default filesystem (hdfs) is not assumed
            out.append(local_path(path).resolve().as_uri())
        else:
            out.append(path)
    return out


# Up to this many capture rows, the driver JVM compiles with C1 only: a small capture
# takes a few seconds of work, and C2's compilations of Spark's code would cost more CPU
# than they save (measured on 3,000 rows: 12.2 + 8.2 s of JVM CPU instead of 20.0 + 15.8 s
# for the read and the tables of a fresh session). Whole-stage code generation is off for
# them too: compiling each query's generated Java costs more than it saves on a few
# thousand rows (3,000 rows, three pairs of CLI runs: 14.4-15.4 s instead of 15.6-18.2 s,
# 19.2-20.6 instead of 21.3-23.0 CPU s). Larger captures keep code generation; on a local
# master they get C1 too (LOCAL_MASTER_CONF).
SMALL_ROWS = 200_000
SMALL_CAPTURE_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
                      "spark.sql.codegen.wholeStage": "false"}
# A larger capture on a local master: the executors run in the driver's JVM, and their work
# in this job is moving a few hundred rows of Arrow bytes (copies, LZ4 through JNI, sockets),
# not compiled per-row code; C2 still compiled for 0.7 to 1.5 s of CPU in every 5M-row job
# of a warm session, C1 for 0.1 to 0.2 s, the task threads' CPU unchanged (1.2 to 1.4 s):
# the JVM's CPU per job 2.3 to 3.5 s -> 1.8 to 1.9 s.
LOCAL_MASTER_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}


def local_rows(paths: list[str]) -> int | None:
    """Rows of every local capture file (Parquet footers), or None when a path is a remote URI."""
    import pyarrow.parquet as pq

    if not all(is_local(path) for path in paths):
        return None
    return sum(pq.read_metadata(file).num_rows for path in paths for file in capture_files(path))


def session_conf(paths: list[str], master: str) -> dict[str, str]:
    """Spark settings the CLI starts its session with for these captures (the user's --conf wins).

    The driver runs here whatever the master (the CLI's sessions are client mode), and on a
    small capture its work is mostly planning: C1 suits it on a cluster too. A larger
    capture gets C1 on a local master (LOCAL_MASTER_CONF). Executors elsewhere keep their
    cluster's own settings."""
    rows = local_rows(paths)
    if rows is not None and rows <= SMALL_ROWS:
        return dict(SMALL_CAPTURE_CONF)
    return dict(LOCAL_MASTER_CONF) if master.startswith("local") else {}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
