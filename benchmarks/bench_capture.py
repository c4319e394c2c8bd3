"""What the capture costs: on the event loop per exchange, and in the writer thread per row (recorded traffic).

    python benchmarks/bench_capture.py [--rounds N] [--repeat N]

Events come from replaying every recorded connection of tests/data/traffic through a
Session. Measured in one run, interleaved (the dispatch pass by pass: a round's figure is its
median pass), medians (and spread: min-max) over rounds; the
event loop's figures are CPU time of the measuring thread (time.thread_time, from
/proc), which a loaded machine inflates less than wall-clock time:
  scan       µs per exchange for the shared scan of both directions (request.scan(),
             response.scan() and their record-batch summaries) on fresh events: what the
             metrics pay anyway, and what gathers every fact a capture row needs; with and
             without the capture's integer counters, pass by pass (--repeat a round), the
             collector paused: a round's figure is its median pass, and the capture's part of the
             scan the median of the passes' differences.
  dispatch   µs per event the dispatcher (proxy.observers.Dispatcher, the reference of the C
             one) spends handing all events of the replay (Requests, Responses, Exchanges,
             Problems) to its observers, scans already cached (as the metrics leave them):
             with none, with a no-op observer of every event, and with CaptureObserver (its
             handler for an Exchange takes the facts and queues them); "per exchange" is the
             capture's cost over no observer at all divided by the exchanges: the event loop's
             share beyond the scan, the call included. Beside it, the capture's handler (the
             queue's front) called from C, as the proxy's C dispatcher (kinspect/proxy/_batch.c)
             calls it, a C builtin's call subtracted: the same share without the Python
             dispatcher's own step. Last, capture's whole cost to the event loop: that share
             plus what the scan's integer counters (gathered for a capture only) add to it,
             round by round. The capture's scans leave a whole frame's integer counters to its
             writer (codegen.COUNT_LATER); what counting them in the scan would add is beside it.
  writer     rows per second in the writer thread: BatchBuilder.build (facts to an Arrow
             record batch, BATCH_ROWS at a time), and the whole writer (batches and a zstd
             Parquet file) by wall clock and by the process's CPU time (rows per CPU
             second: what one free core sustains; the main thread only waits meanwhile).
  process    the same through the writer process (the proxy's default): rows per second by
             wall clock from the first row offered to the last written, and CPU µs per row of
             the writer thread (which shares alike sides and encodes each batch for the pipe,
             capture.facts_wire) and of the writer process (decoding, building, writing),
             each from /proc, the process's start-up and warm-up left out (as a proxy's).
  GIL wait   while the writer thread works, the main thread sleeps 1 ms at a time and
             measures how late each wake-up is: what an event loop waking for a socket
             waits for the GIL (median, p99, max, in ms), with the rows built in the
             thread and with the thread only encoding them for the writer process (the
             proxy's default); beside them the same with no writer, interleaved: what the
             machine's own scheduling adds; and with this process and a busy writer
             process on one core, the writer process at the proxy's priority and at its
             own (writer_priority.NICENESS).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.capture.batch import BatchBuilder
from kinspect.protocol.codec.codegen import COUNT_LATER
from kinspect.capture.facts import FactsTaker
from kinspect.capture.observer import CaptureObserver
from kinspect.capture.warm_up import warm_facts
from kinspect.capture.writer import BATCH_ROWS, PRIORITIES, CaptureWriter
from kinspect.protocol.codec import Codec
from kinspect.proxy.observers import Dispatcher
from kinspect.session import ConnectionInfo, Exchange, Session
from proc_cpu import cpu_seconds, thread_seconds

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


def scan_all(exchanges) -> None:
    """The shared scan, as the metrics observer leaves it: both directions, record summaries read."""
    for x in exchanges:
        for event in (x.request, x.response):
            if event is not None and event.complete:
                try:
                    scan = event.scan()
                except ValueError:
                    continue
                if scan.record_spans:
                    scan.records  # noqa: B018 (summarized on first access)


def time_events(observer, events, repeat: int) -> float:
    """ns per event the dispatcher takes to hand them to observer (None: no observer), over `repeat`
    passes (the capture's queue is emptied between passes, untimed)."""
    dispatch = Dispatcher([observer] if observer is not None else []).dispatch
    total = 0
    for _ in range(repeat):
        started = time.thread_time_ns()
        dispatch(events)
        total += time.thread_time_ns() - started
        if isinstance(observer, CaptureObserver):
            observer.writer._queue.clear()
            observer.writer.front.offered_bytes = observer.writer.front.taken_bytes = 0
    return total / (repeat * len(events))


def time_front(capture: CaptureObserver, exchanges: list) -> float:
    """ns per exchange of the capture's queue front (its handler of an Exchange) called from C, a call of a C
    builtin of one argument subtracted: the event loop's share as kinspect/proxy/_batch.c makes the call."""
    front, drain = capture.handlers[Exchange], deque(maxlen=0).extend
    started = time.thread_time_ns()
    drain(map(front, exchanges))
    spent = time.thread_time_ns() - started
    started = time.thread_time_ns()
    drain(map(id, exchanges))
    spent -= time.thread_time_ns() - started
    assert len(capture.writer._queue) == len(exchanges)  # every exchange taken and queued
    capture.writer._queue.clear()
    front.offered_bytes = front.taken_bytes = 0
    return spent / len(exchanges)


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(values) * scale)} ({fmt.format(min(values) * scale)}-" \
           f"{fmt.format(max(values) * scale)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=20, help="passes over the events per round (the scans, and on_event)")
    parser.add_argument("--copies", type=int, default=20, help="copies of the exchanges the writer gets per round")
    parser.add_argument("--writer-priority", choices=PRIORITIES, default="auto",
                        help="the writer process's priority (capture.writer_priority; default auto, as the proxy's; "
                             "idle: the idle class, paced while it waits for its core, and where it may not leave the "
                             "class, waiting for cores other work keeps busy)")
    args = parser.parse_args()
    codec = Codec()
    events = replay(codec)
    exchanges = [e for e in events if type(e) is Exchange]
    print(f"{len(events)} events, {len(exchanges)} exchanges from {TRAFFIC.relative_to(ROOT)}")
    scan_all(exchanges)  # warm up: compile every (api, version) once
    for integers in (True, COUNT_LATER):  # and once each other way, whose first scans took twice as long
        codec.integer_facts = integers
        scan_all([e for e in replay(codec) if type(e) is Exchange])

    # ---------------------------------------------------------------- the event loop
    # The metrics alone (False); as the capture scans (COUNT_LATER: whole frames kept for its writer to count); and
    # counting every frame's integer fields on the event loop (True, as before COUNT_LATER), alternated.
    modes = (False, COUNT_LATER, True)
    scan_ns: dict[object, list[float]] = {mode: [] for mode in modes}
    # The capture's part of the scan is a difference of two scans of about 11 µs: taken pass by pass (the modes of
    # a pass run back to back) and the median of a round's passes, where sums of five passes moved a round's
    # difference by 0.5 µs and runs by a factor of two to six (docs/performance.md, twenty-fourth section).
    later_ns: list[float] = []
    counting_ns: list[float] = []
    for _ in range(args.rounds):
        passes: dict[object, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeat):
            for integers in modes:
                codec.integer_facts = integers
                fresh = [e for e in replay(codec) if type(e) is Exchange]  # events with nothing cached
                # The collector paused: a full collection landing in one pass (the replay's objects) cost it
                # 2-3x, and counters (bytes, untracked) add nothing for it to walk.
                gc.collect()
                gc.disable()
                try:
                    started = time.thread_time_ns()
                    scan_all(fresh)
                    passes[integers].append((time.thread_time_ns() - started) / len(fresh))
                finally:
                    gc.enable()
        for integers in modes:
            scan_ns[integers].append(statistics.median(passes[integers]))
        later_ns.append(statistics.median(a - b for a, b in zip(passes[COUNT_LATER], passes[False])))
        counting_ns.append(statistics.median(a - b for a, b in zip(passes[True], passes[False])))
    codec.integer_facts = COUNT_LATER  # as the capture's scans are
    events = replay(codec)
    exchanges = [e for e in events if type(e) is Exchange]
    scan_all(exchanges)

    with tempfile.TemporaryDirectory() as tmp:
        capture = CaptureObserver(tmp, codec, queue_rows=10_000_000, queue_bytes=1 << 40)  # not started: offers only
        observers = {"no observer": None, "no-op": Nothing(), "capture": capture}
        timings: dict[str, list[float]] = {name: [] for name in observers}
        from_c: list[float] = []  # the front's own call, as the C dispatcher makes it
        for _ in range(args.rounds):
            passes: dict[str, list[float]] = {name: [] for name in observers}
            fronts: list[float] = []
            for _ in range(args.repeat):  # interleaved pass by pass, so the machine's drift hits all alike
                for name, observer in observers.items():
                    passes[name].append(time_events(observer, events, 1))
                fronts.append(time_front(capture, exchanges))
            for name, values in passes.items():  # a round's figure: its median pass
                timings[name].append(statistics.median(values))
            from_c.append(statistics.median(fronts))
        base = statistics.median(timings["no observer"])
        print("\nevent loop (median of rounds, min-max in brackets):")
        print(f"  shared scan, both directions   {spread(scan_ns[COUNT_LATER], 1e-3)} µs per exchange "
              "(every capture fact, whole frames' integer counters left to the writer; the metrics read the same scan)")
        print(f"  the same without integer facts (no capture) {spread(scan_ns[False], 1e-3)} µs per exchange; "
              f"counting them all in the scan {spread(scan_ns[True], 1e-3)}")
        print("  dispatch, µs per event, scans cached:")
        extras: dict[str, list[float]] = {}
        for name, values in timings.items():
            med = statistics.median(values)
            tail = ""
            if name != "no observer":
                extras[name] = [(v - b) * len(events) / len(exchanges)
                                for v, b in zip(values, timings["no observer"])]
                tail = f"   +{spread(extras[name], 1e-3)} µs per exchange over no observer"
            print(f"  {name:24s} {med / 1000:.3f} µs  ({med / base:.2f}x no observer){tail}")
        share = statistics.median(extras["capture"])
        print(f"  capture's share beyond the scan: {share / 1000:.3f} µs per exchange")
        print(f"  the same, the queue's front called from C as the proxy's C dispatcher calls it (the Python "
              f"dispatcher's own step left out): {spread(from_c, 1e-3)} µs per exchange")
        # The integer facts are gathered only for a capture: the scan's extra time is capture's cost too.
        later, counting = later_ns, counting_ns
        whole = [c + f for c, f in zip(later, from_c)]
        print(f"  capture's whole cost to the event loop, its integer facts in the scan ({spread(later, 1e-3)}; "
              f"counted there instead: {spread(counting, 1e-3)}) and its share from C, by round: "
              f"{spread(whole, 1e-3)} µs per exchange (target < 1 µs)")

        # ---------------------------------------------------------------- the writer thread
        take = FactsTaker(codec).take
        offered = [take(x) for x in exchanges]
        builder = BatchBuilder(0.0, codec.registry)
        build_rates, writer_rates, writer_cpu, waits, idle, process_waits = [], [], [], [], [], []
        through_process: list[tuple[float, float, float]] = []
        for r in range(args.rounds):
            facts = [f for f, _ in offered] * 8
            started = time.thread_time()
            for i in range(0, len(facts), BATCH_ROWS):
                builder.build(facts[i:i + BATCH_ROWS])
            build_rates.append(len(facts) / (time.thread_time() - started))
            writer = CaptureWriter(Path(tmp) / f"round{r}", builder, row_group_rows=10_000,
                                   queue_rows=10_000_000, queue_bytes=1 << 40)
            for _ in range(args.copies):  # queued first, so that the thread never waits for work
                for f, held in offered:
                    writer.offer(f, held)
            started, cpu = time.perf_counter(), time.process_time()
            writer.start()
            writer.close()
            writer_rates.append(writer.rows_written / (time.perf_counter() - started))
            writer_cpu.append(writer.rows_written / (time.process_time() - cpu))
            assert writer.rows_written == args.copies * len(exchanges) and writer.rows_dropped == 0
            assert writer.row_errors == writer.write_errors == 0
            through_process.append(process_writer(Path(tmp) / f"process{r}", builder, offered, 5 * args.copies,
                                                  warm_facts(codec), args.writer_priority))
            waits.append(gil_waits(Path(tmp) / f"gil{r}", builder, offered, args.copies))
            idle.append(sleep_lateness(len(waits[-1])))
            process_waits.append(gil_waits(Path(tmp) / f"gil-process{r}", builder, offered, args.copies, True,
                                           args.writer_priority))
        late = sorted(w for ws in waits for w in ws)
        alone = sorted(w for ws in idle for w in ws)
        late_process = sorted(w for ws in process_waits for w in ws)
        print("\nwriter thread (median of rounds, min-max in brackets):")
        print(f"  BatchBuilder.build      {spread(build_rates, 1, '{:,.0f}')} rows per CPU second "
              f"({BATCH_ROWS} rows a batch)")
        print(f"  whole writer to Parquet {spread(writer_cpu, 1, '{:,.0f}')} rows per CPU second, "
              f"{spread(writer_rates, 1, '{:,.0f}')} rows/s wall clock (target >= 30,000 rows/s)")
        print(f"  through the writer process {spread([p[0] for p in through_process], 1, '{:,.0f}')} rows/s wall "
              f"clock; CPU per row: writer thread {spread([p[1] for p in through_process], 1, '{:.2f}')} µs, writer "
              f"process {spread([p[2] for p in through_process], 1, '{:.1f}')} µs")
        for label, values in (("while the writer works", late),
                              ("while the writer thread feeds the writer process (the proxy's default)", late_process),
                              ("with no writer (the machine)", alone)):
            print(f"  lateness of a thread waking every 1 ms {label}: median "
                  f"{statistics.median(values) * 1e3:.3f} ms, p99 {values[int(len(values) * 0.99)] * 1e3:.3f} ms, "
                  f"max {values[-1] * 1e3:.3f} ms over {len(values)} wake-ups")
        print(f"  (switch interval {sys.getswitchinterval() * 1e3:.2f} ms)")
        shared = shared_core_lateness(Path(tmp), builder, offered, args.rounds)
        if shared:
            for nice, values in shared.items():
                print(f"  one core shared with a busy writer process at nice +{nice}: lateness of a thread waking "
                      f"every 1 ms: median {statistics.median(values) * 1e3:.3f} ms, "
                      f"p99 {values[int(len(values) * 0.99)] * 1e3:.3f} ms over {len(values)} wake-ups")


def shared_core_lateness(directory: Path, builder, offered, rounds: int) -> dict[int, list[float]]:
    """Lateness (s) of 1 ms sleeps with this process and the writer process on one core while the
    writer process is busy, with the process at the proxy's priority (+0) and as it runs with
    capture.writer_priority = "low" (writer_priority.NICENESS): what a sidecar with few cores, all busy,
    sees. Empty where the CPU affinity cannot be set."""
    from kinspect.capture import writer_priority

    if not hasattr(os, "sched_setaffinity"):
        return {}
    cpus = os.sched_getaffinity(0)
    out: dict[int, list[float]] = {0: [], writer_priority.NICENESS: []}
    os.sched_setaffinity(0, {min(cpus)})  # the writer process inherits it
    try:
        for r in range(rounds):
            for nice in out:
                writer = CaptureWriter(directory / f"shared{r}-{nice}", builder, row_group_rows=10_000,
                                       queue_rows=10_000_000, queue_bytes=1 << 40, process=True,
                                       writer_priority="low").start()
                pid, base = writer._out.proc.pid, os.getpriority(os.PRIO_PROCESS, 0)
                deadline = time.monotonic() + 5.0
                while os.getpriority(os.PRIO_PROCESS, pid) == base and time.monotonic() < deadline:
                    time.sleep(0.001)  # it lowers itself once ready
                os.setpriority(os.PRIO_PROCESS, pid, base + nice)
                for _ in range(150):  # more rows than it builds in the time measured: busy throughout
                    for f, held in offered:
                        writer.offer(f, held)
                ends = time.monotonic() + 1.0
                while time.monotonic() < ends:
                    started = time.perf_counter()
                    time.sleep(0.001)
                    out[nice].append(time.perf_counter() - started - 0.001)
                writer.close()
    finally:
        os.sched_setaffinity(0, cpus)
    return {nice: sorted(values) for nice, values in out.items()}


ROW_GROUP_ROWS = 10_000  # the writer process's row groups in process_writer


def process_writer(directory: Path, builder, offered, copies: int, warm: tuple,
                   priority: str = "auto") -> tuple[float, float, float]:
    """(rows/s, writer thread CPU µs a row, writer process CPU µs a row) of `copies` of the facts written
    through a started writer process: offered at once, timed until the file is finished and the process ended."""
    import resource

    # Started as the proxy starts it: it returns once the process is ready, pyarrow warmed up on `warm` (one
    # exchange's facts), so that neither its start-up nor pyarrow's first use is counted.
    writer = CaptureWriter(directory, builder, row_group_rows=ROW_GROUP_ROWS, queue_rows=10_000_000,
                           queue_bytes=1 << 40, process=True, warm_facts=warm, writer_priority=priority).start()
    thread, pid = writer._thread.native_id, writer._out.proc.pid
    # A row group's worth first, not counted: the process compiles the scans of the apis whose integer fields it
    # counts (codegen.COUNT_LATER) as it meets them, once (about 90 ms for the recorded traffic's 93 structs), as
    # the proxy compiles its own; the rows are written (and counted in rows_written) a row group at a time.
    for i in range(ROW_GROUP_ROWS):
        writer.offer(*offered[i % len(offered)])
    while writer.rows_written < ROW_GROUP_ROWS:
        time.sleep(0.002)
    rows = copies * len(offered)
    base_written = writer.rows_written
    start_up = cpu_seconds(pid)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    thread_cpu = thread_seconds(os.getpid(), thread)
    started = time.perf_counter()
    for _ in range(copies):
        for f, held in offered:
            writer.offer(f, held)
    # every row handed to the process but a part batch, which would wait BATCH_SECONDS (close sends it at once)
    while writer.queue_depth >= BATCH_ROWS or writer._out._sent + writer.queue_depth < rows:
        time.sleep(0.002)
    thread_cpu = thread_seconds(os.getpid(), thread) - thread_cpu
    writer.close()  # the process writes the rest and ends
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    process_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime - start_up
    assert writer.rows_written - base_written == rows, (writer.rows_written, writer.row_errors, writer.write_errors)
    return rows / elapsed, thread_cpu / rows * 1e6, process_cpu / rows * 1e6


def sleep_lateness(count: int) -> list[float]:
    """Lateness (s) of `count` 1 ms sleeps with nothing else running in this process."""
    late = []
    for _ in range(count):
        started = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    return late


def gil_waits(directory: Path, builder, offered, copies: int, process: bool = False,
              priority: str = "auto") -> list[float]:
    """Lateness (s) of 1 ms sleeps on this thread while a started writer works through `copies` of
    the facts: building the rows itself, or (`process`) encoding them for the writer process."""
    writer = CaptureWriter(directory, builder, row_group_rows=10_000, queue_rows=10_000_000, queue_bytes=1 << 40,
                           process=process, writer_priority=priority)
    if process:
        writer.start()  # the process starts (and warms up) before any row is queued: as in a proxy
    for _ in range(copies):
        for f, held in offered:
            writer.offer(f, held)
    writer.start()
    late = []
    while writer.queue_depth:
        started = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    writer.close()
    return late


if __name__ == "__main__":
    main()
