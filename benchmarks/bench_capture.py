"""What the capture costs: on the event loop per exchange, and in the writer thread per row (recorded traffic).

    python benchmarks/bench_capture.py [--rounds N]

Events come from replaying every recorded connection of tests/data/traffic through a
Session. Measured in one run, medians over rounds:
  on_event   µs per event handed to an observer, for all events of the replay (Requests,
             Responses, Exchanges, Problems) as the dispatcher hands them: a no-op observer,
             CaptureObserver (appends Exchanges to its deque), and the same observer shape
             with a queue.Queue.put_nowait instead (the alternative the writer does not use);
             "per exchange" is the capture's extra cost over the no-op divided by the exchanges.
  rows       rows per second built by RowBuilder (decode, scan, integer-field walk), and rows
             per second through the whole writer (rows + pyarrow tables + a zstd Parquet file).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.capture.observer import CaptureObserver
from kinspect.capture.rows import RowBuilder
from kinspect.capture.writer import CaptureWriter
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session

TRAFFIC = ROOT / "tests" / "data" / "traffic"


def replay(codec: Codec) -> list:
    events = []
    for n, requests in enumerate(sorted(TRAFFIC.glob("*/*.requests.bin"))):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        session = Session(codec, ConnectionInfo(n, "127.0.0.1:4000", "127.0.0.1:9092"))
        events += session.client_data(requests.read_bytes(), 1.0).events
        events += session.broker_data(responses.read_bytes(), 1.001).events
        events += session.close(1.002)
    return events


class Nothing:
    needs_bodies = True

    def on_event(self, event) -> None:
        pass


class QueueCapture:
    """CaptureObserver's on_event with a queue.Queue (lock + condition per put) instead of a deque."""

    needs_bodies = True

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=10_000_000)

    def on_event(self, event) -> None:
        if type(event) is Exchange:
            try:
                self.queue.put_nowait(event)
            except queue.Full:
                pass


def time_events(observer, events, repeat: int) -> float:
    """ns per event, over `repeat` passes (the observer's queue is emptied between passes, untimed)."""
    on_event = observer.on_event
    total = 0
    for _ in range(repeat):
        started = time.perf_counter_ns()
        for e in events:
            on_event(e)
        total += time.perf_counter_ns() - started
        if isinstance(observer, CaptureObserver):
            observer.writer._queue.clear()
        elif isinstance(observer, QueueCapture):
            observer.queue = queue.Queue(maxsize=10_000_000)
    return total / (repeat * len(events))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    codec = Codec()
    events = replay(codec)
    exchanges = [e for e in events if type(e) is Exchange]
    print(f"{len(events)} events, {len(exchanges)} exchanges from {TRAFFIC.relative_to(ROOT)}")

    with tempfile.TemporaryDirectory() as tmp:
        capture = CaptureObserver(tmp, codec)  # not started: on_event only appends
        observers = {"no-op": Nothing(), "capture (deque)": capture, "capture (queue.Queue)": QueueCapture()}
        timings: dict[str, list[float]] = {name: [] for name in observers}
        for _ in range(args.rounds):
            for name, observer in observers.items():  # interleaved, so drift hits all alike
                timings[name].append(time_events(observer, events, 20))
        base = statistics.median(timings["no-op"])
        print("\non_event, µs per event (median of rounds):")
        for name, values in timings.items():
            med = statistics.median(values)
            extra = (med - base) * len(events) / len(exchanges)
            tail = "" if name == "no-op" else f"   +{extra / 1000:.3f} µs per exchange over the no-op"
            print(f"  {name:24s} {med / 1000:.3f} µs  ({med / base:.2f}x no-op){tail}")

        builder = RowBuilder(Codec(codec.registry), 0.0)
        for x in exchanges:  # warm up: compile every (api, version) once
            builder.build(x)
        build_rates, writer_rates = [], []
        for r in range(args.rounds):
            started = time.perf_counter()
            for x in exchanges:
                builder.build(x)
            build_rates.append(len(exchanges) / (time.perf_counter() - started))
            out = Path(tmp) / f"round{r}"
            writer = CaptureWriter(out, builder, row_group_rows=10_000)
            started = time.perf_counter()
            writer.start()
            for _ in range(10):
                for x in exchanges:
                    writer.offer(x)
            writer.close()
            writer_rates.append(writer.rows_written / (time.perf_counter() - started))
            assert writer.rows_written == 10 * len(exchanges) and writer.rows_dropped == 0
        print("\nwriter thread (median of rounds):")
        print(f"  RowBuilder.build        {statistics.median(build_rates):,.0f} rows/s "
              f"({1e6 / statistics.median(build_rates):.0f} µs per row)")
        print(f"  whole writer to Parquet {statistics.median(writer_rates):,.0f} rows/s")


if __name__ == "__main__":
    main()
