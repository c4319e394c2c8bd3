"""What the metrics observer costs per event, on the recorded real traffic of tests/data/traffic.

    python benchmarks/bench_metrics.py [--rounds N] [--topic-bytes] [--workload traffic|apiversions|both]

Workloads: "traffic", every recorded connection (72 connections of three clients, 56
request kinds); "apiversions", the issue-12 small-request load: one connection of 2,000
ApiVersions v3 requests and responses (confluent-kafka's recorded pair, correlation ids
renumbered), where the per-frame cost shows. Each round replays the workload through
fresh Sessions (untimed) to get fresh events (events cache their scan, so each observer
gets its own copy), then hands them to each observer, one by one, in the same round:
  off        a no-op observer (the dispatch loop alone)
  reference  the pre-issue-12 MetricsObserver (tests/support/reference_metrics.py:
             prometheus_client Counter/Histogram children, a lock per update, a scan per
             complete frame)
  metrics    MetricsObserver (plain cells; a small body seen before is not scanned again)
  *-warm     the same observer on the same events again (scans cached: the cost of the
             metric updates alone)
The apiversions load repeats one body, the best case for the metrics' memo of small
bodies; the recorded traffic repeats fewer (its ApiVersions, Metadata and heartbeat
bodies, across connections).
Reported, as the median over rounds with the spread (min-max): the thread's CPU time per
event over the whole loop (time.thread_time_ns, the no-op loop's subtracted), per request
(a request, its response and their exchange), and CPU time per event type (thread_time_ns
around each call); then metrics / reference. The timed loops run with the benchmark's own
event lists frozen out of the garbage collector (see `frozen`).
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import native_available
from kinspect.session import ConnectionInfo, Session
from tests.support.reference_metrics import ReferenceMetricsObserver

TRAFFIC = ROOT / "tests" / "data" / "traffic"


def load() -> list[list[tuple[bytes, bytes]]]:
    """Each recorded connection as one step: (all its client bytes, all its broker bytes)."""
    pairs = []
    for requests in sorted(TRAFFIC.glob("*/*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        pairs.append([(requests.read_bytes(), responses.read_bytes())])
    return pairs


def apiversions_load(pairs, count: int = 2000) -> list[list[tuple[bytes, bytes]]]:
    """One connection of `count` ApiVersions v3 exchanges one at a time, made of the first recorded v3 pair."""
    codec = Codec()
    for ((requests, responses),) in pairs:
        session = Session(codec, ConnectionInfo(0, "client", "broker"))
        events = session.client_data(requests, 0.0).events + session.broker_data(responses, 0.001).events
        for e in events:
            if type(e).__name__ == "Exchange" and e.request.api_key == 18 and e.request.api_version == 3 \
                    and e.response is not None:
                request, response = e.request.frame, e.response.frame
                steps = []
                for n in range(count):
                    cid = n.to_bytes(4, "big")
                    steps.append((len(request).to_bytes(4, "big") + request[:4] + cid + request[8:],
                                  len(response).to_bytes(4, "big") + cid + response[4:]))
                return [steps]
    raise SystemExit("no ApiVersions v3 exchange in the recorded traffic")


def replay(codec: Codec, pairs) -> tuple[list, float]:
    events, started = [], time.perf_counter_ns()
    for n, steps in enumerate(pairs):
        session = Session(codec, ConnectionInfo(n, "client", "broker"))
        for requests, responses in steps:
            events += session.client_data(requests, 0.0).events
            events += session.broker_data(responses, 0.001).events
        events += session.close(0.002)
    return events, (time.perf_counter_ns() - started) / 1000


class Nothing:
    needs_bodies = True

    def on_event(self, event) -> None:
        pass


def frozen(fn):
    """Run fn with every object alive now moved out of the collector's sight (gc.freeze).

    The benchmark holds thousands of events a proxy would have dropped; without this, the
    collections the timed code's allocations trigger walk them all and their cost, which
    varies from round to round, lands on whichever observer allocated last.
    """

    def run(*args):
        gc.collect()
        gc.freeze()
        try:
            return fn(*args)
        finally:
            gc.unfreeze()

    return run


@frozen
def cpu(on_event, events) -> float:
    """The thread's CPU microseconds to hand every event to on_event."""
    started = time.thread_time_ns()
    for e in events:
        on_event(e)
    return (time.thread_time_ns() - started) / 1000


@frozen
def per_type(on_event, events) -> dict[str, float]:
    """CPU microseconds spent in on_event, summed per event type (the clock reads included)."""
    spent: dict[str, float] = collections.defaultdict(float)
    clock = time.thread_time_ns
    for e in events:
        started = clock()
        on_event(e)
        spent[type(e).__name__] += clock() - started
    return {k: v / 1000 for k, v in spent.items()}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def measure(label: str, pairs, args) -> dict:
    codec = Codec()
    observers = {"reference": ReferenceMetricsObserver(topic_bytes=args.topic_bytes),
                 "metrics": MetricsObserver(topic_bytes=args.topic_bytes)}
    for _ in range(3):  # warm-up: compile the scanners, create the label children and cells
        for observer in observers.values():
            events, _ = replay(codec, pairs)
            for e in events:
                observer.on_event(e)
    replay_us, results = [], collections.defaultdict(list)
    types: collections.Counter = collections.Counter()
    for _ in range(args.rounds):
        off_events, us = replay(codec, pairs)
        replay_us.append(us / len(off_events))
        types = collections.Counter(type(e).__name__ for e in off_events)
        n, requests = len(off_events), types["Request"]
        off = cpu(Nothing().on_event, off_events)
        results["off"].append(off / n)
        for name, observer in observers.items():
            events, _ = replay(codec, pairs)
            results[name].append((cpu(observer.on_event, events) - off) / n)
            results[f"{name} per request"].append(results[name][-1] * n / requests)
            results[f"{name}-warm"].append((cpu(observer.on_event, events) - off) / n)
            events, _ = replay(codec, pairs)
            for t, us in per_type(observer.on_event, events).items():
                results[f"{name}:{t}"].append(us / types[t])
    print(f"== workload {label}: events per round: {sum(types.values())} ({dict(types)}); "
          f"native codec: {native_available()}; topic_bytes: {args.topic_bytes}; rounds: {args.rounds}")
    print(f"session replay (making the events): {statistics.median(replay_us):.2f} us/event")
    print(f"no-op dispatch loop: {statistics.median(results['off']):.2f} us/event CPU")
    print("CPU us/event beyond the no-op loop, median (min-max) over rounds:")
    for name in observers:
        print(f"  {name:10s} {spread(results[name])}   warm {spread(results[f'{name}-warm'])}   "
              f"per request (+response, exchange) {spread(results[f'{name} per request'])}")
    print("CPU us per event of each type (thread_time around each call, the clock's own cost included), median:")
    for name in observers:
        per = ", ".join(f"{t} {statistics.median(results[f'{name}:{t}']):.2f}" for t in sorted(types))
        print(f"  {name:10s} {per}")
    ratio = statistics.median(results["metrics"]) / statistics.median(results["reference"])
    print(f"metrics / reference: {ratio:.2f}x CPU per event")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--topic-bytes", action="store_true", help="turn on the opt-in topic bytes metric")
    parser.add_argument("--workload", choices=("traffic", "apiversions", "both"), default="both")
    args = parser.parse_args()
    pairs = load()
    results = {}
    if args.workload in ("traffic", "both"):
        results["traffic"] = measure("traffic", pairs, args)
    if args.workload in ("apiversions", "both"):
        results["apiversions"] = measure("apiversions", apiversions_load(pairs), args)
    for label, r in results.items():
        print(f"{label}: metrics {statistics.median(r['metrics per request']):.2f} us/request, "
              f"reference {statistics.median(r['reference per request']):.2f} us/request (CPU)")
    main_results = next(iter(results.values()))
    print(f"metrics cost: {statistics.median(main_results['metrics']):.2f} us/event "
          f"(reference {statistics.median(main_results['reference']):.2f} us/event)")


if __name__ == "__main__":
    main()
