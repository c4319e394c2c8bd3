"""Added latency in paired rounds: each round times lone round trips through every path, one right after another.

Usage: python benchmarks/bench_latency_ab.py [--rounds N] [--requests N] [--records N] [--paths ...]
                                             [--rate R [--connections N]]

bench_proxy.py times a path's round trips once a repetition, a whole cell (about half a minute) after
direct's, and the machine's load moves in between: direct's own ApiVersions p50 spreads by 60-180% across
repetitions, against a target of 0.1 ms added. Here every path's stack (each with its own Tansu) stays
up for the whole run, and each round times, through every path in turn (the order rotating by round),
--requests ApiVersions v3 requests one at a time on one connection and --records acks=1 produce requests
of 1 KiB (confluent-kafka, linger.ms=0, one at a time). The output: each path's median p50 and p99, the
median of its per-round added p50 and p99 against direct's in the same round (with their range and the
rounds within the targets: 0.1 ms and 0.5 ms), and each kinspect path against haproxy: the median of
the rounds' differences in added latency, in how many rounds kinspect added less, and the sign test.

--rate R: instead, each round runs the small-request load's four workloads (ApiVersions, Metadata, acks=1
Produce and Fetch, benchmarks/small_requests.py) through every path at a fixed rate: --connections
connections (8) one request at a time, R requests a second in all, --requests a connection. That is the
load bench_proxy.py judges the latency targets on (its paced phases), here paired round by round, so a
path's added p50 is told from haproxy's by the sign test rather than by two medians minutes apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_proxy  # noqa: E402 (stacks, brokers, topics and the latency phases of the proxy benchmark)
import small_requests  # noqa: E402
from bench_ab import sign_test_p  # noqa: E402
from bench_bulk_ab import chosen_paths, print_report  # noqa: E402 (the same paths and failures as the bulk rounds)
from proc_cpu import loadavg  # noqa: E402

from kinspect.protocol.codec import Codec  # noqa: E402

PATHS = ("direct", "kinspect-passthrough", "haproxy")
WORKLOADS = ("apiversions", "produce")
PACED_WORKLOADS = ("apiversions", "metadata", "produce", "fetch")  # small_requests' workloads, under --rate
TARGETS_MS = {"p50": 0.1, "p99": 0.5}  # added to direct's (issue 12)
TOPIC = "bench-latency"
RECORD_SIZE = 1024
WARMUP = 100  # ApiVersions round trips a phase starts with, not timed
PACED_WARMUP = 20  # under --rate, requests a connection before each phase, as fast as answers come, not timed


def run(paths: list[str], rounds: int, requests: int, records: int) -> str:
    """Print what runs, run the rounds, and return the report."""
    procs = bench_proxy.Processes()
    print(f"paired latency rounds: {rounds} rounds, each {requests} ApiVersions and {records} acks=1 produce "
          f"requests one at a time through {', '.join(paths)} in turn (order rotating); "
          f"load {' '.join(loadavg())}", flush=True)
    api_versions = bench_proxy.RawRequests(Codec(), 18, 3, {"ClientSoftwareName": "bench",
                                                             "ClientSoftwareVersion": "1"}, WARMUP + requests)
    # (path, workload) -> [(p50, p99) per round], in ms
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(p, w): [] for p in paths for w in WORKLOADS}
    try:
        with tempfile.TemporaryDirectory(prefix="kinspect-latency-ab-") as workdir:
            stacks = {p: bench_proxy.Stack(p, procs, Path(workdir), "lat", None).start() for p in paths}
            for stack in stacks.values():
                bench_proxy.create_topics(stack.broker.bootstrap, [TOPIC])
            for r in range(rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for workload in WORKLOADS:
                    for p in order:
                        stack = stacks[p]
                        if workload == "apiversions":
                            port = int(stack.bootstrap.rpartition(":")[2])
                            got = bench_proxy.measure_round_trips(port, api_versions, WARMUP)
                        else:
                            got = bench_proxy.measure_produce_latency(stack.bootstrap, TOPIC, records, RECORD_SIZE)
                        times[(p, workload)].append((got["p50_ms"], got["p99_ms"]))
                print(f"  round {r + 1}/{rounds}: " + ", ".join(
                    f"{p} {times[(p, 'apiversions')][-1][0]:.3f} / {times[(p, 'produce')][-1][0]:.3f} ms"
                    for p in paths), flush=True)
    finally:
        procs.stop_all()
    return report(paths, times)


def run_paced(paths: list[str], rounds: int, requests: int, connections: int, rate: float) -> str:
    """The rounds under --rate: every small workload through every path at `rate` requests a second in all."""
    procs = bench_proxy.Processes()
    print(f"paired paced rounds: {rounds} rounds, each {', '.join(PACED_WORKLOADS)} through {', '.join(paths)} in "
          f"turn (order rotating): {connections} connections x {requests} requests one at a time at {rate:g}/s in "
          f"all; load {' '.join(loadavg())}", flush=True)
    codec = Codec()
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(p, w): [] for p in paths for w in PACED_WORKLOADS}
    try:
        with tempfile.TemporaryDirectory(prefix="kinspect-latency-ab-") as workdir:
            stacks = {p: bench_proxy.Stack(p, procs, Path(workdir), "lat", None).start() for p in paths}
            ports, loads = {}, {}
            for p, stack in stacks.items():
                bench_proxy.create_topics(stack.broker.bootstrap, ["t", "f"])
                ports[p] = int(stack.bootstrap.rpartition(":")[2])
                loads[p] = small_requests.workloads(codec, "t", "f")
                small_requests.run_load(ports[p], loads[p]["prefill"], 1, small_requests.FETCH_RECORDS, 1)
            for r in range(rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for workload in PACED_WORKLOADS:
                    for p in order:
                        # the path's first frames of this kind (codecs, metric cells) are not timed
                        try:
                            small_requests.run_load(ports[p], loads[p][workload], connections, PACED_WARMUP, 1)
                            got = small_requests.run_paced(ports[p], loads[p][workload], connections, requests, rate)
                        except small_requests.LoadError as exc:
                            raise bench_proxy.BenchError(f"{p}: {exc}") from exc
                        ordered = sorted(got["latencies_ms"])
                        times[(p, workload)].append((bench_proxy.percentile(ordered, 50),
                                                     bench_proxy.percentile(ordered, 99)))
                print(f"  round {r + 1}/{rounds}: p50 " + ", ".join(
                    f"{p} " + " / ".join(f"{times[(p, w)][-1][0]:.3f}" for w in PACED_WORKLOADS) for p in paths)
                    + " ms", flush=True)
    finally:
        procs.stop_all()
    return report(paths, times, PACED_WORKLOADS)


def report(paths: list[str], times: dict, workloads: tuple[str, ...] = WORKLOADS) -> str:
    lines = [f"{'path':22s} {'workload':11s} {'p50':>6s} {'p99':>6s}  {'added p50: median (range)':30s} "
             f"{'within 0.1':>10s}  {'added p99: median (range)':30s} {'within 0.5':>10s}"]
    added: dict[tuple[str, str, str], list[float]] = {}
    for workload in workloads:
        direct = times[("direct", workload)]
        for p in paths:
            rounds = times[(p, workload)]
            cells = []
            for i, q in enumerate(("p50", "p99")):
                if p == "direct":
                    cells += ["-", "-"]
                    continue
                values = added[(p, workload, q)] = [mine[i] - base[i] for mine, base in zip(rounds, direct)]
                cells += [f"{statistics.median(values):+.3f} ({min(values):+.3f} to {max(values):+.3f})",
                          f"{sum(v <= TARGETS_MS[q] for v in values)} of {len(values)}"]
            lines.append(f"{p:22s} {workload:11s} {statistics.median(r[0] for r in rounds):6.3f} "
                         f"{statistics.median(r[1] for r in rounds):6.3f}  {cells[0]:30s} {cells[1]:>10s}  "
                         f"{cells[2]:30s} {cells[3]:>10s}")
    if "haproxy" in paths:
        for p in paths:
            if p in ("direct", "haproxy"):
                continue
            for workload in workloads:
                for q in ("p50", "p99"):
                    diffs = [m - h for m, h in zip(added[(p, workload, q)], added[("haproxy", workload, q)])]
                    less, differ = sum(d < 0 for d in diffs), sum(d != 0 for d in diffs)
                    lines.append(f"{p} - haproxy, {workload} added {q}: median {statistics.median(diffs):+.3f} ms, "
                                 f"less in {less} of {differ} rounds (sign test, two-sided: p = "
                                 f"{sign_test_p(less, differ):.2f})")
    lines.append(f"load {' '.join(loadavg())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="rounds, each every workload per path (default 15)")
    p.add_argument("--requests", type=int, default=1000,
                   help="ApiVersions round trips a phase; under --rate, requests a connection (default 1000)")
    p.add_argument("--records", type=int, default=300, help="acks=1 produce requests a phase (default 300)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"paths, direct first (default {','.join(PATHS)})")
    p.add_argument("--rate", type=float, metavar="R",
                   help="the four small workloads at R requests a second in all, one at a time a connection")
    p.add_argument("--connections", type=int, default=8, help="connections under --rate (default 8)")
    args = p.parse_args(argv)
    paths = chosen_paths(p, args.paths)
    if args.rounds < 1 or args.requests < 1 or args.records < 1 or args.connections < 1:
        p.error("--rounds, --requests, --records and --connections at least 1")
    if args.rate is not None and args.rate <= 0:
        p.error("--rate: requests a second, more than 0")
    if args.rate is not None:
        return print_report("bench_latency_ab.py",
                            lambda: run_paced(paths, args.rounds, args.requests, args.connections, args.rate))
    return print_report("bench_latency_ab.py", lambda: run(paths, args.rounds, args.requests, args.records))


if __name__ == "__main__":
    sys.exit(main())
