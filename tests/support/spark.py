"""One SparkSession for the whole test run (local[2], loopback only, no UI, few shuffle partitions)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def spark():
    # pyspark is imported here, not at module level, so tests that do not use Spark never load it
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("kinspect tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               # tiny inputs: 4 shuffle partitions instead of 200 keep every aggregate quick
               .config("spark.sql.shuffle.partitions", "4")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
