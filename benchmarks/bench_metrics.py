"""What the metrics observer costs per event, on the recorded real traffic of tests/data/traffic.

    python benchmarks/bench_metrics.py [--rounds N] [--topic-bytes]

Each round replays every recorded connection through a fresh Session (untimed) to get
fresh events (events cache their scan, so they cannot be reused), then times handing
them to an observer one by one with perf_counter_ns:
  off      a no-op observer (the dispatch loop alone)
  on       MetricsObserver.on_event (counters, histograms, and one scan per complete frame)
  on-warm  MetricsObserver.on_event on the same events again (scans cached: the cost of
           the metric updates alone)
Reported: microseconds per event (median over rounds), overall and per event type, and
the session replay's own cost per event for scale.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.wire_program import native_available
from kinspect.session import ConnectionInfo, Session

TRAFFIC = ROOT / "tests" / "data" / "traffic"


def load() -> list[tuple[bytes, bytes]]:
    pairs = []
    for requests in sorted(TRAFFIC.glob("*/*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        pairs.append((requests.read_bytes(), responses.read_bytes()))
    return pairs


def replay(codec: Codec, pairs) -> tuple[list, float]:
    events, started = [], time.perf_counter_ns()
    for n, (requests, responses) in enumerate(pairs):
        session = Session(codec, ConnectionInfo(n, "client", "broker"))
        events += session.client_data(requests, 0.0).events
        events += session.broker_data(responses, 0.001).events
        events += session.close(0.002)
    return events, (time.perf_counter_ns() - started) / 1000


class Nothing:
    needs_bodies = True

    def on_event(self, event) -> None:
        pass


def timed(on_event, events) -> tuple[float, dict]:
    per_type: dict[str, float] = collections.defaultdict(float)
    clock = time.perf_counter_ns
    all_started = clock()
    for e in events:
        started = clock()
        on_event(e)
        per_type[type(e).__name__] += clock() - started
    return (clock() - all_started) / 1000, {k: v / 1000 for k, v in per_type.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--topic-bytes", action="store_true", help="turn on the opt-in topic bytes metric")
    args = parser.parse_args()
    codec = Codec()
    pairs = load()
    observer = MetricsObserver(topic_bytes=args.topic_bytes)
    replay_us, results = [], collections.defaultdict(list)
    types = collections.Counter()
    for _ in range(3):  # warm-up: compile the scanners, create the label children
        events, _ = replay(codec, pairs)
        for e in events:
            observer.on_event(e)
    for _ in range(args.rounds):
        events, us = replay(codec, pairs)
        replay_us.append(us / len(events))
        types = collections.Counter(type(e).__name__ for e in events)
        for name, on_event in (("off", Nothing().on_event), ("on", observer.on_event), ("on-warm", observer.on_event)):
            total_us, per_type = timed(on_event, events)
            results[name].append(total_us / len(events))
            for t, us in per_type.items():
                results[f"{name}:{t}"].append(us / types[t])
    print(f"events per round: {sum(types.values())} ({dict(types)}); native codec: {native_available()}; "
          f"topic_bytes: {args.topic_bytes}; rounds: {args.rounds}")
    print(f"session replay (making the events): {statistics.median(replay_us):.2f} us/event")
    for name in ("off", "on", "on-warm"):
        per = ", ".join(f"{t} {statistics.median(results[f'{name}:{t}']):.2f}" for t in sorted(types))
        print(f"{name:8s} {statistics.median(results[name]):6.2f} us/event   ({per})")
    print(f"metrics cost: {statistics.median(results['on']) - statistics.median(results['off']):.2f} us/event")


if __name__ == "__main__":
    main()
