"""What the forwarding path's Python costs per request, in-process: Relay, Session and observers without the kernel.

    python benchmarks/bench_pipeline.py [--requests N] [--reps N] [--baseline TREE]

One request/response pair of each small-request workload of bench_proxy (ApiVersions v3,
Metadata v12, Produce v9 acks=1 with one 100-byte record, Fetch v12 of 5 such records) is
recorded once from a real Tansu broker. Each pair is then fed, one request and its response
at a time (correlation ids renumbered; each Produce response with its own BaseOffset, as
live), through a `Relay` whose transports are stubs (their
write() only counts), with the observers of one config, built by `kinspect.app`:
  relay      the relay alone: every session marked unframed (what uvloop's callers pay)
  problems   `--no-metrics`: the session and the problem log
  metrics    the default config: metrics and the client inventory
  capture    metrics and the Parquet capture (this thread's share only: the writer thread's
             own CPU is not counted; bench_capture.py measures it)
Reported: the thread's CPU time per request (time.thread_time_ns over --requests
exchanges, after 200 unmeasured), median over --reps fresh relays and its spread (max -
min) / median, and each config's ratio to `relay`. With --baseline TREE the same is run in
a child process with PYTHONPATH=TREE (another kinspect source tree, its C extension built)
and a ratio of this tree to that one is printed per cell: a before/after comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a --baseline child imports kinspect from its own tree

CONFIGS = ("relay", "problems", "metrics", "capture")
WORKLOADS = ("apiversions", "metadata", "produce", "fetch")
WARMUP = 200


def record_pairs() -> dict[str, tuple[bytes, bytes]]:
    """One (request, response) of each workload, size prefixes included, from a fresh Tansu."""
    from confluent_kafka.admin import AdminClient, NewTopic

    import small_requests
    from kinspect.protocol.codec import Codec
    from tests.support.tansu import TansuBroker

    codec = Codec()
    pairs = {}
    with TansuBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("bench", 1, 1), NewTopic("bench-fetch", 1, 1)]).values():
            future.result()
        loads = small_requests.workloads(codec, "bench", "bench-fetch")
        small_requests.run_load(broker.port, loads["prefill"], 1, small_requests.FETCH_RECORDS, 1)
        with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
            for name in WORKLOADS:
                request = loads[name].frames(1, 1)[0]
                sock.sendall(request)
                buf = b""
                while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                    chunk = sock.recv(1 << 20)
                    if not chunk:
                        raise RuntimeError(f"{name}: the broker closed the connection")
                    buf += chunk
                loads[name].check_response(buf[4:])
                pairs[name] = (request, buf)
    return pairs


class _Transport:
    """A transport stub: what the relay calls, writes only counted."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, key):
        return ("127.0.0.1", 1) if key == "peername" else None


def _responses(request: bytes, response: bytes, total: int) -> list[bytes]:
    """`total` copies of a recorded response numbered 0..total-1 (correlation ids), each as a real broker
    would send it: a Produce response names the offset its records got, so no two are alike (the metrics'
    memo of repeated bodies must miss them here as it does live); the other workloads' answers repeat."""
    from kinspect.protocol.codec import Codec

    codec = Codec()
    decoded = codec.decode_request(request[4:])
    if decoded.header.api_key != 0:  # not Produce
        return [response[:4] + i.to_bytes(4, "big") + response[8:] for i in range(total)]
    api_version = decoded.header.api_version
    answer = codec.decode_response(response[4:], 0, api_version)
    body = codec.body(0, "response", api_version)
    header = response[8 : 4 + answer.header_size]  # after the correlation id: the header's tag section
    out = []
    for i in range(total):
        for topic in answer.body["Responses"]:
            for partition in topic["PartitionResponses"]:
                partition["BaseOffset"] = i
        frame = i.to_bytes(4, "big") + header + bytes(body.encode(answer.body))
        out.append(len(frame).to_bytes(4, "big") + frame)
    return out


async def _cell(config_name: str, pair: tuple[bytes, bytes], requests: int) -> float:
    """CPU µs per request of one fresh relay with this config's observers."""
    import time

    from kinspect.app import build_app
    from kinspect.config import Config
    from kinspect.proxy.relay import Relay
    from kinspect.session import ConnectionInfo, Session

    config = Config()
    config.proxy.upstream = "127.0.0.1:1"
    config.metrics.enabled = config_name in ("metrics", "capture")
    capture_dir = None
    if config_name == "capture":
        capture_dir = tempfile.TemporaryDirectory(prefix="kinspect-bench-pipeline-")
        config.capture.enabled, config.capture.directory = True, capture_dir.name
    app = build_app(config)
    if app.capture is not None:
        app.capture.start()
    server = app.server
    session = Session(server.codec, ConnectionInfo(1, "127.0.0.1:1", "broker"), server.session_config, server.plan)
    if config_name == "relay":
        session.client_framed = session.broker_framed = False
    relay = Relay(server, session, server.dispatcher, [])
    relay.client.transport, relay.broker.transport = _Transport(), _Transport()
    relay._early = None  # the broker side is "connected"
    request, response = pair
    total = WARMUP + requests
    reqs = [request[:8] + i.to_bytes(4, "big") + request[12:] for i in range(total)]
    resps = _responses(request, response, total)
    # What the event loop calls for each read: each side's data_received (in any tree).
    client, broker = relay.client.data_received, relay.broker.data_received
    try:
        for i in range(WARMUP):
            client(reqs[i])
            broker(resps[i])
        server.settle()
        start = time.thread_time_ns()
        for i in range(WARMUP, total):
            client(reqs[i])
            broker(resps[i])
        server.settle()  # the reads still waiting for their batch (inspect.batch_delay_ms) are inspected too
        return (time.thread_time_ns() - start) / requests / 1000
    finally:
        if app.capture is not None:
            await asyncio.to_thread(app.capture.close)
        if capture_dir is not None:
            capture_dir.cleanup()


def measure(pairs: dict, requests: int, reps: int) -> dict:
    """{config: {workload: [µs per request of each rep]}}, reps interleaved over configs."""
    out: dict = {c: {w: [] for w in WORKLOADS} for c in CONFIGS}
    for _ in range(reps):
        for config_name in CONFIGS:
            for workload in WORKLOADS:
                out[config_name][workload].append(asyncio.run(_cell(config_name, pairs[workload], requests)))
    return out


def _spread(values: list[float]) -> float:
    med = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / med if med else 0.0


def report(results: dict, baseline: dict | None) -> str:
    lines = ["CPU µs per request (one request and its response), median over reps (spread); x relay = ratio to "
             "the relay alone" + ("; vs baseline = this tree / the --baseline tree" if baseline else "")]
    header = f"{'config':<10}" + "".join(f"{w:>30}" for w in WORKLOADS)
    lines.append(header)
    for config_name in CONFIGS:
        cells = []
        for workload in WORKLOADS:
            values = results[config_name][workload]
            med = statistics.median(values)
            relay = statistics.median(results["relay"][workload])
            cell = f"{med:6.2f} ({_spread(values):3.0f}%) {med / relay:5.1f}x relay"
            if baseline:
                cell += f" {med / statistics.median(baseline[config_name][workload]):4.2f}x base"
            cells.append(f"{cell:>30}")
        lines.append(f"{config_name:<10}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000, help="measured exchanges per cell (default 5000)")
    p.add_argument("--reps", type=int, default=5, help="fresh relays per cell (default 5)")
    p.add_argument("--baseline", metavar="TREE", help="also run this kinspect source tree, in a child process")
    p.add_argument("--pairs", metavar="JSON", help=argparse.SUPPRESS)  # the child's input: the parent's pairs
    p.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # the child's output: JSON
    args = p.parse_args(argv)
    if args.pairs:
        pairs = {k: (bytes.fromhex(a), bytes.fromhex(b)) for k, (a, b) in json.loads(Path(args.pairs).read_text()).items()}
    else:
        pairs = record_pairs()
    baseline = None
    if args.baseline:
        tree = Path(args.baseline).resolve()
        if not (tree / "kinspect" / "__init__.py").is_file():
            print(f"--baseline {args.baseline}: no kinspect package there", file=sys.stderr)
            return 2
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({k: (a.hex(), b.hex()) for k, (a, b) in pairs.items()}, f)
        try:
            child = subprocess.run([sys.executable, __file__, "--pairs", f.name, "--raw", "--requests",
                                    str(args.requests), "--reps", str(args.reps)], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(tree)}, check=False)
        finally:
            os.unlink(f.name)
        if child.returncode != 0:
            print(f"the --baseline run failed:\n{child.stderr[-2000:]}", file=sys.stderr)
            return 1
        baseline = json.loads(child.stdout)
    results = measure(pairs, args.requests, args.reps)
    if args.raw:
        print(json.dumps(results))
        return 0
    import kinspect

    print(f"kinspect {kinspect.__file__.rsplit('/kinspect/', 1)[0]}: {args.reps} reps x {args.requests} requests "
          f"per cell" + (f"; baseline {args.baseline}" if baseline else ""))
    print(report(results, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
