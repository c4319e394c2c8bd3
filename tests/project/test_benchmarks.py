"""`make bench` runs every benchmark: each one runs here in its smallest form and prints its ratios.

These are smoke runs (tiny inputs, one repetition): they prove the benchmarks work on a
clean machine, not how fast anything is; the figures in the README come from full runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.support.paths import ROOT

BENCH = ROOT / "benchmarks"

# Each benchmark's smallest run, and a line its output must contain (a figure or a ratio).
SMOKE = {
    "bench_codec.py": (["--only", "apiversions", "--min-time", "0.001"], r"apiversions\s+507\s+decode\s+kio\s+[\d.]+"),
    "bench_metrics.py": (["--rounds", "1"], r"metrics cost: [\d.]+ us/event"),
    # with the caches taken before each batch: misses of code and of data, at least ten an exchange each, in the L2
    "bench_instructions.py": (["--cold", "--workloads", "produce", "--exchanges", "40", "--warm", "8"],
                              r"produce\s+\S+\s+[1-9][\d,]+\s+[1-9][\d,]* / [1-9][\d,]*\s+[1-9][\d,]+ / [1-9][\d,]+"
                              r"\s+[1-9][\d,]+\s+1\.000x"),
    "bench_native_probe.py": (["--repeat", "1", "--min-time", "0.001", "--no-gc-run"], r"C decode / kio read\s+[\d.]+"),
    "bench_capture.py": (["--rounds", "1", "--repeat", "2", "--copies", "2"], r"capture\s+[\d.]+ \S*s\s+\(\s*[\d.]+x no observer\)[\s\S]*"
                                            r"dispatcher calls it .*: -?[\d.]+ \(-?[\d.]+--?[\d.]+\) µs per exchange\n"
                                            r"  capture's whole cost to the event loop, .*: -?[\d.]+ \(-?[\d.]+--?[\d.]+\) µs "
                                            r"per exchange \(target < 1 µs\)[\s\S]*"
                                            r"through the writer process [\d,]+ \([\d,]+-[\d,]+\) rows/s wall clock; CPU per "
                                            r"row: writer thread [\d.]+ \([\d.]+-[\d.]+\) µs, writer process [\d.]+[\s\S]*"
                                            r"feeds the writer process \(the proxy's default\): median [\d.]+ ms[\s\S]*"
                                            r"busy writer process at nice \+10: .* p99 [\d.]+ ms"),
    # one round: every workload's pair of phases, the median ratio, the split and the sign test
    "bench_ab.py": (["--rounds", "1", "--requests", "150", "--workloads", "apiversions,produce"],
                    r"apiversions\s+[\d.]+\s+[\d.]+\s+[\d.]+ \([\d.]+-[\d.]+\)\n"
                    r"produce\s+[\d.]+\s+[\d.]+\s+[\d.]+ \([\d.]+-[\d.]+\)\n"
                    r"all pairs: median B/A [\d.]+; B lower in [0-2] of the [0-2] that differ "
                    r"\(sign test, two-sided: p = [\d.]+\)[\s\S]*"
                    r"apiversions\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+ \([+-][\d.]+ to [+-][\d.]+\)\n[\s\S]*"
                    r"all pairs: median B - A [+-][\d.]+ ms at p99; B lower in [0-2] of the [0-2] that differ"),
    # one round through direct and kinspect: each path's MB/s, its ratio to direct and the proxy's CPU per MB
    "bench_bulk_ab.py": (["--rounds", "1", "--records", "2000", "--paths", "direct,kinspect-passthrough"],
                         r"kinspect-passthrough\s+produce\s+[\d.]+\s+[\d.]+% \(\d+%-\d+%\)\s+[01] of 1\s+[\d.]+\n"
                         r"[\s\S]*kinspect-passthrough\s+consume\s+[\d.]+\s+[\d.]+% \(\d+%-\d+%\)\s+[01] of 1\s+[\d.]+\n"
                         r"[\s\S]*kinspect-passthrough\s+consume\s+[\d.]+ ms/MB, busy \d+%, stolen \d+%; ceiling "
                         r"[\d.]+% \(\d+%-\d+%\), added [+-][\d.]+ ms/MB; proxy's system time [\d.]+ ms/MB; "
                         r"client [\d.]+; broker [\d.]+\n"),
    # one round through direct and kinspect: each path's p50 and p99, its added latency and the rounds within target
    "bench_latency_ab.py": (["--rounds", "1", "--requests", "30", "--records", "5", "--paths",
                             "direct,kinspect-passthrough"],
                            r"kinspect-passthrough\s+apiversions\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+ \([+-][\d.]+ to "
                            r"[+-][\d.]+\)\s+[01] of 1\s+[+-][\d.]+ \([+-][\d.]+ to [+-][\d.]+\)\s+[01] of 1\n"
                            r"[\s\S]*kinspect-passthrough\s+produce\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+ "),
    # three repetitions of the larger size: its first is shown, not counted
    "bench_analyze.py": (["--sizes", "2000,4000", "--reps", "1,3", "--warm-rows", "0"],
                         r"4,000 rows  job\s+[\d.]+ s \(median of 2 warm: [\d.]+, [\d.]+, [\d.]+\).*"
                         r"per repetition [\d.]+, [\d.]+, [\d.]+ \(median [\d.]+x\).*"
                         r"the job's CPU: JVM [\d.]+ s, Python workers [\d.]+ s, driver [\d.]+ s[\s\S]*time\(4,000\) / time\(2,000\)"),
    "bench_pcap.py": (["--mb", "2", "--reps", "1"], r"kinspect\s+[\d.]+ MB/s"),
    "bench_pipeline.py": (["--requests", "50", "--reps", "1"], r"metrics\s+[\d.]+ \(\s*\d+%\)\s+[\d.]+x relay"),
    # bulk table, the CPU per MB with inspection's part, a small-request row with the proxy's CPU per request
    # and inspection's part, the idle-memory figure
    "bench_proxy.py": (["--quick", "--reps", "1", "--records", "2000", "--small-requests", "20", "--idle", "200",
                        "--paths", "direct,kinspect-passthrough"],
                       r"produce MB/s\s+[\d.]+\s+[\d.]+ \([\d.]+%\)[\s\S]*"
                       r"\nkinspect-passthrough\s+[\d.]+\s+-\s+-\s+[\d.]+\s+[\d.]+\s+-\s+-\s+[\d.]+\n[\s\S]*"
                       r"\n  kinspect-passthrough: produce [\d.]+ ms/MB \(busy \d+%\), ceiling [\d.]+% of direct; "
                       r"consume [\d.]+ ms/MB \(busy \d+%\), ceiling [\d.]+% of direct\n[\s\S]*"
                       r"apiversions/serial\s+kinspect-passthrough\s+\d+\s+[\d.]+\s+-\s+-\s+\d+/\d+\s+[\d.]+\s[\s\S]*"
                       r"apiversions/paced@2000\s+kinspect-passthrough\s+\d+\s+[\d.]+\s[\s\S]*"
                       r"latency targets, one at a time at 2000 requests a second in all .*\n"
                       r"  kinspect-passthrough: added p50 within 0.1 ms in \d of 4 workloads, .*sent late[\s\S]*"
                       r"idle memory: 200 idle connections through kinspect .* [\d.]+ KiB per connection"),
}


def benchmark_module(name: str):
    """benchmarks/<name>.py imported as a module (the directory is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_module", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_bench_runs_every_benchmark():
    makefile = (ROOT / "Makefile").read_text("utf-8")
    assert re.search(r"for b in benchmarks/bench_\*\.py; do .*\$\(PY\) \$\$b \|\| exit 1", makefile)
    assert sorted(p.name for p in BENCH.glob("bench_*.py")) == sorted(SMOKE)


@pytest.mark.integration
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_smoke_run(script, tmp_path):
    args, expected = SMOKE[script]
    if script == "bench_analyze.py":
        args = args + ["--data", str(tmp_path / "data")]
    result = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, capture_output=True,
                            encoding="utf-8", errors="replace", timeout=600, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(expected, result.stdout), result.stdout[-3000:]


@pytest.mark.integration
def test_paired_latency_rounds_at_a_fixed_rate():
    """bench_latency_ab.py --rate: the four small workloads paced through every path, each with its latency added to
    direct's by round and the rounds within the targets."""
    result = subprocess.run([sys.executable, str(BENCH / "bench_latency_ab.py"), "--rate", "800", "--rounds", "1",
                             "--requests", "40", "--connections", "4", "--paths", "direct,kinspect-passthrough"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "4 connections x 40 requests one at a time at 800/s in all" in result.stdout, result.stdout
    for workload in ("apiversions", "metadata", "produce", "fetch"):
        assert re.search(rf"kinspect-passthrough\s+{workload}\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+ \([+-][\d.]+ to "
                         rf"[+-][\d.]+\)\s+[01] of 1\s+[+-][\d.]+ ", result.stdout), result.stdout


@pytest.mark.integration
def test_the_soak_command():
    """A short soak with capture on: too short for a verdict (it says so and exits 1), but every sample is taken,
    the writer process's memory and the rows captured too."""
    result = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--duration", "20", "--interval", "5",
                             "--rate", "100", "--capture"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "too few samples after the warm-up" in result.stdout, \
        result.stdout[-3000:] + result.stderr[-3000:]
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)"
                      r"\s+([\d.]+)\s+(\d+)$", result.stdout, re.M)
    assert [int(r[0]) for r in rows] == [0, 5, 10, 15, 20], result.stdout
    assert int(rows[-1][6]) >= 1000 and int(rows[-1][7]) > 0  # produced and consumed through kinspect
    assert float(rows[-1][9]) > 20 and int(rows[-1][10]) > int(rows[0][10])  # the writer process's MiB; rows taken


def test_profile_summary_splits_py_spy_samples_by_part(tmp_path):
    """bench_proxy --profile prints this summary: I/O leaves apart, metrics counted where they are called."""
    summary_module = benchmark_module("profile_summary")
    loop = "<module> (kinspect:6);main (kinspect/cli/main.py:30);Runner.run (asyncio/runners.py:118)"
    relay = loop + ";_Side.data_received (kinspect/proxy/relay.py:39);Relay.data (kinspect/proxy/relay.py:107)"
    raw = tmp_path / "rep0-kinspect-passthrough.txt"
    raw.write_text("\n".join([
        f"{loop} 60",
        f"{relay};Relay._write (kinspect/proxy/relay.py:143) 20",
        f"{relay};Relay._inspect (kinspect/proxy/relay.py:124);Dispatcher.dispatch (kinspect/proxy/observers.py:37);"
        "MetricsObserver.on_event (kinspect/observers/metrics.py:186);MutexValue.inc (prometheus_client/values.py:28) 15",
        f"{relay};Session.client_data (kinspect/session/connection.py:99);FrameSplitter.feed (kinspect/protocol/framing/framer.py:165) 4",
        f"{relay};Relay.data (kinspect/proxy/relay.py:119) 1",
        "",
    ]))
    result = summary_module.summarize(raw, set())  # no write lines: line 119 is Python, whatever relay.py holds now
    assert result["samples"] == 100 and result["python_samples"] == 20
    assert dict(result["parts"]) == {summary_module.LOOP_PART: 80.0, "metrics (observer + prometheus_client)": 15.0,
                                     "framing + scan (session, protocol)": 4.0,
                                     "relay Python (forwarding, dispatch)": 1.0}
    assert dict(result["python_parts"])["metrics (observer + prometheus_client)"] == 75.0
    assert result["self"][0] == ("Runner.run (asyncio/runners.py)", 60.0)
    text = summary_module.render(result, top=3)
    assert "the 20 samples in Python code, by part:\n     75.0%  metrics" in text


def test_profile_summary_counts_an_inline_transport_write_as_io(tmp_path):
    """Relay.data writes without a Relay._write frame: a sample on one of relay.py's write lines is the syscall."""
    summary_module = benchmark_module("profile_summary")
    source = tmp_path / "relay.py"
    source.write_text("class Relay:\n    def data(self, side, data):\n        broker.write(data)\n        x = 1\n")
    assert summary_module._write_lines(source) == {3}
    relay = ("<module> (kinspect:6);Runner.run (asyncio/runners.py:118);"
             "_Side.data_received (kinspect/proxy/relay.py:39);Relay.data")
    raw = tmp_path / "rep0-kinspect-passthrough.txt"
    raw.write_text(f"{relay} (kinspect/proxy/relay.py:3) 30\n{relay} (kinspect/proxy/relay.py:4) 10\n")
    result = summary_module.summarize(raw, summary_module._write_lines(source))
    assert dict(result["parts"]) == {summary_module.LOOP_PART: 75.0, "relay Python (forwarding, dispatch)": 25.0}
    assert result["self"][0] == ("Relay.data (kinspect/proxy/relay.py) [transport.write]", 75.0)


def test_small_request_ratios_pair_each_repetition_with_haproxys_run_beside_it():
    bench = benchmark_module("bench_proxy")

    def cell(rep: int, **cpu) -> dict:
        return {"rep": rep, "small": {f"{w}/serial": {"cpu_us_per_req": v} for w, v in cpu.items()}}

    haproxy = [cell(0, a=10, b=20), cell(2, a=40, b=40)]  # its repetition 1 failed
    mine = [cell(0, a=20, b=20), cell(1, a=99, b=99), cell(2, a=60, b=90)]
    ratios = bench.serial_ratios_per_rep(mine, haproxy, ["a/serial", "b/serial"])
    assert ratios == pytest.approx([2 ** 0.5, (1.5 * 2.25) ** 0.5])  # geometric means; repetition 1 left out


def test_bulk_cpu_ratios_pair_each_repetition_with_haproxys_run_beside_it():
    bench = benchmark_module("bench_proxy")

    def cell(rep: int, produce: float | None) -> dict:
        return {"rep": rep, "produce": {"proxy_cpu_ms_per_mb": produce}, "consume": {"proxy_cpu_ms_per_mb": None}}

    haproxy = [cell(0, 0.5), cell(2, 0.4), cell(3, 0.6)]  # its repetition 1 failed
    mine = [cell(0, 0.6), cell(1, 9.9), cell(2, 0.6), cell(3, None)]  # repetition 3 without a CPU figure
    assert bench.bulk_ratios_per_rep(mine, haproxy, "produce") == pytest.approx([1.2, 1.5])
    assert bench.bulk_ratios_per_rep(mine, haproxy, "consume") == []
    for c in haproxy + mine:
        c["consume"]["proxy_cpu_ms_per_mb"] = 0.5
    results = {"haproxy": haproxy, "kinspect-passthrough": mine}
    lines, summary = bench.cpu_per_mb_report(results, ["kinspect-passthrough", "haproxy"])
    assert summary["kinspect-passthrough"]["produce"]["ratio_to_haproxy_per_rep"] == pytest.approx([1.2, 1.5])
    assert any("produce 1.20x to 1.50x (median 1.35x, within 1.2x in 1 of 2); consume 1.00x to 1.00x" in line
               for line in lines), lines


def test_the_bulk_report_gives_the_ceiling_the_machine_s_cpu_puts_on_each_path():
    """bench_proxy.py: direct's machine CPU per MB over each path's, paired by repetition, beside the medians."""
    bench = benchmark_module("bench_proxy")

    def cell(rep: int, produce: float | None, busy: float = 90.0) -> dict:
        return {"rep": rep, "produce": {"machine_cpu_ms_per_mb": produce, "machine_busy_pct": busy},
                "consume": {"machine_cpu_ms_per_mb": None, "machine_busy_pct": None}}

    direct = [cell(0, 10.0), cell(1, 12.0), cell(2, 10.0, 80.0)]
    haproxy = [cell(0, 11.0), cell(2, 12.5), cell(3, 99.0)]  # its repetition 1 failed; direct's 3 did
    lines, summary = bench.machine_ceiling_report({"direct": direct, "haproxy": haproxy}, ["direct", "haproxy"])
    # by repetition: 10/11 and 10/12.5 -> median 85.5%; repetition 3 has no direct run beside it
    assert summary["haproxy"]["produce"]["ceiling"] == pytest.approx((10 / 11 + 10 / 12.5) / 2)
    assert "  haproxy: produce 12.50 ms/MB (busy 90%), ceiling 85.5% of direct" in lines, lines
    assert "  direct: produce 10.00 ms/MB (busy 90%)" in lines, lines
    assert "97% of direct allows a path to add at most 3.1% of direct's" in lines[0], lines
    assert bench.machine_ceiling_report({"haproxy": haproxy}, ["haproxy"])[0] == []  # no direct: nothing to say


def test_the_sign_test_of_paired_rounds():
    bench = benchmark_module("bench_ab")
    assert bench.sign_test_p(0, 10) == bench.sign_test_p(10, 10) == pytest.approx(2 / 1024)
    assert bench.sign_test_p(5, 10) == 1.0 and bench.sign_test_p(0, 0) == 1.0
    assert bench.sign_test_p(2, 10) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0, 1 or 2 of 10, both tails
    p99 = {(0, "apiversions"): [1.0, 2.0, 1.5], (1, "apiversions"): [0.8, 2.5, 1.0],
           (0, "produce"): [3.0, 3.0, 3.0], (1, "produce"): [2.0, 3.0, 2.5]}
    assert bench.p99_lines(p99, ["apiversions", "produce"]) == [
        "workload      A p99 ms  B p99 ms  B - A by pair, ms: median (min-max)",
        "apiversions      1.500     1.000  -0.200 (-0.500 to +0.500)",
        "produce          3.000     2.500  -0.500 (-1.000 to +0.000)",
        "all pairs: median B - A -0.350 ms at p99; B lower in 4 of the 5 that differ (sign test, two-sided: p = 0.38)"]


def test_paired_latency_rounds_are_reported_against_direct_and_haproxy():
    """bench_latency_ab.py's report: latency added by round (not of medians), the rounds within the targets,
    and kinspect's added latency against haproxy's with the sign test."""
    module = benchmark_module("bench_latency_ab")
    paths = ["direct", "kinspect-passthrough", "haproxy"]
    times = {("direct", "apiversions"): [(0.20, 0.50), (0.40, 0.90), (0.20, 0.50)],
             ("kinspect-passthrough", "apiversions"): [(0.28, 0.70), (0.45, 1.50), (0.35, 0.80)],
             ("haproxy", "apiversions"): [(0.30, 0.60), (0.52, 1.00), (0.29, 0.60)]}
    times.update({(p, "produce"): [(0.4, 1.0)] * 3 for p in paths})
    out = module.report(paths, times)
    # added p50 by round: 0.08, 0.05, 0.15 -> median +0.080, two of three within 0.1 ms; the medians of the
    # paths' own p50s (0.35 - 0.20 = 0.15) would have said otherwise
    assert re.search(r"kinspect-passthrough\s+apiversions\s+0\.350\s+0\.800\s+\+0\.080 \(\+0\.050 to \+0\.150\)\s+"
                     r"2 of 3\s+\+0\.300 \(\+0\.200 to \+0\.600\)\s+2 of 3", out), out
    assert re.search(r"direct\s+apiversions\s+0\.200\s+0\.500\s+-\s+-\s+-\s+-", out), out
    # against haproxy's added p50 by round: 0.08-0.10, 0.05-0.12, 0.15-0.09: less in two of three
    assert "kinspect-passthrough - haproxy, apiversions added p50: median -0.020 ms, less in 2 of 3 rounds" in out, out
    assert "kinspect-passthrough - haproxy, produce added p50: median +0.000 ms, less in 0 of 0 rounds" in out, out


def test_paired_bulk_rounds_are_reported_against_direct_and_haproxy():
    """bench_bulk_ab.py's report: ratios by round, not of medians; kinspect against haproxy with the sign test."""
    module = benchmark_module("bench_bulk_ab")
    paths = ["direct", "kinspect-passthrough", "haproxy"]
    mb_s = {("direct", "produce"): [100.0, 200.0, 100.0], ("kinspect-passthrough", "produce"): [98.0, 150.0, 99.0],
            ("haproxy", "produce"): [90.0, 210.0, 95.0]}
    mb_s.update({(p, "consume"): [50.0, 50.0, 50.0] for p in paths})
    ms_mb = {(p, w): [None if p == "direct" else 0.5] * 3 for p in paths for w in ("produce", "consume")}
    out = module.report(paths, mb_s, ms_mb)
    # kinspect's ratios to direct by round: 0.98, 0.75, 0.99: median 98.0%, two of three at or above 97%
    assert re.search(r"kinspect-passthrough\s+produce\s+99\.0\s+98\.0% \(75%-99%\)\s+2 of 3\s+0\.50", out), out
    assert re.search(r"direct\s+produce\s+100\.0\s+-\s+-\s+-", out), out
    # against haproxy by round: 98/90, 150/210, 99/95: faster in two of three; equal consumes are no round
    assert "kinspect-passthrough / haproxy, produce: median 104.2%, faster in 2 of 3 rounds" in out, out
    assert "kinspect-passthrough / haproxy, consume: median 100.0%, faster in 0 of 0 rounds" in out, out


def test_paired_bulk_rounds_compare_cpu_per_mb_and_a_baseline_tree_round_by_round():
    """bench_bulk_ab.py: the CPU per MB against haproxy's and, with --baseline, against the same path run from
    the other tree, by round; a run whose topics would not fit in memory stops before it starts."""
    module = benchmark_module("bench_bulk_ab")
    new, old = "kinspect-passthrough", "kinspect-passthrough@baseline"
    paths = ["direct", new, "haproxy", old]
    mb_s = {(p, w): [100.0, 100.0, 100.0] for p in paths for w in ("produce", "consume")}
    ms_mb = {(p, w): [None] * 3 for p in ("direct",) for w in ("produce", "consume")}
    ms_mb.update({(new, "produce"): [0.6, 0.66, 0.5], ("haproxy", "produce"): [0.5, 0.5, 0.5],
                  (old, "produce"): [0.7, 0.6, 0.6]})
    ms_mb.update({(p, "consume"): [0.4, 0.4, 0.4] for p in (new, "haproxy", old)})
    out = module.report(paths, mb_s, ms_mb)
    lines = out.splitlines()
    # against haproxy by round: 1.2, 1.32, 1.0 -> median 1.2, lower in none (the equal round is no round)
    at = lines.index("kinspect-passthrough / haproxy, produce: median 100.0%, faster in 0 of 0 rounds "
                     "(sign test, two-sided: p = 1.00)")
    assert lines[at + 1] == "    CPU per MB: median 1.200x, lower in 0 of 2 rounds (p = 0.500)", out
    # against its baseline by round: 0.857, 1.1, 0.833 -> median 0.857, lower in two of three
    at = lines.index("kinspect-passthrough / kinspect-passthrough@baseline, produce: median 100.0%, faster in 0 "
                     "of 0 rounds (sign test, two-sided: p = 1.00)")
    assert lines[at + 1] == "    CPU per MB: median 0.857x, lower in 2 of 3 rounds (p = 1.000)", out
    # the baseline tree against haproxy too: 1.4, 1.2, 1.2
    at = lines.index("kinspect-passthrough@baseline / haproxy, produce: median 100.0%, faster in 0 of 0 rounds "
                     "(sign test, two-sided: p = 1.00)")
    assert lines[at + 1] == "    CPU per MB: median 1.200x, lower in 0 of 3 rounds (p = 0.250)", out
    assert module.memory_check(paths, 60, 100_000, 1024, 24 * 10**9) is not None  # 24.6 GB of topics
    assert module.memory_check(paths, 40, 50_000, 1024, 24 * 10**9) is None  # 8.2 GB
    assert module.memory_check(paths, 60, 100_000, 1024, None) is None  # no /proc/meminfo: nothing to say


def test_paired_bulk_rounds_give_the_ceiling_the_machine_s_cpu_puts_on_throughput():
    """bench_bulk_ab.py: each path's machine CPU per MB, and direct's over the path's by round, the throughput a
    busy machine allows it; direct's line says how much a path may add for 97%."""
    module = benchmark_module("bench_bulk_ab")
    paths = ["direct", "haproxy"]
    mb_s = {(p, w): [100.0, 100.0, 100.0] for p in paths for w in ("produce", "consume")}
    ms_mb = {(p, w): [None if p == "direct" else 0.5] * 3 for p in paths for w in ("produce", "consume")}
    phase = module.MachinePhase
    machine = {("direct", "produce"): [phase(10.0, 99.0, 1.0, None, {"client": 4.0, "broker": 5.0}),
                                       phase(12.0, 97.0, 0.0, None, {"client": 4.2, "broker": None}),
                                       phase(10.0, 100.0, 2.0, None, {"client": 3.0, "broker": 6.0})],
               ("haproxy", "produce"): [phase(11.0, 98.0, 0.0, 0.4), phase(12.0, 99.0, 0.0, 0.5),
                                        phase(12.5, 96.0, 1.0, None)]}
    machine.update({(p, "consume"): [phase(None, None, None)] * 3 for p in paths})
    out = module.report(paths, mb_s, ms_mb, machine)
    # direct's median 10.0 ms/MB: 97% allows 10.0 x (1/0.97 - 1) = 0.31 ms/MB more
    assert re.search(r"direct\s+produce\s+10\.00 ms/MB, busy 99%, stolen 1%; 97% of direct allows a path to add "
                     r"at most 0\.31 ms/MB; client 4\.00; broker 5\.50", out), out
    # by round: 10/11, 12/12, 10/12.5 -> median 90.9% (80%-100%); medians 12.0 - 10.0 = +2.00
    assert re.search(r"haproxy\s+produce\s+12\.00 ms/MB, busy 98%, stolen 0%; ceiling 90\.9% \(80%-100%\), "
                     r"added \+2\.00 ms/MB; proxy's system time 0\.45 ms/MB", out), out
    assert not re.search(r"consume\s+[\d.]+ ms/MB", out), out  # no /proc/stat reading: no line
    assert "machine" not in module.report(paths, mb_s, ms_mb)  # nothing measured, nothing said


def test_the_small_request_report_gives_the_capture_writer_process_s_part_of_the_cpu():
    bench = benchmark_module("bench_proxy")

    def cell(writer: float, cpu: float) -> dict:
        figures = {"requests": 1000, "seconds": 1.0, "req_s": 1000.0, "cpu_us_per_req": cpu, "stat_cpu_us_per_req": cpu,
                   "user_us_per_req": cpu / 2, "system_us_per_req": cpu / 2, "inspection_us_per_req": 5.0,
                   "writer_us_per_req": writer, "p50_ms": 0.2, "p99_ms": 0.5}
        return {"rep": 0, "small": {"apiversions/serial": figures, "produce/serial": dict(figures, cpu_us_per_req=2 * cpu),
                                    "produce/pipelined": dict(figures, writer_us_per_req=writer / 2)}}

    results = {"kinspect-passthrough": [cell(0.0, 30.0)], "kinspect-capture": [cell(12.0, 40.0), cell(14.0, 50.0)]}
    lines, summary = bench.small_report(results, ["kinspect-passthrough", "kinspect-capture"],
                                        {"connections": 8, "small_requests": 1000, "in_flight": 32})
    assert summary["apiversions/serial"]["kinspect-capture"]["writer_us_per_req"] == 13.0  # the median
    writer = [line for line in lines if "writer process" in line]
    assert writer == ["  kinspect-capture: its capture writer process's CPU us/req, of the whole: one at a time: "
                      "apiversions 13.0 of 45.0, produce 13.0 of 90.0; pipelined: produce 6.5 of 45.0"]


def test_a_process_s_cpu_is_told_apart_from_its_descendants():
    proc_cpu = benchmark_module("proc_cpu")
    burn = ("import sys, time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3: pass\n"
            "print('burnt', flush=True)\nsys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout.readline() == "burnt\n"  # it now waits, burning nothing
        own, descendants = proc_cpu.run_seconds_split(child.pid)
        mine, mine_below = proc_cpu.run_seconds_split(os.getpid())
        child.stdin.close()
    assert own >= 0.3 and descendants == 0.0
    assert mine_below >= own and mine > 0
    assert proc_cpu.run_seconds_split(None) is None


def test_the_small_request_report_judges_added_latency_against_the_targets_and_haproxy():
    bench = benchmark_module("bench_proxy")

    def cell(p50: float, p99: float, late: int, paced_cpu: float = 50.0) -> dict:
        figures = {"requests": 1000, "seconds": 1.0, "req_s": 1000.0, "cpu_us_per_req": 50.0, "p50_ms": p50,
                   "p99_ms": p99}
        paced = dict(figures, p50_ms=p50 / 2, p99_ms=p99 / 2, late=late, cpu_us_per_req=paced_cpu)
        return {"rep": 0, "small": {"apiversions/serial": figures, "produce/serial": dict(figures, p99_ms=p99 + 1),
                                    "produce/pipelined": dict(figures, p50_ms=9.0, p99_ms=20.0),
                                    "apiversions/paced@2000": paced, "produce/paced@2000": dict(paced, late=late + 1)}}

    results = {"direct": [cell(0.5, 1.0, 0)], "haproxy": [cell(0.55, 1.8, 1)], "kinspect-capture": [cell(0.7, 1.4, 3, 80.0)]}
    lines, summary = bench.small_report(results, ["direct", "haproxy", "kinspect-capture"],
                                        {"connections": 8, "small_requests": 1000, "in_flight": 32,
                                         "paced_rates": [2000.0]})
    # judged at the fixed rate first: half the closed loop's figures here
    start = lines.index("latency targets, one at a time at 2000 requests a second in all "
                        "(a path's median p50 and p99 over repetitions minus direct's):")
    assert lines[start + 1:start + 3] == [
        "  haproxy: added p50 within 0.1 ms in 2 of 2 workloads, added p99 within 0.5 ms in 2 of 2; "
        "sent late (median a phase): 1 / 2",
        "  kinspect-capture: added p50 within 0.1 ms in 2 of 2 workloads, added p99 within 0.5 ms in 2 of 2; "
        "p99 beyond haproxy's: apiversions -0.200, produce -0.200 ms; sent late (median a phase): 3 / 4"]
    start = lines.index("closed loop, one at a time as fast as answers come (the cores busy: a round trip is the "
                        "connections over the throughput, so an added one is throughput lost) (a path's median p50 "
                        "and p99 over repetitions minus direct's):")
    assert lines[start + 1:start + 3] == [
        "  haproxy: added p50 within 0.1 ms in 2 of 2 workloads, added p99 within 0.5 ms in 0 of 2",
        "  kinspect-capture: added p50 within 0.1 ms in 0 of 2 workloads, added p99 within 0.5 ms in 2 of 2; "
        "p99 beyond haproxy's: apiversions -0.400, produce -0.400 ms"]
    # the CPU ratios leave the paced phases out (a mostly idle proxy's wake-ups are not a request's cost) and say
    # what those cost apart
    assert summary["produce/paced@2000"]["kinspect-capture"]["ratio_to_haproxy"] == 1.6
    assert summary["overall"]["kinspect-capture"]["cpu_ratio_geomean"] == 1.0
    assert "    at 2000 requests a second: 1.60x haproxy's (a mostly idle proxy, kept apart from the closed loop's " \
           "figures)" in lines, lines


@pytest.mark.integration
def test_a_paced_load_keeps_its_rate_and_counts_a_stall_from_when_requests_fell_due():
    """small_requests.run_paced on a real broker stopped for its first 0.3 s: the requests that fell due meanwhile
    go out late, as answers come, and their round trips count from when they fell due (a closed loop, timing from
    the write, would show the stall in two round trips only); the rate is never exceeded."""
    small_requests = benchmark_module("small_requests")
    from kinspect.protocol.codec import Codec
    from tests.support.tansu import TansuBroker

    rate, connections, each, stall = 400.0, 2, 100, 0.3
    with TansuBroker() as broker:
        workload = small_requests.workloads(Codec(), "t", "f")["apiversions"]
        quiet = small_requests.run_paced(broker.port, workload, connections, each, rate)
        broker_pid = broker._proc.pid
        os.kill(broker_pid, signal.SIGSTOP)
        resume = threading.Timer(stall, os.kill, (broker_pid, signal.SIGCONT))
        resume.start()
        try:
            stalled = small_requests.run_paced(broker.port, workload, connections, each, rate)
        finally:
            resume.cancel()
            os.kill(broker_pid, signal.SIGCONT)
    for result in (quiet, stalled):
        assert len(result["latencies_ms"]) == result["requests"] == connections * each
        assert result["seconds"] >= (each - 1) * connections / rate  # due every connections / rate seconds
    # 0.3 s stopped: on each connection about 60 requests fell due; counted from then, a third or more waited 0.1 s
    assert stalled["late"] >= 40, stalled["late"]
    assert sum(lat >= 100 for lat in stalled["latencies_ms"]) >= 40
    assert max(stalled["latencies_ms"]) >= 1000 * stall * 0.9
    assert quiet["late"] < stalled["late"] and sum(lat >= 100 for lat in quiet["latencies_ms"]) < 10
