"""Writing the job's results: Parquet through Spark, CSV and HTML as single files on any Hadoop filesystem."""

from __future__ import annotations

import csv
import datetime as dt
import io
import shutil
from pathlib import Path

from kinspect.analyze.inputs import is_local, local_path


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def write_bytes(spark, path: str, data: bytes) -> None:
    """One file at a local path or at any URI the session's Hadoop filesystems write."""
    if is_local(path):
        target = local_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    else:
        hadoop_write(spark, path, data)


def hadoop_write(spark, uri: str, data: bytes) -> None:
    """One file through the session's Hadoop FileSystem for the URI's scheme (s3a, hdfs, abfss, file...)."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(hadoop_path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def csv_text(columns: list[str], rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_value(row[c]) for c in columns])
    return out.getvalue()


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)
    return value


def write_table(spark, out: str, name: str, schema, rows: list[dict]) -> None:
    """tables/<name>/ as Parquet (one file) and tables/<name>.csv, from rows already on the driver."""
    if is_local(out):
        # a small table on the driver: pyarrow writes it in milliseconds, a Spark job takes a second
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        directory = local_path(join(out, "tables", name))
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, to_arrow_schema(schema)), directory / "part-00000.parquet")
    else:
        spark_parquet(spark, join(out, "tables", name), schema, rows)
    write_bytes(spark, join(out, "tables", f"{name}.csv"), csv_text(schema.names, rows).encode())


def spark_parquet(spark, uri: str, schema, rows: list[dict]) -> None:
    """A directory of Parquet (one file) written by Spark, for URIs pyarrow may not reach."""
    frame = spark.createDataFrame([tuple(r[c] for c in schema.names) for r in rows], schema)
    frame.coalesce(1).write.mode("overwrite").parquet(uri)


def ensure_dir(out: str) -> None:
    if is_local(out):
        Path(local_path(out)).mkdir(parents=True, exist_ok=True)
