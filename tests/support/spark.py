"""One SparkSession for the whole test run (local[2], loopback only, no UI, few shuffle partitions)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    # pyspark is imported here, not at module level, so tests that do not use Spark never load it
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (the job's read tasks) run the tests' interpreter, with its pyarrow: PySpark
    # takes their executable from this variable when its context starts
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from kinspect.analyze.inputs import SMALL_CAPTURE_CONF

    session = (SparkSession.builder.master("local[2]").appName("kinspect tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               # tiny inputs: 4 shuffle partitions instead of 200 keep every aggregate quick
               .config("spark.sql.shuffle.partitions", "4")
               # the tests' captures are small: the JIT the CLI gives such captures (C1 only), which
               # costs the test run far less CPU; code generation stays on, so that path is tested too
               .config("spark.driver.extraJavaOptions", SMALL_CAPTURE_CONF["spark.driver.extraJavaOptions"])
               .config("spark.pyspark.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


class StandaloneCluster:
    """A real Spark standalone cluster on loopback: one master and one worker, started from the
    pyspark package's own jars (its launcher classes), on random ports, stopped on exit."""

    def __init__(self, workdir, cores: int = 2, memory: str = "1g", timeout: float = 240.0):
        from pathlib import Path

        import pyspark

        self.home = Path(pyspark.__file__).parent  # jars/ is what SPARK_HOME must hold
        self.workdir = Path(workdir)
        self.cores, self.memory, self.timeout = cores, memory, timeout
        self.procs: list = []
        self.url = ""

    def _start(self, name: str, args: list[str], ready: str):
        import subprocess
        import time

        from kinspect.analyze.inputs import check_java

        log = self.workdir / f"{name}.log"
        # the worker builds each executor's command from SPARK_HOME/jars; outside a Spark build
        # it must be told the Scala version (the one of pyspark's own spark-core jar)
        core = next((self.home / "jars").glob("spark-core_*.jar")).name
        scala = core.split("_", 1)[1].split("-", 1)[0]
        env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_SCALA_VERSION": scala, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOCAL_DIRS": str(self.workdir / "local"), "SPARK_LOG_DIR": str(self.workdir)}
        with open(log, "wb") as out:
            # the master and worker only schedule: C1 is all the JIT they need
            proc = subprocess.Popen([check_java(), "-Xmx512m", "-XX:TieredStopAtLevel=1", "-cp", f"{self.home / 'jars'}/*", *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        self.procs.append(proc)
        deadline = time.monotonic() + self.timeout
        while ready not in log.read_text("utf-8", "replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text("utf-8", "replace")[-3000:]
                self.stop()
                raise RuntimeError(f"Spark {name} did not start ({ready!r} not logged):\n{tail}")
            time.sleep(0.2)

    def __enter__(self) -> "StandaloneCluster":
        from tests.support.tansu import free_port

        (self.workdir / "local").mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(ui)], "Starting Spark master at")
        self._start("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--webui-port", str(free_port()), "--cores", str(self.cores), "--memory",
                               self.memory, "--work-dir", str(self.workdir / "work"), self.url],
                    "Successfully registered with master")
        return self

    def stop(self) -> None:
        import subprocess

        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()

    def __exit__(self, *exc) -> None:
        self.stop()
