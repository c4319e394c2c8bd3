"""C decoder/scanner (_wire) against the generated Python decoder and kio on MetadataResponse v12.

    python benchmarks/bench_native_probe.py [--repeat N] [--min-time S] [--no-gc-run]

The message: 3 brokers, 100 topics x 12 partitions x 3 replicas (the same bytes for all).
Each operation is timed with timeit in the same run, in interleaved rounds, first with
the collector off (timeit's default) then on; the median per call is printed, with
ratios (time / time: < 1 is faster).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import timeit
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinspect.protocol.codec import codegen  # noqa: E402
from kinspect.protocol.codec import Codec  # noqa: E402
from kinspect.protocol.codec.codec import _compile  # noqa: E402
from kinspect.protocol.codec.scan_result import ScanResult  # noqa: E402
from kinspect.protocol.codec.wire_program import build_program, native_module  # noqa: E402


def message() -> dict:
    return {
        "ThrottleTimeMs": 0,
        "Brokers": [{"NodeId": i, "Host": f"broker-{i}.kafka.svc", "Port": 9092, "Rack": "r1"} for i in range(3)],
        "ClusterId": "abc", "ControllerId": 1,
        "Topics": [
            {"ErrorCode": 0, "Name": f"topic-{t}", "TopicId": uuid.uuid4(), "IsInternal": False,
             "Partitions": [
                 {"ErrorCode": 0, "PartitionIndex": p, "LeaderId": p % 3, "LeaderEpoch": 5,
                  "ReplicaNodes": [0, 1, 2], "IsrNodes": [0, 1, 2], "OfflineReplicas": []}
                 for p in range(12)],
             "TopicAuthorizedOperations": -2147483648}
            for t in range(100)],
    }


def median_times(ops: dict, repeat: int, min_time: float, gc_on: bool) -> dict:
    """Median seconds per call of each op: `repeat` rounds, each timing every op once for
    about min_time, interleaved so that a change in machine load hits all ops alike."""
    setup = "gc.enable()" if gc_on else "pass"  # timeit turns the collector off; this turns it back on
    numbers = {}
    for name, fn in ops.items():
        number, taken = timeit.Timer(fn, setup, globals={"gc": gc}).autorange()
        numbers[name] = max(1, int(min_time * number / taken))
    samples: dict = {name: [] for name in ops}
    for _ in range(repeat):
        for name, fn in ops.items():
            t = timeit.timeit(fn, setup, number=numbers[name], globals={"gc": gc})
            samples[name].append(t / numbers[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def report(times: dict) -> None:
    for name, t in times.items():
        print(f"  {name:<14} {t * 1e6:9.1f} us")
    c = times["C decode"]
    print(f"  C decode / Python decode  {c / times['Python decode']:.3f}  (Python is {times['Python decode'] / c:.1f}x slower)")
    print(f"  C scan / C decode         {times['C scan'] / c:.3f}  (scan is {c / times['C scan']:.1f}x faster)")
    print(f"  C scan / Python scan      {times['C scan'] / times['Python scan']:.3f}")
    if "kio read" in times:
        k = times["kio read"]
        print(f"  C decode / kio read       {c / k:.3f}  (kio takes {k / c:.2f}x the C decode time)")
        print(f"  Python decode / kio read  {times['Python decode'] / k:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.1)
    parser.add_argument("--no-gc-run", action="store_true", help="skip the second run with the collector on")
    args = parser.parse_args()

    wire = native_module()
    if wire is None:
        print("kinspect.protocol.codec._wire is not available (not built, or KINSPECT_PURE_PYTHON=1)")
        return 1
    compiled = Codec().body(3, "response", 12)
    raw = bytes(compiled.encode(message()))
    program = wire.compile_program(build_program(compiled.spec.struct, 12, True))
    py_scan = _compile(codegen.generate_scanner(compiled.spec.struct, 12, True, compiled.label), "scan", compiled.label)
    assert program.decode(raw, 0) == compiled.decode_fast(raw, 0)

    ops = {
        "C decode": lambda: program.decode(raw, 0),
        "C scan": lambda: program.scan(raw, 0, ScanResult()),
        "Python decode": lambda: compiled.decode_fast(raw, 0),
        "Python scan": lambda: py_scan(raw, 0, ScanResult()),
    }
    try:
        from kio.schema.metadata.v12.response import MetadataResponse
        from kio.serial import entity_reader

        kio_read = entity_reader(MetadataResponse)
        assert kio_read(raw, 0)[1] == len(raw)
        ops["kio read"] = lambda: kio_read(raw, 0)
    except ImportError:
        print("kio is not installed: its row is left out")

    print(f"MetadataResponse v12, {len(raw)} bytes; Python {sys.version.split()[0]}")
    print("gc off (timeit's default); ratios are time / time:")
    report(median_times(ops, args.repeat, args.min_time, gc_on=False))
    if not args.no_gc_run:
        print("gc on (as in a running proxy):")
        report(median_times(ops, args.repeat, args.min_time, gc_on=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
