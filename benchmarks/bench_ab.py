"""Two kinspect trees compared in paired rounds: a small request's CPU, one tree's proxy right after the other's.

Usage: python benchmarks/bench_ab.py [--trees A,B] [--path PATH] [--rounds N] [--requests N] [--connections N]
                                     [--workloads ...] [--rate R]

bench_proxy.py --baseline interleaves whole repetitions: the two trees' phases of one workload are a
repetition's length apart, on fresh brokers, and the machine's load moves between them. Here both trees'
proxies (each in front of its own Tansu) stay up for the whole run, and each round runs every workload
one request at a time per connection through one proxy and at once through the other, the order
alternating from round to round. Each pair of phases is a second or two apart, so a pair's ratio B/A
carries less of the load's drift. The output gives each workload's median CPU µs a request (the proxy's,
from /proc, its capture writer process's included under --path kinspect-capture), the median of every
pair's ratio, in how many pairs B was the lower, and the sign test's two-sided p-value: how often
chance alone would split the pairs at least that unevenly. Then the same for the round trips' p99 (ms,
every request of a phase; by pair B - A): under load a p99 moves by tenths of a ms between repetitions of
bench_proxy.py with nothing changed, where a pair's two phases meet the same load.

--trees: two kinspect source trees, each with its C extensions built in place (`python setup.py
build_ext --inplace`). Default: this checkout against itself, an A/A run, which shows how far from
1.00 the median ratio and the split wander when nothing differs.

--rate R: each phase sends one request at a time at R requests a second in all (small_requests.run_paced, the
load bench_proxy.py judges the latency targets on) instead of as fast as answers come.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_proxy  # noqa: E402 (the stacks, brokers and topics of the proxy benchmark)
import small_requests  # noqa: E402
from proc_cpu import CLK_TCK, loadavg, tree_cpu_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("apiversions", "metadata", "produce", "fetch")
WARMUP = 50  # requests a connection before each measured phase (the proxy's first frames of that kind)


def sign_test_p(lower: int, pairs: int) -> float:
    """Two-sided sign test: the chance that a fair coin splits `pairs` at least as unevenly as `lower`."""
    if pairs == 0:
        return 1.0
    extreme = max(lower, pairs - lower)
    tail = sum(math.comb(pairs, k) for k in range(extreme, pairs + 1)) / 2 ** pairs
    return min(1.0, 2 * tail)


class Side:
    """One tree's proxy in front of its own broker, with the topics and frames of the small-request load."""

    def __init__(self, tree: Path, procs: bench_proxy.Processes, workdir: Path, tag: str, codec,
                 path: str = "kinspect-passthrough") -> None:
        self.tree = tree
        self.stack = bench_proxy.Stack(path + bench_proxy.BASELINE, procs, workdir, tag, None, baseline=tree).start()
        self.port = int(self.stack.bootstrap.rsplit(":", 1)[1])
        bench_proxy.create_topics(self.stack.bootstrap, ["t", "f"])
        self.workloads = small_requests.workloads(codec, "t", "f")
        small_requests.run_load(self.port, self.workloads["prefill"], 1, small_requests.FETCH_RECORDS, 1)

    def phase(self, workload: str, connections: int, requests: int, rate: float | None = None) -> tuple[float, float]:
        """The proxy's CPU µs a request over one phase of `requests` a connection, one at a time (at `rate` requests
        a second in all, if given), and the phase's p99 round trip (ms)."""
        small_requests.run_load(self.port, self.workloads[workload], connections, WARMUP, 1)
        before = tree_cpu_seconds(self.stack.proxy_pid)  # (its own, with its descendants'): the second counts
        if rate is None:
            result = small_requests.run_load(self.port, self.workloads[workload], connections, requests, 1)
        else:
            result = small_requests.run_paced(self.port, self.workloads[workload], connections, requests, rate)
        after = tree_cpu_seconds(self.stack.proxy_pid)
        if before is None or after is None:
            raise bench_proxy.BenchError(f"the proxy of {self.tree} is gone")
        ticks = round((after[1] - before[1]) * CLK_TCK)  # whole clock ticks: equal phases compare equal
        return 1e6 * ticks / CLK_TCK / result["requests"], bench_proxy.percentile(sorted(result["latencies_ms"]), 99)


def run(trees: list[Path], rounds: int, requests: int, connections: int, workloads: list[str],
        path: str = "kinspect-passthrough", rate: float | None = None) -> str:
    """Print what runs, run the rounds, and return the table of their pairs."""
    from kinspect.protocol.codec.codec import Codec

    codec = Codec()
    procs = bench_proxy.Processes()
    paced = "" if rate is None else f" at {rate:g}/s in all"
    print(f"paired rounds: {rounds} rounds x {len(workloads)} workloads, {connections} connections x {requests} "
          f"requests one at a time a phase{paced}, {path}; A = {trees[0]}, B = {trees[1]}; load {' '.join(loadavg())}",
          flush=True)
    cpu: dict[tuple[int, str], list[float]] = {(s, w): [] for s in (0, 1) for w in workloads}
    p99: dict[tuple[int, str], list[float]] = {(s, w): [] for s in (0, 1) for w in workloads}
    try:
        with tempfile.TemporaryDirectory(prefix="kinspect-ab-") as workdir:
            sides = [Side(tree, procs, Path(workdir), f"ab{n}", codec, path) for n, tree in enumerate(trees)]
            for r in range(rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for workload in workloads:
                    for s in order:
                        used, tail = sides[s].phase(workload, connections, requests, rate)
                        cpu[(s, workload)].append(used)
                        p99[(s, workload)].append(tail)
    finally:
        procs.stop_all()
    lines = [f"{'workload':12s}  {'A us/req':>8s}  {'B us/req':>8s}  B/A by pair: median (min-max)"]
    ratios = []
    for workload in workloads:
        a, b = cpu[(0, workload)], cpu[(1, workload)]
        pairs = [y / x for x, y in zip(a, b) if x > 0]  # a phase of A under one clock tick has no ratio
        ratios += pairs
        spread = (f"{statistics.median(pairs):.3f} ({min(pairs):.2f}-{max(pairs):.2f})" if pairs
                  else "none: A's phases took under a clock tick (more --requests)")
        lines.append(f"{workload:12s}  {statistics.median(a):8.1f}  {statistics.median(b):8.1f}  {spread}")
    if not ratios:
        raise bench_proxy.BenchError("no pair to compare: every phase of A took under a clock tick (more --requests)")
    lower, differ = sum(r < 1 for r in ratios), sum(r != 1 for r in ratios)  # the sign test leaves ties out
    lines.append(f"all pairs: median B/A {statistics.median(ratios):.3f}; B lower in {lower} of the {differ} that "
                 f"differ (sign test, two-sided: p = {sign_test_p(lower, differ):.2f}); load {' '.join(loadavg())}")
    return "\n".join(lines + p99_lines(p99, workloads))


def p99_lines(p99: dict[tuple[int, str], list[float]], workloads: list[str]) -> list[str]:
    """The table of the phases' p99 round trips: per workload A's and B's medians and B - A by pair."""
    lines = [f"{'workload':12s}  {'A p99 ms':>8s}  {'B p99 ms':>8s}  B - A by pair, ms: median (min-max)"]
    differences = []
    for workload in workloads:
        a, b = p99[(0, workload)], p99[(1, workload)]
        pairs = [y - x for x, y in zip(a, b)]
        differences += pairs
        lines.append(f"{workload:12s}  {statistics.median(a):8.3f}  {statistics.median(b):8.3f}  "
                     f"{statistics.median(pairs):+.3f} ({min(pairs):+.3f} to {max(pairs):+.3f})")
    lower, differ = sum(d < 0 for d in differences), sum(d != 0 for d in differences)
    lines.append(f"all pairs: median B - A {statistics.median(differences):+.3f} ms at p99; B lower in {lower} of the "
                 f"{differ} that differ (sign test, two-sided: p = {sign_test_p(lower, differ):.2f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", default=f"{ROOT},{ROOT}",
                   help="A,B: two kinspect source trees (default: this one twice)")
    p.add_argument("--rounds", type=int, default=12,
                   help="rounds, each with one phase per workload and tree (default 12)")
    p.add_argument("--requests", type=int, default=1000, help="requests a connection in a phase (default 1000)")
    p.add_argument("--connections", type=int, default=8, help="connections, one request at a time each (default 8)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"a subset of {','.join(WORKLOADS)}")
    p.add_argument("--path", default="kinspect-passthrough", choices=sorted(bench_proxy.KINSPECT_PATHS),
                   help="how both trees' proxies run (default kinspect-passthrough)")
    p.add_argument("--rate", type=float, metavar="R",
                   help="send at R requests a second in all, one at a time (default: as fast as answers come)")
    args = p.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    workloads = args.workloads.split(",")
    if len(trees) != 2 or not all((t / "kinspect" / "__init__.py").is_file() for t in trees):
        p.error("--trees takes two kinspect source trees, A,B")
    if not set(workloads) <= set(WORKLOADS) or args.rounds < 1 or args.requests < 1 or args.connections < 1:
        p.error(f"--workloads from {','.join(WORKLOADS)}; --rounds, --requests and --connections at least 1")
    if args.rate is not None and args.rate <= 0:
        p.error("--rate: requests a second, more than 0")
    try:
        print(run(trees, args.rounds, args.requests, args.connections, workloads, args.path, args.rate), flush=True)
    except (bench_proxy.BenchError, small_requests.LoadError) as exc:
        print(f"bench_ab.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
