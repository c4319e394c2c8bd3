"""Bulk throughput in paired rounds: each round produces and consumes through every path, one right after another.

Usage: python benchmarks/bench_bulk_ab.py [--rounds N] [--records N] [--record-size BYTES] [--paths ...]
                                         [--baseline TREE]

bench_proxy.py runs a path's bulk phases once a repetition, on a fresh broker, a whole cell (about half a
minute) after direct's, and the machine's load moves in between: direct's own throughput spreads by 40-60%
across repetitions, which hides the few percent the target is about. Here every path's stack (each with
its own Tansu) stays up for the whole run, and each round produces a new topic through every path in turn
and then consumes it through every path in turn, the order rotating from round to round. A path's phase is
seconds from direct's, so each round gives a ratio to direct that carries less of the drift. The output:
each path's median MB/s, the median of its ratios to direct (with their range and the rounds at or above
97%), the proxy's own CPU ms per MB (/proc), and each kinspect path against haproxy: the median of the
rounds' ratios, in how many it was the faster, and the sign test's two-sided p-value; the same for the
CPU per MB (the rounds it cost less). The CPU per MB of one phase moves by 20-40% from round to round, and
pairs of paths by less: 40 rounds tell a difference of 5% (docs/performance.md, "fourteenth").

--baseline TREE adds, for each kinspect path, the same path run from another kinspect source tree (its C
extensions built in place), and compares the two round by round: a change's effect, in the same rounds.

Tansu keeps every topic in memory, so each path's broker holds rounds x records x record size bytes by
the end (60 rounds of 100 MB through four paths filled this 24 GB machine); a run that would need more
than half the memory available stops before it starts, and says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_proxy  # noqa: E402 (stacks, brokers, topics and the bulk phases of the proxy benchmark)
from bench_ab import sign_test_p  # noqa: E402
from proc_cpu import CpuMeter, cpu_seconds, loadavg  # noqa: E402

PATHS = ("direct", "kinspect-passthrough", "haproxy")
TARGET = 0.97  # of direct's throughput (issue 12)
WARM_TOPIC = "bench-warm"


class SplitMeter(CpuMeter):
    """The proxy's CPU as CpuMeter reads it, and the CPU seconds of other processes of the phase (the client, which
    is this process, and the broker) in "others_s": what a path costs the processes at either end of it."""

    def __init__(self, pid: int | None, others: dict[str, int | None]) -> None:
        super().__init__(pid)
        self.others, self.o0 = others, {}

    def start(self) -> "SplitMeter":
        self.o0 = {name: cpu_seconds(pid) for name, pid in self.others.items()}
        super().start()
        return self

    def stop(self) -> dict:
        used = super().stop()
        now = {name: cpu_seconds(pid) for name, pid in self.others.items()}
        used["others_s"] = {name: None if now[name] is None or self.o0.get(name) is None else now[name] - self.o0[name]
                            for name in self.others}
        return used


class MachinePhase(NamedTuple):
    """One phase's whole-machine figures (None where unread): CPU ms per MB, busy and stolen shares, the proxy's
    system ms per MB, and the ends' (client, broker) CPU ms per MB."""

    cost: float | None
    busy: float | None
    stolen: float | None
    kernel: float | None = None
    ends: dict = {}


def others_ms_per_mb(got: dict) -> dict:
    """The client's and the broker's CPU ms per MB in a phase (SplitMeter's others_s), None where unread."""
    others, mb = (got.get("proxy_cpu") or {}).get("others_s") or {}, got["mb_s"] * got["seconds"]
    return {name: None if seconds is None or not mb else 1000.0 * seconds / mb for name, seconds in others.items()}


def memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_check(paths: list[str], rounds: int, records: int, size: int, available: int | None) -> str | None:
    """Why the run would not fit in memory (each path's Tansu keeps every round's topic), or None."""
    needed = len(paths) * rounds * records * size
    if available is not None and needed > available / 2:
        return (f"the brokers would hold {needed / 1e9:.1f} GB by the end (Tansu keeps every topic in memory: "
                f"{len(paths)} paths x {rounds} rounds x {records} records x {size} B), more than half the "
                f"{available / 1e9:.1f} GB available; fewer --rounds or --records")
    return None


def run(paths: list[str], rounds: int, records: int, size: int, baseline: Path | None = None) -> str:
    """Print what runs, run the rounds, and return the report. With a baseline tree, each kinspect path is also
    run from it (path@baseline)."""
    if baseline is not None:
        paths = paths + [p + bench_proxy.BASELINE for p in paths if bench_proxy.is_kinspect(p)]
    too_much = memory_check(paths, rounds, records, size, memory_available())
    if too_much:
        raise bench_proxy.BenchError(too_much)
    procs = bench_proxy.Processes()
    print(f"paired bulk rounds: {rounds} rounds, each {records} x {size} B produced and then consumed through "
          f"{', '.join(paths)} in turn (order rotating); load {' '.join(loadavg())}", flush=True)
    mb_s = {(p, w): [] for p in paths for w in ("produce", "consume")}
    ms_mb = {(p, w): [] for p in paths for w in ("produce", "consume")}
    machine = {(p, w): [] for p in paths for w in ("produce", "consume")}
    try:
        with tempfile.TemporaryDirectory(prefix="kinspect-bulk-ab-") as workdir:
            stacks = {p: bench_proxy.Stack(p, procs, Path(workdir), "bulk", None, baseline=baseline).start()
                      for p in paths}
            for stack in stacks.values():
                bench_proxy.create_topics(stack.broker.bootstrap, [WARM_TOPIC] + [f"r{r}" for r in range(rounds)])
            for r in range(rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for workload in ("produce", "consume"):
                    for p in order:
                        stack = stacks[p]
                        meter = partial(SplitMeter, stack.proxy_pid, {"client": os.getpid(), "broker": stack.broker.pid})
                        if workload == "produce":
                            got = bench_proxy.measure_produce(stack.bootstrap, f"r{r}", WARM_TOPIC, records, size,
                                                              meter)
                        else:
                            got = bench_proxy.measure_consume(stack.bootstrap, f"r{r}", WARM_TOPIC, records, meter)
                        mb_s[(p, workload)].append(got["mb_s"])
                        ms_mb[(p, workload)].append(got["proxy_cpu_ms_per_mb"])
                        machine[(p, workload)].append(MachinePhase(
                            got["machine_cpu_ms_per_mb"], got["machine_busy_pct"], got["machine_stolen_pct"],
                            kernel_ms_per_mb(got), others_ms_per_mb(got)))
                print(f"  round {r + 1}/{rounds}: " + ", ".join(
                    f"{p} {mb_s[(p, 'produce')][-1]:.0f} / {mb_s[(p, 'consume')][-1]:.0f} MB/s" for p in paths),
                    flush=True)
    finally:
        procs.stop_all()
    return report(paths, mb_s, ms_mb, machine)


def kernel_ms_per_mb(got: dict) -> float | None:
    """The proxy's system CPU ms per MB in a phase: the kernel's work on its sockets, which any proxy pays."""
    used, mb_s = got.get("proxy_cpu") or {}, got.get("mb_s")
    system, seconds = used.get("system_s"), got.get("seconds")
    if system is None or not mb_s or not seconds:
        return None
    return 1000.0 * system / (mb_s * seconds)


def machine_lines(paths: list[str], machine: dict) -> list[str]:
    """What the whole machine's CPU says of the throughput target: each path's machine CPU ms per MB, the busy and
    stolen shares, and the ceiling the CPU puts on its throughput against direct's (direct's machine CPU per MB
    over the path's, round by round: when the CPUs are busy in both phases, a path that costs the machine 5%
    more CPU a MB moves at most 1/1.05 of direct's bytes). 97% of direct needs a path to add at most 3.1% of
    direct's machine CPU per MB, the proxy's own CPU and the kernel's work for the extra hop together; the
    proxy's system time per MB (its sockets' kernel work) shows what of that any proxy pays; the client's and the
    broker's CPU ms per MB, what the path costs the processes at its ends."""
    lines = ["machine CPU (every process and the kernel, /proc/stat): ms per MB, busy share of the CPU time it had, "
             "stolen share; the ceiling = direct's ms per MB / the path's, median of rounds (min-max); the proxy's "
             "system time (its sockets' kernel work) per MB; the client's and the broker's CPU ms per MB"]
    for workload in ("produce", "consume"):
        direct = machine.get(("direct", workload))
        for p in paths:
            rows = machine[(p, workload)]
            cost = [r.cost for r in rows if r.cost is not None]
            if not cost:
                continue
            busy = [r.busy for r in rows if r.busy is not None]
            stolen = [r.stolen for r in rows if r.stolen is not None]
            text = (f"  {p:28s} {workload:8s} {statistics.median(cost):6.2f} ms/MB, busy {statistics.median(busy):.0f}%"
                    f", stolen {statistics.median(stolen):.0f}%")
            if direct is not None and p != "direct":
                ceilings = [d.cost / r.cost for d, r in zip(direct, rows) if d.cost and r.cost]
                if ceilings:
                    text += (f"; ceiling {statistics.median(ceilings):.1%} ({min(ceilings):.0%}-{max(ceilings):.0%}),"
                             f" added {statistics.median(cost) - statistics.median(r.cost for r in direct if r.cost):+.2f}"
                             " ms/MB")
                kernel = [r.kernel for r in rows if r.kernel is not None]
                if kernel:
                    text += f"; proxy's system time {statistics.median(kernel):.2f} ms/MB"
            elif p == "direct":
                allowed = statistics.median(cost) * (1 / TARGET - 1)
                text += f"; {TARGET:.0%} of direct allows a path to add at most {allowed:.2f} ms/MB"
            for name in ("client", "broker"):
                values = [r.ends[name] for r in rows if r.ends.get(name) is not None]
                if values:
                    text += f"; {name} {statistics.median(values):.2f}"
            lines.append(text)
    return lines


def report(paths: list[str], mb_s: dict, ms_mb: dict, machine: dict | None = None) -> str:
    lines = [f"{'path':30s} {'workload':8s} {'MB/s':>7s}  {'/ direct: median (min-max)':28s} "
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
            lines.append(f"{p:30s} {workload:8s} {statistics.median(values):7.1f}  {ratio:28s} {share:>13s}  {cpu_text}")
    pairs = [(p, "haproxy") for p in paths if "haproxy" in paths and p not in ("direct", "haproxy")]
    pairs += [(p, p + bench_proxy.BASELINE) for p in paths if p + bench_proxy.BASELINE in paths]
    for p, ref in pairs:
        for workload in ("produce", "consume"):
            ratios = [v / h for v, h in zip(mb_s[(p, workload)], mb_s[(ref, workload)])]
            faster, differ = sum(x > 1 for x in ratios), sum(x != 1 for x in ratios)
            lines.append(f"{p} / {ref}, {workload}: median {statistics.median(ratios):.1%}, faster in {faster} "
                         f"of {differ} rounds (sign test, two-sided: p = {sign_test_p(faster, differ):.2f})")
            cpu = [c / h for c, h in zip(ms_mb[(p, workload)], ms_mb[(ref, workload)]) if c is not None and h]
            if cpu:
                lower, differ = sum(x < 1 for x in cpu), sum(x != 1 for x in cpu)
                lines.append(f"    CPU per MB: median {statistics.median(cpu):.3f}x, lower in {lower} of {differ} "
                             f"rounds (p = {sign_test_p(lower, differ):.3f})")
    if machine:
        lines += machine_lines(paths, machine)
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
    p.add_argument("--baseline", metavar="TREE", help="also run each kinspect path from this kinspect source tree")
    args = p.parse_args(argv)
    paths = chosen_paths(p, args.paths)
    if args.rounds < 1 or args.records < 1 or args.record_size < 1:
        p.error("--rounds, --records and --record-size at least 1")
    baseline = Path(args.baseline).resolve() if args.baseline else None
    if baseline is not None and not (baseline / "kinspect" / "__init__.py").is_file():
        p.error(f"--baseline {args.baseline}: no kinspect package there")
    return print_report("bench_bulk_ab.py", lambda: run(paths, args.rounds, args.records, args.record_size, baseline))


if __name__ == "__main__":
    sys.exit(main())
