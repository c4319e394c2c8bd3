"""Bulk throughput in paired rounds: each round produces and consumes through every path, one right after another.

Usage: python benchmarks/bench_bulk_ab.py [--rounds N] [--records N] [--record-size BYTES] [--paths ...]

bench_proxy.py runs a path's bulk phases once a repetition, on a fresh broker, a whole cell (about half a
minute) after direct's, and the machine's load moves in between: direct's own throughput spreads by 40-60%
across repetitions, which hides the few percent the target is about. Here every path's stack (each with
its own Tansu) stays up for the whole run, and each round produces a new topic through every path in turn
and then consumes it through every path in turn, the order rotating from round to round. A path's phase is
seconds from direct's, so each round gives a ratio to direct that carries less of the drift. The output:
each path's median MB/s, the median of its ratios to direct (with their range and the rounds at or above
97%), the proxy's own CPU ms per MB (/proc), and each kinspect path against haproxy: the median of the
rounds' ratios, in how many it was the faster, and the sign test's two-sided p-value.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_proxy  # noqa: E402 (stacks, brokers, topics and the bulk phases of the proxy benchmark)
from bench_ab import sign_test_p  # noqa: E402
from proc_cpu import CpuMeter, loadavg  # noqa: E402

PATHS = ("direct", "kinspect-passthrough", "haproxy")
TARGET = 0.97  # of direct's throughput (issue 12)
WARM_TOPIC = "bench-warm"


def run(paths: list[str], rounds: int, records: int, size: int) -> str:
    """Print what runs, run the rounds, and return the report."""
    procs = bench_proxy.Processes()
    print(f"paired bulk rounds: {rounds} rounds, each {records} x {size} B produced and then consumed through "
          f"{', '.join(paths)} in turn (order rotating); load {' '.join(loadavg())}", flush=True)
    mb_s = {(p, w): [] for p in paths for w in ("produce", "consume")}
    ms_mb = {(p, w): [] for p in paths for w in ("produce", "consume")}
    try:
        with tempfile.TemporaryDirectory(prefix="kinspect-bulk-ab-") as workdir:
            stacks = {p: bench_proxy.Stack(p, procs, Path(workdir), "bulk", None).start() for p in paths}
            for stack in stacks.values():
                bench_proxy.create_topics(stack.broker.bootstrap, [WARM_TOPIC] + [f"r{r}" for r in range(rounds)])
            for r in range(rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for workload in ("produce", "consume"):
                    for p in order:
                        stack = stacks[p]
                        meter = partial(CpuMeter, stack.proxy_pid)
                        if workload == "produce":
                            got = bench_proxy.measure_produce(stack.bootstrap, f"r{r}", WARM_TOPIC, records, size,
                                                              meter)
                        else:
                            got = bench_proxy.measure_consume(stack.bootstrap, f"r{r}", WARM_TOPIC, records, meter)
                        mb_s[(p, workload)].append(got["mb_s"])
                        ms_mb[(p, workload)].append(got["proxy_cpu_ms_per_mb"])
                print(f"  round {r + 1}/{rounds}: " + ", ".join(
                    f"{p} {mb_s[(p, 'produce')][-1]:.0f} / {mb_s[(p, 'consume')][-1]:.0f} MB/s" for p in paths),
                    flush=True)
    finally:
        procs.stop_all()
    return report(paths, mb_s, ms_mb)


def report(paths: list[str], mb_s: dict, ms_mb: dict) -> str:
    lines = [f"{'path':22s} {'workload':8s} {'MB/s':>7s}  {'/ direct: median (min-max)':28s} "
             f"{'rounds >= 97%':>13s}  {'CPU ms/MB':>9s}"]
    for workload in ("produce", "consume"):
        direct = mb_s.get(("direct", workload))
        for p in paths:
            values = mb_s[(p, workload)]
            ratio, share = "-", "-"
            if direct is not None and p != "direct":
                ratios = [v / d for v, d in zip(values, direct)]
                ratio = f"{statistics.median(ratios):.1%} ({min(ratios):.0%}-{max(ratios):.0%})"
                share = f"{sum(x >= TARGET for x in ratios)} of {len(ratios)}"
            cpu = [c for c in ms_mb[(p, workload)] if c is not None]  # none for direct: no proxy
            cpu_text = f"{statistics.median(cpu):9.2f}" if cpu else f"{'-':>9s}"
            lines.append(f"{p:22s} {workload:8s} {statistics.median(values):7.1f}  {ratio:28s} {share:>13s}  {cpu_text}")
    if "haproxy" in paths:
        for p in paths:
            if p in ("direct", "haproxy"):
                continue
            for workload in ("produce", "consume"):
                ratios = [v / h for v, h in zip(mb_s[(p, workload)], mb_s[("haproxy", workload)])]
                faster, differ = sum(x > 1 for x in ratios), sum(x != 1 for x in ratios)
                lines.append(f"{p} / haproxy, {workload}: median {statistics.median(ratios):.1%}, faster in {faster} "
                             f"of {differ} rounds (sign test, two-sided: p = {sign_test_p(faster, differ):.2f})")
    lines.append(f"load {' '.join(loadavg())}")
    return "\n".join(lines)


def chosen_paths(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The paths of --paths (comma-separated): direct first, each known once; else the parser's error."""
    paths = text.split(",")
    known = {"direct", "haproxy", *bench_proxy.KINSPECT_PATHS}
    if paths[0] != "direct" or not set(paths) <= known or len(set(paths)) != len(paths):
        parser.error(f"--paths: direct first, then some of {', '.join(sorted(known - {'direct'}))}")
    return paths


def print_report(script: str, make_report) -> int:
    """Print make_report()'s report and return 0; a benchmark that fails says why in one line, and 1."""
    try:
        print(make_report(), flush=True)
    except bench_proxy.BenchError as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="rounds, each a produce and a consume per path (default 15)")
    p.add_argument("--records", type=int, default=50_000, help="records a phase (default 50000)")
    p.add_argument("--record-size", type=int, default=1024, help="bytes a record (default 1024)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"paths, direct first (default {','.join(PATHS)})")
    args = p.parse_args(argv)
    paths = chosen_paths(p, args.paths)
    if args.rounds < 1 or args.records < 1 or args.record_size < 1:
        p.error("--rounds, --records and --record-size at least 1")
    return print_report("bench_bulk_ab.py", lambda: run(paths, args.rounds, args.records, args.record_size))


if __name__ == "__main__":
    sys.exit(main())
