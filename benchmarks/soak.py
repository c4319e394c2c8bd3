"""Soak run: kinspect under steady load for a while, sampled for memory, descriptors, tasks and in-flight requests.

    python benchmarks/soak.py [--duration 600] [--interval 10] [--rate 500] [--mode passthrough|rewrite] [--capture]

Starts a Tansu broker and `kinspect proxy` as a subprocess in front of it (so the RSS and
descriptors measured are the proxy's own), then keeps a steady load going through it:
  producer  confluent-kafka, --rate records/s of --record-size bytes, acks=all
  consumer  confluent-kafka, in a group (session.timeout.ms 6000), reading them back
  churn     one short-lived raw connection a second (ApiVersions + Metadata, then close),
            so a per-connection leak shows up as growth
Every --interval seconds it prints one row: RSS and open descriptors of the kinspect process
(/proc/PID/status, /proc/PID/fd), and from kinspect's /metrics the asyncio tasks, in-flight
requests and open connections, with the records produced and consumed so far. --capture
captures every exchange (--capture-dir, its default writer process) and adds two columns:
the writer process's RSS and the rows captured so far.

Verdict: after a warm-up (the first fifth of the run, at least 30 s), RSS: the mean of the
last third of the samples against the first sample (flat: less than 10 % growth); the
writer process's the same way. With --capture, no row may be dropped.
Descriptors, tasks and in-flight requests move with the load at the instant of a sample, and
a leak raises their floor: the lowest value of the last third against the lowest of the
first third (flat: at most 2, 1 and 2 above). Every record produced must be consumed.
Exit status 0 when flat and nothing was lost, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from prometheus_client.parser import text_string_to_metric_families

from kinspect.protocol.codec import Codec
from proc_cpu import descendants, rss_kib
from tests.support.tansu import TansuBroker, free_port

TANSU_NODE_ID = 111
TOPIC = "soak.topic"


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kinspect exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"kinspect did not listen on {port} within {timeout} s")


def proc_status(pid: int) -> tuple[int, int]:
    """(RSS bytes, open descriptors) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def descendants_rss(pid: int) -> int:
    """RSS bytes of the processes kinspect started (its capture writer process)."""
    # rss_kib is None for a process that ended meanwhile (a writer process is replaced if it dies).
    return sum((rss_kib(child) or 0) * 1024 for child in descendants(pid))


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


class Load:
    """The producer, consumer and churn threads, and their counts."""

    def __init__(self, bootstrap: str, rate: int, record_size: int, codec: Codec) -> None:
        self.bootstrap = bootstrap
        self.rate = rate
        self.record_size = record_size
        self.codec = codec
        self.stop = threading.Event()
        self.produced = 0  # delivery reports without error
        self.produce_errors = 0
        self.consumed: set[int] = set()
        self.consumed_total = 0
        self.churned = 0
        self.churn_errors = 0
        self.threads = [threading.Thread(target=fn, name=fn.__name__, daemon=True)
                        for fn in (self.produce, self.consume, self.churn)]

    def start(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(20)
        for t in self.threads:
            t.start()

    def produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": False})

        def report(err, msg) -> None:
            if err is None:
                self.produced += 1
            else:
                self.produce_errors += 1

        pad = b"x" * max(0, self.record_size - 12)
        n = 0
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while n < due:
                producer.produce(TOPIC, value=struct.pack(">Q", n) + pad, on_delivery=report)
                n += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(30)

    def consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "soak", "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "enable.auto.commit": True})
        consumer.subscribe([TOPIC])
        try:
            idle_since = None
            while True:
                msg = consumer.poll(0.2)
                if msg is None:
                    # After stop: keep reading until everything delivered is in (or 20 s of nothing).
                    if self.stop.is_set():
                        if not self.threads[0].is_alive() and self.produced <= len(self.consumed):
                            break
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 20:
                            break
                    continue
                idle_since = None
                if msg.error() is None:
                    self.consumed.add(struct.unpack_from(">Q", msg.value())[0])
                    self.consumed_total += 1
        finally:
            consumer.close()

    def churn(self) -> None:
        from tests.support.proxy_harness import api_versions, metadata, recv_frame

        host, port = self.bootstrap.rsplit(":", 1)
        while not self.stop.wait(1.0):
            try:
                with socket.create_connection((host, int(port)), timeout=5) as sock:
                    sock.sendall(api_versions(self.codec, 1) + metadata(self.codec, 2, [TOPIC]))
                    recv_frame(sock)
                    recv_frame(sock)
                self.churned += 1
            except OSError:
                self.churn_errors += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of steady load (default 600)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument("--rate", type=int, default=500, help="records produced per second (default 500)")
    ap.add_argument("--record-size", type=int, default=1024, help="bytes per record (default 1024)")
    ap.add_argument("--mode", choices=["passthrough", "rewrite"], default="passthrough")
    ap.add_argument("--capture", action="store_true", help="capture every exchange, and watch the writer process too")
    args = ap.parse_args(argv)

    codec = Codec()
    workdir = Path(tempfile.mkdtemp(prefix="kinspect-soak-"))
    listen, metrics_port = free_port(), free_port()
    kinspect_bin = str(Path(sys.executable).with_name("kinspect"))
    if args.mode == "passthrough":
        tansu = TansuBroker(advertised_port=listen)  # clients' follow-up connections come through kinspect
        tansu.start()
        cmd = [kinspect_bin, "proxy", "--mode", "passthrough", "--listen", f"127.0.0.1:{listen}",
               "--upstream", tansu.bootstrap]
    else:
        tansu = TansuBroker().start()
        base = free_port() - TANSU_NODE_ID
        cmd = [kinspect_bin, "proxy", "--mode", "rewrite", "--listen", f"127.0.0.1:{listen}",
               "--bootstrap-server", tansu.bootstrap, "--node-port-base", str(base)]
    cmd += ["--metrics-listen", f"127.0.0.1:{metrics_port}", "--log-level", "WARNING"]
    if args.capture:
        cmd += ["--capture-dir", str(workdir / "capture")]
    log_path = workdir / "kinspect.log"
    log = open(log_path, "wb")
    proxy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    load = None
    rows: list[dict] = []
    try:
        wait_port(listen, proxy)
        wait_port(metrics_port, proxy)
        load = Load(f"127.0.0.1:{listen}", args.rate, args.record_size, codec)
        load.start()
        print(f"soak: {args.duration:g} s at {args.rate} records/s of {args.record_size} B through kinspect "
              f"({args.mode}{', capture on' if args.capture else ''}, pid {proxy.pid}), a sample every "
              f"{args.interval:g} s; kinspect log: {log_path}", flush=True)
        header = (f"{'t (s)':>6} {'RSS MiB':>8} {'fds':>5} {'tasks':>6} {'in-flight':>9} {'conns':>6} "
                  f"{'produced':>9} {'consumed':>9} {'churned':>8}")
        if args.capture:
            header += f" {'writer MiB':>10} {'captured':>9}"
        print(header, flush=True)
        started = time.monotonic()
        next_at = started
        while True:
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            t = time.monotonic() - started
            if proxy.poll() is not None:
                raise SystemExit(f"kinspect exited with status {proxy.returncode}; see {log_path}")
            rss, fds = proc_status(proxy.pid)
            m = scrape(metrics_port)
            row = {"t": t, "rss": rss, "fds": fds, "tasks": m.get("kinspect_tasks", -1),
                   "inflight": m.get("kinspect_inflight_requests", -1), "conns": m.get("kinspect_connections_open", -1),
                   "writer_rss": descendants_rss(proxy.pid) if args.capture else 0,
                   "captured": m.get("kinspect_capture_rows_accepted_total", 0),
                   "dropped": m.get("kinspect_capture_dropped_rows_total", 0)}
            rows.append(row)
            line = (f"{t:6.0f} {rss / 2**20:8.1f} {fds:5d} {row['tasks']:6.0f} {row['inflight']:9.0f} "
                    f"{row['conns']:6.0f} {load.produced:9d} {len(load.consumed):9d} {load.churned:8d}")
            if args.capture:
                line += f" {row['writer_rss'] / 2**20:10.1f} {row['captured']:9.0f}"
            print(line, flush=True)
            if t >= args.duration:
                break
            next_at += args.interval
    finally:
        if load is not None:
            load.stop.set()
            for thread in load.threads:
                thread.join(60)
        if proxy.poll() is None:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(15)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
        log.close()
        tansu.stop()
    return verdict(rows, load, args)


def verdict(rows: list[dict], load: Load, args) -> int:
    warmup = max(30.0, args.duration / 5)
    after = [r for r in rows if r["t"] >= warmup]
    if len(after) < 3:
        print("verdict: too few samples after the warm-up to judge; run longer")
        return 1
    base = after[0]
    third = max(1, len(after) // 3)
    first, last = after[:third], after[-third:]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in last)

    def floor(rows_: list[dict], key: str) -> float:
        return min(r[key] for r in rows_)

    checks = {}
    for name, key in (("RSS", "rss"), ("writer RSS", "writer_rss")) if args.capture else (("RSS", "rss"),):
        growth = 100.0 * (mean(key) - base[key]) / max(base[key], 1)
        checks[name] = (growth < 10.0, f"{base[key] / 2**20:.1f} -> {mean(key) / 2**20:.1f} MiB mean ({growth:+.1f} %)")
    # Descriptors, tasks and in-flight requests move with the load at the instant of a sample (a
    # churn connection, a long-poll Fetch, a Produce awaiting acks=all); what leaks raises the
    # floor. So the lowest value of the last third is compared to the lowest of the first.
    for name, key, slack in (("fds", "fds", 2), ("tasks", "tasks", 1), ("in-flight", "inflight", 2)):
        a, b = floor(first, key), floor(last, key)
        checks[name] = (b <= a + slack, f"floor {a:.0f} -> {b:.0f} (mean of last third {mean(key):.1f})")
    missing = load.produced - len(load.consumed)
    print(f"after warm-up ({warmup:.0f} s): baseline at t={base['t']:.0f} s (first {third} samples) against "
          f"the last {len(last)} samples")
    for name, (ok, text) in checks.items():
        print(f"  {name:<10} {text:<52} {'flat' if ok else 'GROWING'}")
    print(f"  records    produced {load.produced} (errors {load.produce_errors}), consumed {len(load.consumed)} "
          f"distinct ({load.consumed_total} in all), missing {max(0, missing)}; "
          f"churn connections {load.churned} (errors {load.churn_errors})")
    ok = all(ok for ok, _ in checks.values()) and missing <= 0 and load.produce_errors == 0
    if args.capture:
        captured, dropped = rows[-1]["captured"], rows[-1]["dropped"]
        print(f"  capture    {captured:.0f} exchanges taken, {dropped:.0f} dropped")
        ok = ok and captured > 0 and dropped == 0
    print("verdict:", "FLAT, nothing lost" if ok else "NOT FLAT or records lost")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
