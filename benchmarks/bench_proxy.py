"""What kinspect costs a Kafka client: throughput, latency and the proxy's CPU, direct, through kinspect, through haproxy.

    python benchmarks/bench_proxy.py [--quick] [--json PATH] [--reps N] [--records N] [--budget S]
                                     [--paths P,..] [--small-only | --no-small] [--small-requests N]
                                     [--connections N] [--in-flight N] [--idle N] [--[no-]pin]
                                     [--profile DIR] [--baseline TREE]

Full run (`make bench`): up to 7 repetitions (never more than --budget, 300 s, once 3 are
done) of the bulk load (100k x 1 KB records) and the small-request load (8 connections x
400 requests per phase), then 10,000 idle connections: about 6 minutes on a 2-core machine.
--quick: 3 repetitions of 20k records and 100 requests per phase, 1,000 idle connections.

Paths (each cell starts a fresh Tansu broker advertising the address its clients must use):
  direct                Tansu alone; clients bootstrap from it
  kinspect-passthrough  kinspect proxy --mode passthrough in front of Tansu, metrics on (the
                        sidecar's default config); Tansu advertises the proxy's port
  kinspect-nometrics    the same with --no-metrics (metrics on vs off: what metrics cost)
  kinspect-capture      kinspect-passthrough with --capture-dir (what Parquet capture costs)
  kinspect-rewrite      kinspect proxy --mode rewrite --node-port-base N; Tansu advertises
                        itself and kinspect rewrites the addresses (node 111 -> port N+111)
  haproxy               Debian's haproxy, mode tcp, one frontend, one backend server; Tansu
                        advertises haproxy's port
Every proxy runs as a process of its own (`kinspect proxy ...`, `haproxy -db`) so that its CPU
time can be read from /proc.

Bulk load, in every cell (one path, one repetition):
  produce   confluent-kafka Producer, --records records of --record-size bytes to a
            1-partition topic, acks=all, linger.ms=5, batch.size=1000000, no compression;
            timed from the first produce() to the end of flush()
  consume   confluent-kafka Consumer reading the same records from offset 0; timed until
            the last record is in hand
  ApiVersions / Metadata latency: one blocking raw socket, one request at a time
  produce latency: confluent-kafka, acks=1, linger.ms=0, one record in flight
  and the proxy's CPU per MB forwarded in the produce and consume phases.

Small-request load (benchmarks/small_requests.py), in every cell: raw-socket clients send
frames built once with kinspect's own codec (only the correlation id changes), so the load
is cheap and the same on every path: ApiVersions v3, Metadata v12 (one topic), Produce v9
(acks=1, one 100-byte record per request, as with linger.ms=0) and Fetch v12 (of a topic
holding 5 such records: about 900 bytes of batches per response), each on --connections connections with one request at a time
("serial") then --in-flight pipelined, then one at a time at a fixed rate (--paced-rate requests a
second in all, for --paced-seconds: "paced@RATE"). Each phase reports requests/s, the proxy's CPU time
per request, its ratio to haproxy's, the spread over repetitions and the p50/p99 round trip
added to direct's. The latency targets are judged on the paced phases: the serial phases are a closed
loop that keeps the machine's cores busy, where a round trip is the connections over the throughput
(Little's law), so what a path adds there is the throughput its CPU takes from the others, haproxy's too.
A paced request that falls due while the one before is still out is sent when that answer comes, and
its round trip counts from when it fell due (no coordinated omission).

CPU time: the proxy's threads' time on a CPU from /proc/<pid>/task/*/schedstat (ns
resolution) between the first request and the last response of a phase; utime+stime from
/proc/<pid>/stat (10 ms ticks) is kept beside it in the JSON as a cross-check. A capture's writer
process, the proxy's child, counts as the proxy's CPU; a line under the small-request table gives its part
a request (roughly: a batch waits up to capture's BATCH_SECONDS, so a phase's last rows may be built in the next).

Pinning (--pin; off by default): the proxy runs under `taskset` on the last CPU, the broker,
the clients and this script on the others; the output says what was pinned. Pinned runs have
a smaller spread but a different cost: every hop becomes a cross-CPU wake-up, which triples
haproxy's kernel time per request (docs/performance.md compares both ways).

Idle memory: --idle N connections through kinspect (metrics on), each after one ApiVersions
exchange, then idle; RSS per connection = RSS growth / N. RLIMIT_NOFILE is raised for this
(up to the hard limit, or beyond it when run as root); the output says what was allowed.

Repetitions interleave the paths (the order rotates every repetition) so machine noise is
spread over all of them; tables show medians over repetitions, spreads are (max - min) /
median. Client, broker and proxy share the machine, which is part of what this measures.

--baseline TREE adds, for each kinspect path, the same path run from another kinspect source
tree (`kinspect-passthrough@baseline`...: PYTHONPATH=TREE, the same venv), in the same
repetitions: a before/after comparison whose two sides share the machine's load. Make the
tree with `git archive REF | tar -x -C TREE` and copy or build its C extension
(kinspect/protocol/codec/_wire*.so) into it, or it runs the pure-Python codec.

--profile DIR attaches `py-spy record` to every kinspect process (raw collapsed stacks,
one file per cell, in DIR) and prints where the samples went (benchmarks/profile_summary.py);
the sampling costs CPU, so the numbers of such a run are not comparable with an unprofiled run.

Every process started (brokers, proxies, py-spy) is stopped on exit, on failure, on
Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka import libversion as rdkafka_libversion  # noqa: E402
from confluent_kafka import __version__ as confluent_version  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from kinspect.protocol.codec import Codec  # noqa: E402
from tests.support.tansu import TansuBroker, free_port, tansu_version  # noqa: E402

import idle_connections  # noqa: E402
import profile_summary  # noqa: E402
import small_requests  # noqa: E402
from proc_cpu import CpuMeter, pin_command, pin_self, raise_nofile  # noqa: E402

HAPROXY_THREADS = 1  # kinspect forwards on one event-loop thread: haproxy gets one thread too (--haproxy-threads)
# Pinning measured against not pinning, once (docs/performance.md): pinned, the spread of CPU per
# request fell (median 30% -> 12% one at a time) but every hop became a cross-CPU wake-up that
# tripled haproxy's kernel time per request, so ratios to haproxy shrank (3.0x -> 1.7x): pinning
# measures another set-up, hence off unless asked for.
PIN_DEFAULT = False
PATHS = ["direct", "kinspect-passthrough", "kinspect-nometrics", "kinspect-capture", "kinspect-rewrite", "haproxy"]
KINSPECT_PATHS = ["kinspect-passthrough", "kinspect-nometrics", "kinspect-capture", "kinspect-rewrite"]
BASELINE = "@baseline"  # suffix of a kinspect path run from the --baseline tree


def is_kinspect(path: str) -> bool:
    return path.removesuffix(BASELINE) in KINSPECT_PATHS
TANSU_NODE_ID = 111
HOST = "127.0.0.1"

# Issue 12's targets, with the sidecar's default config (metrics on) and with capture on.
THROUGHPUT_TARGET = 0.97  # fraction of direct, and not below haproxy's in the same run
ADDED_P50_TARGET_MS = 0.1
ADDED_P99_TARGET_MS = 0.5
CPU_PER_MB_TARGET = 1.2  # x haproxy's, bulk load
CPU_PER_REQUEST_TARGET = {"kinspect-passthrough": 1.5, "kinspect-capture": 2.5}  # x haproxy's, one at a time

PRESETS = {
    # records, reps, ApiVersions requests, Metadata requests, produce-latency records
    # small_requests: per connection and small-request phase; idle: connections held for the memory figure
    # paced_seconds: how long each paced phase sends, at each of the paced rates
    "full": dict(records=100_000, reps=7, apiversions=2000, metadata=1000, produce_latency=500, budget_s=300,
                 small_requests=400, idle=10_000, paced_seconds=2.0),
    "quick": dict(records=20_000, reps=3, apiversions=500, metadata=300, produce_latency=100, budget_s=60,
                  small_requests=100, idle=1_000, paced_seconds=0.5),
}
# A fixed offered load for the latency targets: 8 connections x 250 requests a second, about a seventh of what
# the direct path carries one at a time on this machine, so that a path's latency is not its throughput.
PACED_RATE = 2000.0
MIN_REPS = 3  # the time budget never cuts a run below this many repetitions
RAW_WARMUP = 200
PHASE_TIMEOUT_S = 120.0
FETCH_WAIT_MAX_MS = 100  # consumer long-poll; only matters when no records are waiting


class BenchError(RuntimeError):
    pass


# ------------------------------------------------------------------ processes


class Processes:
    """Every child process and broker started, so that all can be stopped whatever happens."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.brokers: list[TansuBroker] = []

    def spawn(self, cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        log = open(log_path, "wb")
        try:
            # A session of its own: Ctrl-C reaches this script only, which stops it in order.
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
        if proc in self.procs:
            self.procs.remove(proc)

    def start_broker(self, **kwargs) -> TansuBroker:
        broker = TansuBroker(**kwargs)
        self.brokers.append(broker)
        return broker.start()

    def stop_broker(self, broker: TansuBroker) -> None:
        broker.stop()
        if broker in self.brokers:
            self.brokers.remove(broker)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            try:
                self.stop(proc, grace=5.0)
            except Exception:  # keep stopping the others
                pass
        for broker in list(self.brokers):
            try:
                self.stop_broker(broker)
            except Exception:
                pass


def wait_port(port: int, proc: subprocess.Popen | None, log_path: Path | None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:] if log_path else ""
            raise BenchError(f"{proc.args[0]} exited with status {proc.returncode}:\n{tail}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"nothing listens on {HOST}:{port} after {timeout:.0f} s")
        time.sleep(0.05)


def distinct_free_ports(count: int, taken: set[int] = frozenset()) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(HOST)
        if port not in ports and port not in taken and port > TANSU_NODE_ID:
            ports.append(port)
    return ports


def venv_tool(name: str) -> str | None:
    """A console script next to this Python (the venv's bin), else on PATH."""
    script = Path(sys.executable).parent / name
    return str(script) if script.is_file() else shutil.which(name)


def loadavg() -> float | None:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kinspect_command() -> list[str]:
    found = venv_tool("kinspect")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from kinspect.cli.main import main; sys.exit(main())"]


HAPROXY_CONFIG = """\
global
    maxconn 4096
    nbthread {threads}
    log stdout format raw local0 err

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

frontend kafka
    bind {host}:{port}
    default_backend tansu

backend tansu
    server tansu {broker}
"""


class Stack:
    """One path for one cell: a fresh Tansu and, unless direct, the proxy in front of it."""

    def __init__(self, path: str, procs: Processes, workdir: Path, tag: str, profile_dir: Path | None,
                 proxy_cpus: set[int] | None = None, baseline: Path | None = None) -> None:
        self.path = path
        self.baseline = baseline  # the source tree of a path@baseline
        self.proxy_cpus = proxy_cpus
        self.haproxy_threads = HAPROXY_THREADS
        self.procs = procs
        self.workdir = workdir
        self.tag = tag
        self.profile_dir = profile_dir
        self.broker: TansuBroker | None = None
        self.proxy: subprocess.Popen | None = None
        self.profiler: subprocess.Popen | None = None
        self.proxy_log: Path | None = None
        self.bootstrap = ""
        self.event_loop: str | None = None
        self.metrics_port: int | None = None  # kinspect's /metrics, for its inspection's CPU (batches only)

    @property
    def proxy_pid(self) -> int | None:
        return self.proxy.pid if self.proxy is not None else None

    def start(self) -> "Stack":
        path = self.path.removesuffix(BASELINE)
        env = None
        if self.path.endswith(BASELINE):
            env = dict(os.environ, PYTHONPATH=str(self.baseline))  # kinspect imported from that tree
        if path == "direct":
            self.broker = self.procs.start_broker()
            self.bootstrap = self.broker.bootstrap
            return self
        self.proxy_log = self.workdir / f"{self.tag}-{self.path}.log"
        if path in ("kinspect-passthrough", "kinspect-nometrics", "kinspect-capture"):
            port, metrics_port = distinct_free_ports(2)
            self.broker = self.procs.start_broker(advertised_port=port)
            cmd = kinspect_command() + ["proxy", "--mode", "passthrough", "--listen", f"{HOST}:{port}",
                                        "--upstream", self.broker.bootstrap]
            cmd += ["--no-metrics"] if path == "kinspect-nometrics" else ["--metrics-listen", f"{HOST}:{metrics_port}"]
            self.metrics_port = None if path == "kinspect-nometrics" else metrics_port
            if path == "kinspect-capture":
                cmd += ["--capture-dir", str(self.workdir / f"{self.tag}-{self.path}-captures")]
        elif path == "kinspect-rewrite":
            self.broker = self.procs.start_broker()
            port, node_port, metrics_port = distinct_free_ports(3, {self.broker.port})
            cmd = kinspect_command() + ["proxy", "--mode", "rewrite", "--listen", f"{HOST}:{port}",
                                        "--bootstrap-server", self.broker.bootstrap,
                                        "--node-port-base", str(node_port - TANSU_NODE_ID),
                                        "--metrics-listen", f"{HOST}:{metrics_port}"]
            self.metrics_port = None  # rewrite mode inspects each read at once: no batch to count
        elif path == "haproxy":
            haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
            (port,) = distinct_free_ports(1)
            self.broker = self.procs.start_broker(advertised_port=port)
            config = self.workdir / f"{self.tag}-haproxy.cfg"
            config.write_text(HAPROXY_CONFIG.format(host=HOST, port=port, broker=self.broker.bootstrap,
                                                    threads=self.haproxy_threads))
            cmd = [haproxy, "-db", "-f", str(config)]
        else:
            raise ValueError(path)
        if self.proxy_cpus:
            cmd = pin_command(cmd, self.proxy_cpus)
        self.proxy = self.procs.spawn(cmd, self.proxy_log, env)
        wait_port(port, self.proxy, self.proxy_log)
        self.bootstrap = f"{HOST}:{port}"
        if path in KINSPECT_PATHS:
            self.event_loop = self._event_loop()
            if self.profile_dir is not None:
                out = self.profile_dir / f"{self.tag}-{self.path}.txt"
                self.profiler = self.procs.spawn(
                    [venv_tool("py-spy") or "py-spy", "record", "--pid", str(self.proxy.pid), "--rate", "200",
                     "--format", "raw", "--nonblocking", "-o", str(out)],
                    self.workdir / f"{self.tag}-{self.path}-py-spy.log",
                )
                time.sleep(0.5)  # let it attach
        return self

    def inspection_seconds(self) -> float | None:
        """kinspect's own count of the CPU seconds its inspection batches took
        (kinspect_inspection_cpu_seconds_total); None without metrics, or from a tree that does not count it."""
        if self.metrics_port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return None
        found = re.search(r"^kinspect_inspection_cpu_seconds_total ([0-9.e+-]+)$", text, re.M)
        return float(found.group(1)) if found else None

    def _event_loop(self) -> str | None:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            text = self.proxy_log.read_text(errors="replace")
            found = re.search(r"event loop: (\w+)", text)
            if found:
                return found.group(1)
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        try:
            if self.proxy is not None:
                self.procs.stop(self.proxy, signal.SIGTERM, grace=15.0)
            if self.profiler is not None:  # py-spy writes its file once the process is gone
                self.procs.stop(self.profiler, signal.SIGINT, grace=20.0)
        finally:
            if self.broker is not None:
                self.procs.stop_broker(self.broker)

    def __enter__(self) -> "Stack":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------ clients

CLIENT_QUIET = {"log_level": 3}  # librdkafka: errors only (no "Disconnected" notices at teardown)


def create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT_QUIET})
    futures = admin.create_topics([NewTopic(name, 1, 1) for name in names], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=30)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def proxy_cpu(used: dict) -> float | None:
    """The proxy's CPU seconds in a phase: the ns-resolution per-thread count when /proc has it."""
    return used["run_s"] if used["run_s"] is not None else used["cpu_s"]


def machine_figures(used: dict, nbytes: int) -> dict:
    """The whole machine's CPU ms per MB in a phase (client, broker, proxy and the kernel's work for them: the
    CPU a path costs, which caps its throughput when the CPUs are busy), the busy share of the CPU time the
    machine had, and the share stolen by other guests; None where /proc/stat was not read."""
    machine = used.get("machine_s")
    if machine is None or nbytes <= 0:
        return {"machine_cpu_ms_per_mb": None, "machine_busy_pct": None, "machine_stolen_pct": None}
    busy, idle, stolen = machine
    had = busy + idle
    return {"machine_cpu_ms_per_mb": 1000.0 * busy / (nbytes / 1e6),
            "machine_busy_pct": 100.0 * busy / had if had > 0 else None,
            "machine_stolen_pct": 100.0 * stolen / (had + stolen) if had + stolen > 0 else None}


def proxy_cpu_figures(used: dict, elapsed: float, nbytes: int) -> dict:
    cpu, inspection = proxy_cpu(used), used.get("inspection_s")
    figures = {"inspection_ms_per_mb": None if inspection is None else 1000.0 * inspection / (nbytes / 1e6),
               **machine_figures(used, nbytes)}
    if cpu is None:
        return {"proxy_cpu_pct": None, "proxy_cpu_ms_per_mb": None, "proxy_cpu": used, **figures}
    return {"proxy_cpu_pct": 100.0 * cpu / elapsed, "proxy_cpu_ms_per_mb": 1000.0 * cpu / (nbytes / 1e6),
            "proxy_cpu": used, **figures}


def measure_produce(bootstrap: str, topic: str, warm_topic: str, records: int, size: int, new_meter) -> dict:
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
        "compression.type": "none", "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_097_151, "delivery.report.only.error": True, **CLIENT_QUIET,
    })
    try:
        producer.produce(warm_topic, b"warm-up", on_delivery=on_delivery)
        if producer.flush(30) != 0 or errors:
            raise BenchError(f"produce warm-up failed: {errors or 'not delivered in 30 s'}")
        producer.list_topics(topic, timeout=30)
        value = os.urandom(size)
        produce, poll = producer.produce, producer.poll
        meter = new_meter().start()
        t0 = time.perf_counter()
        for i in range(records):
            while True:
                try:
                    produce(topic, value, on_delivery=on_delivery)
                    break
                except BufferError:
                    poll(0.005)
            if not i & 1023:
                poll(0)
        left = producer.flush(PHASE_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        used = meter.stop()
    finally:
        del producer
    if left or errors:
        raise BenchError(f"produce: {left} records undelivered, {len(errors)} errors {errors[:3]}")
    return {
        "seconds": elapsed,
        "mb_s": records * size / elapsed / 1e6,
        "records_s": records / elapsed,
        **proxy_cpu_figures(used, elapsed, records * size),
    }


def measure_consume(bootstrap: str, topic: str, warm_topic: str, records: int, new_meter) -> dict:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": False,
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 262_144, "fetch.wait.max.ms": FETCH_WAIT_MAX_MS, **CLIENT_QUIET,
    })
    try:
        # Warm up: the fetch connection to the broker is the same for both topics.
        consumer.assign([TopicPartition(warm_topic, 0, 0)])
        deadline = time.monotonic() + 30
        while True:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
            if time.monotonic() > deadline:
                raise BenchError("consume warm-up: no record in 30 s")
        # The fetch in flight for the warm-up topic long-polls (fetch.wait.max.ms) for records
        # that never come: unassign, and let it return before timing the real topic.
        consumer.unassign()
        time.sleep(FETCH_WAIT_MAX_MS * 1.5 / 1000)
        # A topic new to the consumer waits for librdkafka's 1 s metadata timer: learn it now.
        consumer.list_topics(topic, timeout=30)
        consumer.assign([TopicPartition(topic, 0, 0)])
        consume = consumer.consume
        count = nbytes = 0
        meter = new_meter().start()
        t0 = time.perf_counter()
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while count < records:
            for msg in consume(10_000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise BenchError(f"consume: {err}")
                count += 1
                nbytes += len(msg.value())
            if time.monotonic() > deadline:
                raise BenchError(f"consume: {count} of {records} records in {PHASE_TIMEOUT_S:.0f} s")
        elapsed = time.perf_counter() - t0
        used = meter.stop()
    finally:
        consumer.close()
    return {
        "seconds": elapsed,
        "mb_s": nbytes / elapsed / 1e6,
        "records_s": count / elapsed,
        **proxy_cpu_figures(used, elapsed, nbytes),
    }


SMALL_WORKLOADS = ["apiversions", "metadata", "produce", "fetch"]


class RawRequests:
    """Pre-encoded request frames (4-byte size prefix included), one correlation id each."""

    def __init__(self, codec: Codec, api_key: int, version: int, body: dict, count: int) -> None:
        self.frames = []
        for i in range(count):
            frame = codec.encode_request(
                {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": i, "ClientId": "bench"},
                body,
            )
            self.frames.append(len(frame).to_bytes(4, "big") + frame)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    need = len(view)
    while got < need:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise BenchError("connection closed by the peer")
        got += n


def measure_round_trips(port: int, requests: RawRequests, warmup: int) -> dict:
    """One request at a time on one connection; each round trip timed with perf_counter_ns."""
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    size_buf = bytearray(4)
    size_view = memoryview(size_buf)
    body = bytearray(1 << 20)
    body_view = memoryview(body)
    clock = time.perf_counter_ns
    samples = []
    try:
        for i, frame in enumerate(requests.frames):
            t0 = clock()
            sock.sendall(frame)
            _recv_exact(sock, size_view)
            size = int.from_bytes(size_buf, "big")
            if size > len(body):
                body = bytearray(size)
                body_view = memoryview(body)
            _recv_exact(sock, body_view[:size])
            t1 = clock()
            if int.from_bytes(body[:4], "big") != i:
                raise BenchError(f"response correlation id {int.from_bytes(body[:4], 'big')} for request {i}")
            if i >= warmup:
                samples.append((t1 - t0) / 1e6)
    finally:
        sock.close()
    samples.sort()
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
            "mean_ms": statistics.fmean(samples), "count": len(samples)}


def measure_produce_latency(bootstrap: str, topic: str, records: int, size: int, warmup: int = 20) -> dict:
    latencies: list[float] = []
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0,
                         "compression.type": "none", **CLIENT_QUIET})
    try:
        value = os.urandom(size)
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        for _ in range(warmup + records):
            producer.produce(topic, value, on_delivery=on_delivery)
            if producer.flush(10) != 0:
                raise BenchError("produce latency: a record was not delivered in 10 s")
            if time.monotonic() > deadline:
                raise BenchError(f"produce latency: not done in {PHASE_TIMEOUT_S:.0f} s")
    finally:
        del producer
    if errors:
        raise BenchError(f"produce latency: {len(errors)} errors {errors[:3]}")
    samples = sorted(x * 1000.0 for x in latencies[warmup:])
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
            "mean_ms": statistics.fmean(samples), "count": len(samples)}


# ------------------------------------------------------------------ one cell


SMALL_TOPIC, SMALL_FETCH_TOPIC = "bench-small", "bench-small-fetch"
SMALL_WARMUP = 10  # requests per connection before each workload's timed phases


def run_cell(stack: Stack, settings: dict, api_versions: RawRequests, metadata: RawRequests,
             small: dict | None) -> dict:
    topic, warm_topic, latency_topic = "bench", "bench-warm", "bench-latency"
    create_topics(stack.broker.bootstrap, [topic, warm_topic, latency_topic, SMALL_TOPIC, SMALL_FETCH_TOPIC])
    port = int(stack.bootstrap.rpartition(":")[2])
    # The proxy's CPU in a phase, and the part kinspect counts as inspection (its metrics on).
    new_meter = partial(CpuMeter, stack.proxy_pid, stack.inspection_seconds)
    cell = {}
    if settings["bulk"]:
        cell["produce"] = measure_produce(stack.bootstrap, topic, warm_topic, settings["records"],
                                          settings["record_size"], new_meter)
        cell["consume"] = measure_consume(stack.bootstrap, topic, warm_topic, settings["records"], new_meter)
        cell["apiversions"] = measure_round_trips(port, api_versions, RAW_WARMUP)
        cell["metadata"] = measure_round_trips(port, metadata, RAW_WARMUP)
        cell["produce_latency"] = measure_produce_latency(stack.bootstrap, latency_topic,
                                                          settings["produce_latency"], settings["record_size"])
    if small is not None:
        cell["small"] = measure_small(port, new_meter, settings, small)
    if stack.event_loop is not None:
        cell["event_loop"] = stack.event_loop
    cell["loadavg_1m"] = loadavg()
    return cell


def paced_phase(rate: float) -> str:
    return f"paced@{rate:g}"


def small_phases(settings: dict) -> list[str]:
    """Each workload's phases in the order they run: one at a time, pipelined, then each paced rate."""
    modes = ["serial", "pipelined"] + [paced_phase(r) for r in settings.get("paced_rates", [])]
    return [f"{w}/{m}" for w in SMALL_WORKLOADS for m in modes]


def measure_small(port: int, new_meter, settings: dict, small: dict) -> dict:
    """Every small-request workload, one at a time, pipelined, then paced, on `connections` connections each."""
    out = {}
    conns, per_conn = settings["connections"], settings["small_requests"]
    small_requests.run_load(port, small["prefill"], 1, small_requests.FETCH_RECORDS, 1)
    for name in SMALL_WORKLOADS:
        workload = small[name]
        # Warm-up: the proxy's first frames of this kind, on connections of their own.
        small_requests.run_load(port, workload, conns, SMALL_WARMUP, 1)
        phases = [("serial", 1, None), ("pipelined", settings["in_flight"], None)]
        phases += [(paced_phase(rate), 1, rate) for rate in settings.get("paced_rates", [])]
        for mode, in_flight, rate in phases:
            if rate is None:
                result = small_requests.run_load(port, workload, conns, per_conn, in_flight, meter=new_meter())
            else:
                each = max(1, round(rate * settings["paced_seconds"] / conns))
                result = small_requests.run_paced(port, workload, conns, each, rate, meter=new_meter())
            lat = sorted(result["latencies_ms"])
            cpu = proxy_cpu(result["meter"])
            n = result["requests"]
            out[f"{name}/{mode}"] = {
                "requests": n, "seconds": result["seconds"], "req_s": n / result["seconds"],
                "cpu_us_per_req": None if cpu is None else 1e6 * cpu / n,
                "stat_cpu_us_per_req": None if result["meter"]["cpu_s"] is None else 1e6 * result["meter"]["cpu_s"] / n,
                "user_us_per_req": None if result["meter"]["user_s"] is None else 1e6 * result["meter"]["user_s"] / n,
                "system_us_per_req": None if result["meter"]["system_s"] is None else 1e6 * result["meter"]["system_s"] / n,
                "inspection_us_per_req": (None if result["meter"]["inspection_s"] is None
                                          else 1e6 * result["meter"]["inspection_s"] / n),
                "writer_us_per_req": (None if result["meter"]["descendants_run_s"] is None
                                      else 1e6 * result["meter"]["descendants_run_s"] / n),
                "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            }
            if rate is not None:
                out[f"{name}/{mode}"]["late"] = result["late"]
    return out


# ------------------------------------------------------------------ report

# (label, cell key, value key, kind): kind "tput" compares as % of direct, "lat" as added ms.
ROWS = [
    ("produce MB/s", "produce", "mb_s", "tput"),
    ("produce records/s", "produce", "records_s", "tput"),
    ("consume MB/s", "consume", "mb_s", "tput"),
    ("consume records/s", "consume", "records_s", "tput"),
    ("ApiVersions p50 ms", "apiversions", "p50_ms", "lat"),
    ("ApiVersions p99 ms", "apiversions", "p99_ms", "lat"),
    ("Metadata p50 ms", "metadata", "p50_ms", "lat"),
    ("Metadata p99 ms", "metadata", "p99_ms", "lat"),
    ("produce latency p50 ms", "produce_latency", "p50_ms", "lat"),
    ("produce latency p99 ms", "produce_latency", "p99_ms", "lat"),
    ("proxy CPU % (produce)", "produce", "proxy_cpu_pct", "cpu"),
    ("proxy CPU % (consume)", "consume", "proxy_cpu_pct", "cpu"),
    ("proxy CPU ms/MB (produce)", "produce", "proxy_cpu_ms_per_mb", "cpu"),
    ("proxy CPU ms/MB (consume)", "consume", "proxy_cpu_ms_per_mb", "cpu"),
]


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / median over repetitions, in %."""
    if len(values) < 2 or not statistics.median(values):
        return None
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def fmt_spread(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    out = ["  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)),
           "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
    return out


def cpu_per_mb_report(results: dict[str, list[dict]], paths: list[str]) -> tuple[list[str], dict]:
    """The bulk load's proxy CPU per MB forwarded, its spread and its ratio to haproxy's."""
    summary: dict = {}
    for p in paths:
        for phase in ("produce", "consume"):
            values = [c[phase]["proxy_cpu_ms_per_mb"] for c in results[p]
                      if phase in c and c[phase].get("proxy_cpu_ms_per_mb") is not None]
            if values:
                inspection = [c[phase]["inspection_ms_per_mb"] for c in results[p]
                              if phase in c and c[phase].get("inspection_ms_per_mb") is not None]
                summary.setdefault(p, {})[phase] = {"median": statistics.median(values), "spread_pct": spread_pct(values),
                                                    "values": values,
                                                    "inspection": statistics.median(inspection) if inspection else None}
    if not summary:
        return [], summary
    rows = []
    for p in paths:
        if p not in summary:
            continue
        row = [p]
        for phase in ("produce", "consume"):
            fig = summary[p].get(phase)
            ref = summary.get("haproxy", {}).get(phase)
            if fig is None:
                row += ["n/a", "", "", ""]
                continue
            ratio = fig["median"] / ref["median"] if ref and ref["median"] else None
            fig["ratio_to_haproxy"] = ratio
            row += [f"{fig['median']:.2f}", "-" if ratio is None else f"{ratio:.2f}x", fmt_spread(fig["spread_pct"]),
                    "-" if fig["inspection"] is None else f"{fig['inspection']:.3f}"]
        rows.append(row)
    lines = ["bulk load: proxy CPU per MB forwarded (ms of CPU per MB; median of reps); inspection = of it, what "
             "kinspect counts as inspection (kinspect_inspection_cpu_seconds_total), the rest being forwarding"]
    lines += render_table(["variant", "produce ms/MB", "vs haproxy", "spread", "inspection",
                           "consume ms/MB", "vs haproxy", "spread", "inspection"], rows)
    for p in paths:
        ratios = [summary.get(p, {}).get(phase, {}).get("ratio_to_haproxy") for phase in ("produce", "consume")]
        if is_kinspect(p) and None not in ratios:
            verdict = "MET" if max(ratios) <= CPU_PER_MB_TARGET else "MISSED"
            lines.append(f"  {p}: CPU per MB at most {CPU_PER_MB_TARGET}x haproxy's: {verdict}")
            parts = []
            for phase in ("produce", "consume"):
                per_rep = bulk_ratios_per_rep(results.get(p, []), results.get("haproxy", []), phase)
                summary[p][phase]["ratio_to_haproxy_per_rep"] = per_rep
                if per_rep:
                    parts.append(f"{phase} {min(per_rep):.2f}x to {max(per_rep):.2f}x (median "
                                 f"{statistics.median(per_rep):.2f}x, within {CPU_PER_MB_TARGET}x in "
                                 f"{sum(r <= CPU_PER_MB_TARGET for r in per_rep)} of {len(per_rep)})")
            if parts:
                lines.append("    each repetition against haproxy's beside it: " + "; ".join(parts))
    return lines, summary


def machine_ceiling_report(results: dict[str, list[dict]], paths: list[str]) -> tuple[list[str], dict]:
    """The bulk phases' whole-machine CPU per MB (/proc/stat: client, broker, proxy and the kernel), and the
    throughput it leaves each path: direct's machine CPU per MB over the path's, paired by repetition. While
    the CPUs are busy a path that costs the machine 5% more CPU a MB moves at most 1/1.05 of direct's bytes,
    so a path can keep 97% of direct's throughput only by adding at most 3.1% of direct's machine CPU."""
    summary: dict = {}
    for p in paths:
        for phase in ("produce", "consume"):
            values = [c[phase]["machine_cpu_ms_per_mb"] for c in results[p]
                      if phase in c and c[phase].get("machine_cpu_ms_per_mb") is not None]
            if not values:
                continue
            fig = summary.setdefault(p, {})[phase] = {"median": statistics.median(values)}
            busy = [c[phase]["machine_busy_pct"] for c in results[p]
                    if phase in c and c[phase].get("machine_busy_pct") is not None]
            fig["busy_pct"] = statistics.median(busy) if busy else None
            if p != "direct":
                ceilings = [ref[phase]["machine_cpu_ms_per_mb"] / cell[phase]["machine_cpu_ms_per_mb"]
                            for cell, ref in paired_by_rep(results[p], results.get("direct", []))
                            if cell.get(phase, {}).get("machine_cpu_ms_per_mb")
                            and ref.get(phase, {}).get("machine_cpu_ms_per_mb")]
                fig["ceiling"] = statistics.median(ceilings) if ceilings else None
    if "direct" not in summary:
        return [], summary
    lines = ["bulk load: the whole machine's CPU per MB (/proc/stat: client, broker, proxy, kernel; median of reps), "
             "its busy share, and the ceiling it puts on a path's throughput (direct's ms per MB over the path's, "
             f"by repetition): {THROUGHPUT_TARGET:.0%} of direct allows a path to add at most "
             f"{1 / THROUGHPUT_TARGET - 1:.1%} of direct's"]
    for p in paths:
        parts = []
        for phase in ("produce", "consume"):
            fig = summary.get(p, {}).get(phase)
            if fig is None:
                continue
            text = f"{phase} {fig['median']:.2f} ms/MB"
            if fig["busy_pct"] is not None:
                text += f" (busy {fig['busy_pct']:.0f}%)"
            if fig.get("ceiling") is not None:
                text += f", ceiling {fig['ceiling']:.1%} of direct"
            parts.append(text)
        if parts:
            lines.append(f"  {p}: " + "; ".join(parts))
    return lines, summary


def paired_by_rep(mine: list[dict], haproxy: list[dict]):
    """(this path's cell, haproxy's cell of the same repetition) for each repetition both have: the runs are
    interleaved, so each pair shares the machine's load of that moment, which the medians of the two paths
    over all repetitions do not."""
    by_rep = {ref.get("rep"): ref for ref in haproxy}
    for cell in mine:
        ref = by_rep.get(cell.get("rep"))
        if ref is not None:  # haproxy's cell of this repetition did not fail
            yield cell, ref


def bulk_ratios_per_rep(mine: list[dict], haproxy: list[dict], phase: str) -> list[float]:
    """Per repetition, this path's CPU per MB in a bulk phase over haproxy's in the same repetition."""
    out = []
    for cell, ref in paired_by_rep(mine, haproxy):
        value = cell.get(phase, {}).get("proxy_cpu_ms_per_mb")
        base = ref.get(phase, {}).get("proxy_cpu_ms_per_mb")
        if value is not None and base:
            out.append(value / base)
    return out


def user_sys(fig: dict) -> str:
    user, system = fig.get("user_us_per_req"), fig.get("system_us_per_req")
    return "-" if user is None or system is None else f"{user:.0f}/{system:.0f}"


def small_report(results: dict[str, list[dict]], paths: list[str], settings: dict) -> tuple[list[str], dict]:
    """Per small-request workload: req/s, proxy CPU per request, its ratio to haproxy, spread, added latency."""
    summary: dict = {}
    phases = small_phases(settings)
    for p in paths:
        for phase in phases:
            cells = [c["small"][phase] for c in results[p] if "small" in c and phase in c["small"]]
            if not cells:
                continue
            fig = {"reps": len(cells)}
            for field in ("req_s", "cpu_us_per_req", "stat_cpu_us_per_req", "user_us_per_req", "system_us_per_req",
                          "inspection_us_per_req", "writer_us_per_req", "p50_ms", "p99_ms", "late"):
                values = [c[field] for c in cells if c.get(field) is not None]
                fig[field] = statistics.median(values) if values else None
                fig[field + "_spread_pct"] = spread_pct(values) if values else None
            summary.setdefault(phase, {})[p] = fig
    if not summary:
        return [], summary
    lines = [f"small requests: {settings['connections']} connections x {settings['small_requests']} requests, "
             f"serial = one at a time per connection, pipelined = {settings['in_flight']} in flight, "
             f"paced@R = one at a time, R requests a second in all; "
             f"CPU = the proxy's CPU time per request; spread = (max - min) / median of CPU over reps; "
             f"user/sys = the same split into user and system time (/proc/<pid>/stat, 10 ms ticks); "
             f"inspect = of the CPU, what kinspect counts as inspection (kinspect_inspection_cpu_seconds_total); "
             f"added = p50/p99 round trip minus direct's, ms"]
    header = ["workload", "variant", "req/s", "CPU us/req", "vs haproxy", "spread", "user/sys us", "inspect us",
              "p50/p99 added ms"]
    rows = []
    for phase in phases:
        by_path = summary.get(phase, {})
        ref = by_path.get("haproxy", {}).get("cpu_us_per_req")
        direct = by_path.get("direct")
        for p in paths:
            fig = by_path.get(p)
            if fig is None:
                continue
            cpu = fig["cpu_us_per_req"]
            fig["ratio_to_haproxy"] = cpu / ref if cpu is not None and ref else None
            if direct is not None and p != "direct":
                fig["added_p50_ms"] = fig["p50_ms"] - direct["p50_ms"]
                fig["added_p99_ms"] = fig["p99_ms"] - direct["p99_ms"]
                added = f"{fig['added_p50_ms']:+.3f} / {fig['added_p99_ms']:+.3f}"
            elif p == "direct":
                added = f"({fig['p50_ms']:.3f} / {fig['p99_ms']:.3f})"
            else:
                added = "n/a"
            rows.append([phase, p, f"{fig['req_s']:.0f}", "-" if cpu is None else f"{cpu:.1f}",
                         "-" if fig["ratio_to_haproxy"] is None else f"{fig['ratio_to_haproxy']:.2f}x",
                         fmt_spread(fig["cpu_us_per_req_spread_pct"]), user_sys(fig),
                         "-" if fig["inspection_us_per_req"] is None else f"{fig['inspection_us_per_req']:.1f}", added])
    lines += render_table(header, rows)
    lines.append("direct's own p50 / p99 in brackets")
    lines += writer_lines(summary, paths, phases)
    for rate in settings.get("paced_rates", []):
        lines += latency_lines(summary, paths, [ph for ph in phases if ph.endswith("/" + paced_phase(rate))],
                               f"latency targets, one at a time at {rate:g} requests a second in all")
    lines += latency_lines(summary, paths, [ph for ph in phases if ph.endswith("/serial")],
                           "closed loop, one at a time as fast as answers come (the cores busy: a round trip is "
                           "the connections over the throughput, so an added one is throughput lost)")
    # One line per variant: CPU per request across every workload (geometric mean of the ratios), the closed
    # loops' phases only: a paced phase's CPU a request holds the wake-ups of a mostly idle proxy.
    closed = [ph for ph in phases if ph.endswith(("/serial", "/pipelined"))]
    lines.append("")
    for p in paths:
        ratios = [summary[ph][p]["ratio_to_haproxy"] for ph in closed
                  if p in summary.get(ph, {}) and summary[ph][p].get("ratio_to_haproxy")]
        if p in ("direct", "haproxy") or not ratios:
            continue
        serial = [summary[ph][p]["ratio_to_haproxy"] for ph in closed if ph.endswith("/serial")
                  and p in summary.get(ph, {}) and summary[ph][p].get("ratio_to_haproxy")]
        geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
        geo_serial = math.exp(statistics.fmean(math.log(r) for r in serial)) if serial else float("nan")
        per_rep = serial_ratios_per_rep(results.get(p, []), results.get("haproxy", []),
                                        [ph for ph in phases if ph.endswith("/serial")])
        summary.setdefault("overall", {})[p] = {"cpu_ratio_geomean": geo, "cpu_ratio_geomean_serial": geo_serial,
                                                "cpu_ratio_serial_per_rep": per_rep}
        target = CPU_PER_REQUEST_TARGET.get(p)
        verdict = "" if target is None else f"; target {target}x one at a time: {'MET' if geo_serial <= target else 'MISSED'}"
        lines.append(f"  {p}: CPU per request {geo:.2f}x haproxy's (geometric mean of every workload; "
                     f"one-at-a-time only {geo_serial:.2f}x{verdict})")
        if per_rep:
            within = "" if target is None else f", within the target in {sum(r <= target for r in per_rep)} of {len(per_rep)}"
            lines.append(f"    one at a time, each repetition against haproxy's beside it: "
                         f"{min(per_rep):.2f}x to {max(per_rep):.2f}x (median {statistics.median(per_rep):.2f}x{within})")
        for rate in settings.get("paced_rates", []):
            paced = [summary[ph][p]["ratio_to_haproxy"] for ph in phases if ph.endswith("/" + paced_phase(rate))
                     and p in summary.get(ph, {}) and summary[ph][p].get("ratio_to_haproxy")]
            if paced:
                summary["overall"][p][f"cpu_ratio_geomean_{paced_phase(rate)}"] = geo_paced = math.exp(
                    statistics.fmean(math.log(r) for r in paced))
                lines.append(f"    at {rate:g} requests a second: {geo_paced:.2f}x haproxy's (a mostly idle proxy, "
                             "kept apart from the closed loop's figures)")
    return lines, summary


def writer_lines(summary: dict, paths: list[str], phases: list[str]) -> list[str]:
    """For each path with a capture writer process: how much of its CPU a request that process took, one at a
    time and pipelined (medians over repetitions, per workload)."""
    lines = []
    for p in paths:
        parts = []
        for mode in ("serial", "pipelined"):
            figures = [(ph.split("/")[0], summary[ph][p]) for ph in phases
                       if ph.endswith("/" + mode) and p in summary.get(ph, {})]
            if not any(fig.get("writer_us_per_req") for _, fig in figures):
                continue
            each = ", ".join(f"{name} {fig['writer_us_per_req']:.1f} of {fig['cpu_us_per_req']:.1f}"
                             for name, fig in figures if fig.get("writer_us_per_req") is not None)
            parts.append(f"{'one at a time' if mode == 'serial' else 'pipelined'}: {each}")
        if parts:
            lines.append(f"  {p}: its capture writer process's CPU us/req, of the whole: " + "; ".join(parts))
    return lines


def latency_lines(summary: dict, paths: list[str], phases: list[str], title: str) -> list[str]:
    """For each path, in `phases` (one of each workload): in how many workloads its added p50 and p99 are within
    the targets, and its added p99 beyond haproxy's in the same run (what a plain TCP hop adds under the same
    load); for paced phases, how many requests went out late because the one before was still out."""
    lines = []
    for p in paths:
        figures = [(ph, summary[ph][p]) for ph in phases if "added_p99_ms" in summary.get(ph, {}).get(p, {})]
        if not figures:
            continue
        p50 = sum(fig["added_p50_ms"] <= ADDED_P50_TARGET_MS for _, fig in figures)
        p99 = sum(fig["added_p99_ms"] <= ADDED_P99_TARGET_MS for _, fig in figures)
        line = (f"  {p}: added p50 within {ADDED_P50_TARGET_MS} ms in {p50} of {len(figures)} workloads, "
                f"added p99 within {ADDED_P99_TARGET_MS} ms in {p99} of {len(figures)}")
        beyond = [f"{ph.split('/')[0]} {fig['added_p99_ms'] - summary[ph]['haproxy']['added_p99_ms']:+.3f}"
                  for ph, fig in figures if "added_p99_ms" in summary[ph].get("haproxy", {})]
        if p != "haproxy" and beyond:
            line += "; p99 beyond haproxy's: " + ", ".join(beyond) + " ms"
        late = [fig["late"] for _, fig in figures if fig.get("late") is not None]
        if late:
            line += f"; sent late (median a phase): {' / '.join(f'{n:g}' for n in late)}"
        lines.append(line)
    if lines:
        lines.insert(0, f"{title} (a path's median p50 and p99 over repetitions minus direct's):")
    return lines


def serial_ratios_per_rep(mine: list[dict], haproxy: list[dict], phases: list[str]) -> list[float]:
    """Per repetition, the geometric mean over the one-at-a-time workloads of this path's CPU per request
    over haproxy's in the same repetition (paired_by_rep)."""
    out = []
    for cell, ref in paired_by_rep(mine, haproxy):
        ratios = [cell["small"][ph]["cpu_us_per_req"] / ref["small"][ph]["cpu_us_per_req"] for ph in phases
                  if ph in cell.get("small", {}) and ph in ref.get("small", {})
                  and cell["small"][ph].get("cpu_us_per_req") and ref["small"][ph].get("cpu_us_per_req")]
        if ratios:
            out.append(math.exp(statistics.fmean(math.log(r) for r in ratios)))
    return out


def medians(cells: list[dict]) -> dict:
    out: dict = {}
    for _, key, field, _ in ROWS:
        values = [c[key][field] for c in cells if key in c and c[key].get(field) is not None]
        out.setdefault(key, {})[field] = statistics.median(values) if values else None
    return out


def fmt_value(value: float | None, field: str) -> str:
    if value is None:
        return "n/a"
    if field == "records_s":
        return f"{value / 1000:.1f}k"
    if field.endswith("_ms"):
        return f"{value:.3f}"
    if field == "proxy_cpu_ms_per_mb":  # under 1 ms: one decimal would hide the differences that matter
        return f"{value:.2f}"
    return f"{value:.1f}"


def compare(kind: str, value: float | None, base: float | None) -> dict | None:
    if value is None or base is None or kind == "cpu":
        return None
    if kind == "tput":
        return {"pct_of_direct": 100.0 * value / base}
    return {"added_ms": value - base}


def fmt_compare(cmp: dict | None) -> str:
    if cmp is None:
        return ""
    if "pct_of_direct" in cmp:
        return f" ({cmp['pct_of_direct']:.1f}%)"
    return f" ({cmp['added_ms']:+.3f})"


def build_report(results: dict[str, list[dict]], paths: list[str]) -> tuple[str, dict]:
    med = {p: medians(results[p]) for p in paths}
    base = med.get("direct")
    summary: dict = {"medians": med, "vs_direct": {}, "targets": {}}
    header = ["metric (median of reps)"] + paths
    lines_data = []
    for label, key, field, kind in ROWS:
        row = [label]
        for p in paths:
            value = med[p][key][field]
            cmp = None if p == "direct" or base is None else compare(kind, value, base[key][field])
            if cmp is not None:
                summary["vs_direct"].setdefault(p, {}).setdefault(key, {})[field] = cmp
            row.append(fmt_value(value, field) + fmt_compare(cmp))
        lines_data.append(row)
    widths = [max(len(r[i]) for r in [header] + lines_data) for i in range(len(header))]
    out = []
    out.append("  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)))
    out.append("  ".join("-" * w for w in widths))
    for row in lines_data:
        out.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
    out.append("throughput: value (% of direct); latency: value (added ms vs direct); "
               "proxy CPU: 100% = one core")

    # targets
    if base is not None:
        out.append("")
        out.append(f"targets: throughput >= {THROUGHPUT_TARGET * 100:.0f}% of direct and not below haproxy's, "
                   f"added p50 latency <= {ADDED_P50_TARGET_MS} ms, added p99 <= {ADDED_P99_TARGET_MS} ms")
        checks = [("produce MB/s", "produce", "mb_s", "tput"), ("consume MB/s", "consume", "mb_s", "tput"),
                  ("ApiVersions p50", "apiversions", "p50_ms", "lat"), ("Metadata p50", "metadata", "p50_ms", "lat"),
                  ("produce latency p50", "produce_latency", "p50_ms", "lat"),
                  ("ApiVersions p99", "apiversions", "p99_ms", "p99"), ("Metadata p99", "metadata", "p99_ms", "p99"),
                  ("produce latency p99", "produce_latency", "p99_ms", "p99")]
        for p in paths:
            if p == "direct":
                continue
            parts = []
            verdicts = {}
            for label, key, field, kind in checks:
                cmp = summary["vs_direct"].get(p, {}).get(key, {}).get(field)
                if cmp is None:
                    parts.append(f"{label} n/a")
                    verdicts[f"{key}.{field}"] = None
                    continue
                if kind == "tput":
                    ok = cmp["pct_of_direct"] >= THROUGHPUT_TARGET * 100
                    vs = summary["vs_direct"].get("haproxy", {}).get(key, {}).get(field)
                    if vs is not None and is_kinspect(p):
                        ok = ok and cmp["pct_of_direct"] >= vs["pct_of_direct"]
                    parts.append(f"{label} {cmp['pct_of_direct']:.1f}% {'MET' if ok else 'MISSED'}")
                else:
                    ok = cmp["added_ms"] <= (ADDED_P50_TARGET_MS if kind == "lat" else ADDED_P99_TARGET_MS)
                    parts.append(f"{label} {cmp['added_ms']:+.3f} ms {'MET' if ok else 'MISSED'}")
                verdicts[f"{key}.{field}"] = ok
            summary["targets"][p] = verdicts
            note = "" if is_kinspect(p) else "   [reference]"
            flat = [v for v in verdicts.values() if v is not None]
            overall = "ALL MET" if flat and all(flat) else "NOT ALL MET"
            out.append(f"  {p}: {overall}{note}")
            for part in parts:
                out.append(f"      {part}")
            if is_kinspect(p) and "haproxy" in med:
                # What a plain TCP hop costs on this machine, told apart from what kinspect adds to it.
                h = med["haproxy"]
                vs = {}
                for label, key, field, kind in checks:
                    value, ref = med[p][key][field], h[key][field]
                    if value is not None and ref is not None:
                        vs[f"{key}.{field}"] = compare(kind, value, ref)
                summary.setdefault("vs_haproxy", {})[p] = vs
                out.append("      vs haproxy: " + ", ".join(
                    f"{label} {fmt_compare(vs[f'{key}.{field}']).strip(' ()')}"
                    for label, key, field, kind in checks if f"{key}.{field}" in vs))

    # spread of the direct path, to judge the noise
    if "direct" in results and len(results["direct"]) > 1:
        spreads = []
        for label, key, field in [("produce MB/s", "produce", "mb_s"), ("consume MB/s", "consume", "mb_s"),
                                  ("ApiVersions p50", "apiversions", "p50_ms")]:
            values = [c[key][field] for c in results["direct"] if key in c]
            if len(values) > 1 and statistics.median(values):
                spreads.append(f"{label} {100 * (max(values) - min(values)) / statistics.median(values):.0f}%")
        out.append("")
        out.append("noise: direct path's (max - min) / median over reps: " + ", ".join(spreads))
    return "\n".join(out), summary


# ------------------------------------------------------------------ main


def environment() -> dict:
    env = {
        "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "confluent_kafka": confluent_version, "librdkafka": rdkafka_libversion()[0],
    }
    try:
        env["tansu"] = tansu_version()
    except Exception as exc:
        env["tansu"] = f"? ({exc})"
    try:
        out = subprocess.run([shutil.which("haproxy") or "haproxy", "-v"], capture_output=True, text=True, timeout=10)
        env["haproxy"] = out.stdout.splitlines()[0] if out.stdout else "?"
    except Exception as exc:
        env["haproxy"] = f"? ({exc})"
    try:
        import uvloop
        env["uvloop"] = uvloop.__version__
    except ImportError:
        env["uvloop"] = None
    try:
        with open("/proc/loadavg") as f:
            env["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return env


def cell_line(cell: dict) -> str:
    parts = []
    if "produce" in cell:
        parts.append(f"produce {cell['produce']['mb_s']:6.1f} MB/s  consume {cell['consume']['mb_s']:6.1f} MB/s  "
                     f"ApiVersions p50 {cell['apiversions']['p50_ms']:.3f} ms  "
                     f"Metadata p50 {cell['metadata']['p50_ms']:.3f} ms  "
                     f"produce-lat p50 {cell['produce_latency']['p50_ms']:.3f} ms")
    if "small" in cell:
        cpu = [f"{k.replace('/serial', '/1').replace('/pipelined', '/P').replace('/paced', '/')} "
               f"{v['cpu_us_per_req']:.0f}"
               for k, v in cell["small"].items() if v["cpu_us_per_req"] is not None]
        rate = statistics.median(v["req_s"] for v in cell["small"].values())
        parts.append(f"small: median {rate:.0f} req/s" + (f", CPU us/req {' '.join(cpu)}" if cpu else ""))
    return "  ".join(parts)


def measure_idle_memory(procs: Processes, workdir: Path, settings: dict, codec: Codec,
                        proxy_cpus: set[int] | None) -> dict:
    """RSS per idle connection through kinspect's default sidecar config (metrics on)."""
    frame = RawRequests(codec, 18, 3, {"ClientSoftwareName": "bench", "ClientSoftwareVersion": "1"}, 1).frames[0]
    with Stack("kinspect-passthrough", procs, workdir, "idle", None, proxy_cpus) as stack:
        port = int(stack.bootstrap.rpartition(":")[2])
        result = idle_connections.measure_idle(port, stack.proxy_pid, settings["idle"], frame)
    settings["idle_result"] = result
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer records, requests and repetitions (under a minute)")
    p.add_argument("--json", metavar="PATH", help="write every measurement and the summary here")
    p.add_argument("--reps", type=int, help="repetitions per path (default 9, --quick 5)")
    p.add_argument("--records", type=int,
                   help="records produced and consumed per cell (default 200000, --quick 100000)")
    p.add_argument("--budget", type=float, metavar="S",
                   help=f"start no repetition past this many seconds, once {MIN_REPS} are done "
                        "(default 300, --quick 75)")
    p.add_argument("--record-size", type=int, default=1024, help="bytes per record value (default 1024)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--profile", metavar="DIR", help="attach py-spy record to every kinspect process; raw stacks in DIR")
    p.add_argument("--baseline", metavar="TREE",
                   help="also run each kinspect path from this kinspect source tree (path@baseline), interleaved")
    p.add_argument("--keep-logs", action="store_true", help="keep proxy logs and configs (their directory is printed)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--small-only", action="store_true", help="only the small-request load (no bulk produce/consume)")
    load.add_argument("--no-small", action="store_true", help="only the bulk load (no small-request load)")
    p.add_argument("--small-requests", type=int, metavar="N",
                   help="requests per connection in each small-request phase (default 400, --quick 100)")
    p.add_argument("--connections", type=int, default=8, help="connections of the small-request load (default 8)")
    p.add_argument("--in-flight", type=int, default=32, help="requests in flight per pipelined connection (default 32)")
    p.add_argument("--paced-rate", default=f"{PACED_RATE:g}", metavar="R[,R...]",
                   help=f"requests a second, in all, of the paced phases, one phase per rate "
                        f"(default {PACED_RATE:g}; 0: no paced phase)")
    p.add_argument("--paced-seconds", type=float, metavar="S",
                   help="how long each paced phase sends (default 2, --quick 0.5)")
    p.add_argument("--idle", type=int, metavar="N",
                   help="idle connections held through kinspect for the memory figure (default 10000, --quick 1000; 0: skip)")
    p.add_argument("--haproxy-threads", type=int, default=HAPROXY_THREADS,
                   help="haproxy's nbthread (default 1, as kinspect forwards on one thread)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                   help="pin the proxy to the last CPU and broker, clients and this script to the others "
                        "(default off: see docs/performance.md)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = dict(PRESETS["quick" if args.quick else "full"])
    if args.reps is not None:
        settings["reps"] = args.reps
    if args.records is not None:
        settings["records"] = args.records
    if args.budget is not None:
        settings["budget_s"] = args.budget
    settings["record_size"] = args.record_size
    settings["bulk"] = not args.small_only
    settings["small"] = not args.no_small
    if args.small_requests is not None:
        settings["small_requests"] = args.small_requests
    if args.idle is not None:
        settings["idle"] = args.idle
    settings["connections"], settings["in_flight"] = args.connections, args.in_flight
    try:
        settings["paced_rates"] = [r for r in (float(x) for x in args.paced_rate.split(",") if x.strip()) if r > 0]
    except ValueError:
        print(f"--paced-rate {args.paced_rate}: give requests a second, as numbers separated by commas",
              file=sys.stderr)
        return 2
    if args.paced_seconds is not None:
        settings["paced_seconds"] = args.paced_seconds
    global HAPROXY_THREADS
    HAPROXY_THREADS = settings["haproxy_threads"] = args.haproxy_threads
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if args.pin is not None else PIN_DEFAULT and len(cpus) >= 2
    if pin and len(cpus) < 2:
        print("--pin needs 2 CPUs or more; running unpinned", file=sys.stderr)
        pin = False
    proxy_cpus = {cpus[-1]} if pin else None
    settings["pinning"] = (f"proxy (kinspect, haproxy) on CPU {cpus[-1]}; broker, clients and this script on CPU "
                           f"{','.join(map(str, cpus[:-1]))}" if pin else "none (every process on any CPU)")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        print(f"unknown path(s) {unknown}; choose from {PATHS}", file=sys.stderr)
        return 2
    baseline = Path(args.baseline).resolve() if args.baseline else None
    if baseline is not None:
        if not (baseline / "kinspect" / "__init__.py").is_file():
            print(f"--baseline {args.baseline}: no kinspect package there", file=sys.stderr)
            return 2
        if not list((baseline / "kinspect" / "protocol" / "codec").glob("_wire*.so")):
            print(f"--baseline {args.baseline}: its C extension is not built: it runs the pure-Python codec",
                  file=sys.stderr)
        paths += [p + BASELINE for p in paths if p in KINSPECT_PATHS]
    if "haproxy" in paths and not (shutil.which("haproxy") or Path("/usr/sbin/haproxy").exists()):
        print("haproxy is not installed (apt-get install haproxy); its path is left out", file=sys.stderr)
        paths.remove("haproxy")
    profile_dir = Path(args.profile).resolve() if args.profile else None
    if profile_dir is not None:
        if not venv_tool("py-spy"):
            print("--profile needs py-spy on PATH (pip install py-spy)", file=sys.stderr)
            return 2
        profile_dir.mkdir(parents=True, exist_ok=True)

    # SIGTERM unwinds like Ctrl-C, so that the finally below stops everything.
    def on_sigterm(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)

    if pin:
        pin_self(set(cpus[:-1]))  # inherited by the brokers and client threads started from here on
    idle_note = None
    if settings["idle"]:
        # Each idle connection holds a client socket here, two sockets in kinspect and one in Tansu.
        limit, idle_note = raise_nofile(2 * settings["idle"] + 1000)
        if limit < 2 * settings["idle"] + 200:
            settings["idle_requested"] = settings["idle"]
            settings["idle"] = max(0, (limit - 200) // 2)
            idle_note += (f"; the machine does not allow {settings['idle_requested']} idle connections "
                          f"through kinspect (each takes 2 descriptors there): measuring {settings['idle']}")

    codec = Codec()
    small = small_requests.workloads(codec, SMALL_TOPIC, SMALL_FETCH_TOPIC) if settings["small"] else None
    raw_total = {"apiversions": settings["apiversions"] + RAW_WARMUP, "metadata": settings["metadata"] + RAW_WARMUP}
    api_versions = RawRequests(codec, 18, 3, {"ClientSoftwareName": "bench", "ClientSoftwareVersion": "1"},
                               raw_total["apiversions"])
    metadata = RawRequests(codec, 3, 12, {"Topics": None, "AllowAutoTopicCreation": False,
                                          "IncludeTopicAuthorizedOperations": False}, raw_total["metadata"])

    env = environment()
    bulk_note = (f"{settings['records']} x {settings['record_size']} B produced and consumed, "
                 f"{settings['apiversions']} ApiVersions + {settings['metadata']} Metadata round trips, "
                 f"{settings['produce_latency']} acks=1 records" if settings["bulk"] else "no bulk load")
    paced_note = "".join(f", {settings['paced_seconds']:g} s at {r:g}/s" for r in settings["paced_rates"])
    small_note = (f"small requests: {len(SMALL_WORKLOADS)} workloads x (serial, {settings['in_flight']} pipelined) x "
                  f"{settings['connections']} connections x {settings['small_requests']} requests{paced_note}"
                  if settings["small"] else "no small-request load")
    print(f"kinspect proxy benchmark: {settings['reps']} reps x {len(paths)} paths; per cell {bulk_note}; "
          f"{small_note}", flush=True)
    print(f"  pinning: {settings['pinning']}", flush=True)
    print(f"  {env['tansu']}, {env['haproxy']}, confluent-kafka {env['confluent_kafka']} "
          f"(librdkafka {env['librdkafka']}), uvloop {env['uvloop']}, {env['cpus']} cpus, "
          f"load {' '.join(env.get('loadavg_at_start', []))}", flush=True)

    procs = Processes()
    workdir = Path(tempfile.mkdtemp(prefix="kinspect-bench-"))
    results: dict[str, list[dict]] = {p: [] for p in paths}
    failures: list[dict] = []
    started = time.monotonic()
    interrupted = False
    try:
        for rep in range(settings["reps"]):
            spent = time.monotonic() - started
            if rep >= MIN_REPS and spent + spent / rep > settings["budget_s"]:
                print(f"  time budget: {spent:.0f} s spent, another repetition would exceed "
                      f"{settings['budget_s']:.0f} s; stopping after {rep} repetitions", flush=True)
                settings["reps_done"] = rep
                break
            order = paths[rep % len(paths):] + paths[: rep % len(paths)]
            for path in order:
                t0 = time.monotonic()
                try:
                    with Stack(path, procs, workdir, f"rep{rep}", profile_dir, proxy_cpus, baseline) as stack:
                        cell = run_cell(stack, settings, api_versions, metadata, small)
                except (BenchError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    # KafkaException is an Exception too; anything a cell raises is reported and the run goes on
                    failures.append({"rep": rep, "path": path, "error": f"{type(exc).__name__}: {exc}"})
                    print(f"  rep {rep + 1} {path}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                    continue
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    failures.append({"rep": rep, "path": path, "error": f"{type(exc).__name__}: {exc}"})
                    print(f"  rep {rep + 1} {path}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                    continue
                cell["rep"] = rep  # what pairs it with the other paths' cells of this repetition
                results[path].append(cell)
                loop_note = f", loop {cell['event_loop']}" if "event_loop" in cell else ""
                print(f"  rep {rep + 1}/{settings['reps']} {path:<21} {cell_line(cell)}  "
                      f"[{time.monotonic() - t0:.1f} s, load {cell['loadavg_1m']}{loop_note}]", flush=True)
        if settings["idle"] and "kinspect-passthrough" in paths:
            try:
                idle = measure_idle_memory(procs, workdir, settings, codec, proxy_cpus)
                print(f"  idle: {idle['connections']} connections through kinspect (metrics on): "
                      f"{idle['kib_per_connection']:.1f} KiB RSS per connection", flush=True)
            except (BenchError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
                failures.append({"rep": -1, "path": "idle", "error": f"{type(exc).__name__}: {exc}"})
                print(f"  idle: FAILED: {type(exc).__name__}: {exc}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping every process started", file=sys.stderr, flush=True)
    finally:
        # A second Ctrl-C (or a SIGTERM) must not cut the clean-up short.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            procs.stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if args.keep_logs:
            print(f"logs and configs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    elapsed = time.monotonic() - started
    loops = sorted({c.get("event_loop") for p in results if is_kinspect(p) for c in results[p]} - {None})
    report_paths = [p for p in paths if results[p]]
    print()
    summary: dict = {}
    if report_paths and settings["bulk"]:
        table, summary = build_report(results, report_paths)
        print(table)
        print()
        lines, summary["cpu_per_mb"] = cpu_per_mb_report(results, report_paths)
        if lines:
            print("\n".join(lines))
            print()
        lines, summary["machine_cpu_per_mb"] = machine_ceiling_report(results, report_paths)
        if lines:
            print("\n".join(lines))
            print()
    if report_paths and settings["small"]:
        lines, summary["small"] = small_report(results, report_paths, settings)
        print("\n".join(lines))
        print()
    if not report_paths:
        print("no results")
    if "idle_result" in settings:
        idle = settings["idle_result"]
        print(f"idle memory: {idle['connections']} idle connections through kinspect (metrics on, each after one "
              f"ApiVersions): RSS {idle['rss_before_kib']} -> {idle['rss_after_kib']} KiB, "
              f"{idle['kib_per_connection']:.1f} KiB per connection; {idle_note}")
    elif idle_note:
        print(f"idle memory: not measured; {idle_note}")
    print(f"pinning: {settings['pinning']}")
    if profile_dir is not None:
        for raw in sorted(profile_dir.glob("*.txt")):
            if raw.stat().st_size:
                print()
                print(profile_summary.render(profile_summary.summarize(raw)))
    env["loadavg_at_end"] = loadavg()
    print(f"kinspect event loop: {', '.join(loops) or 'unknown'}; run took {elapsed:.0f} s; "
          f"1-min load average {' '.join(env.get('loadavg_at_start', ['?'])[:1])} at start, "
          f"{env['loadavg_at_end']} at end (the benchmark itself keeps ~1-2 cores busy)"
          + ("; PROFILED with py-spy: numbers not comparable" if profile_dir else ""))
    if failures:
        print(f"{len(failures)} cell(s) failed:")
        for f in failures:
            print(f"  rep {f['rep'] + 1} {f['path']}: {f['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "environment": env, "settings": settings, "paths": paths, "profiled": bool(profile_dir),
            "interrupted": interrupted, "seconds": elapsed, "cells": results, "failures": failures,
            "summary": summary, "event_loops": loops, "idle_note": idle_note,
        }, indent=2))
        print(f"wrote {args.json}")
    if interrupted:
        return 130
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
