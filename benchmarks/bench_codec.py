"""Throughput of kinspect's codec against kio and kafka-python on four realistic messages.

    python benchmarks/bench_codec.py [--json PATH] [--repeat N] [--min-time S] [--only NAME]

Messages (built once, the same bytes for every implementation):
  metadata    MetadataResponse v12: 100 topics x 12 partitions, 3 replicas, 3 ISR
  produce     ProduceRequest v9: 16 partitions, each one ~16 KB record batch (kafka-python's
              DefaultRecordBatchBuilder, uncompressed)
  fetch       FetchResponse v12: 3 topics x 4 partitions of record batches, aborted
              transactions, the last batch of the last partition cut short (as brokers send)
  apiversions ApiVersionsResponse v3: 60 api keys, supported and finalized features

Operations, each timed with timeit.repeat (median of >= 7 repeats, each long enough to
last --min-time seconds):
  kinspect decode_fast  CompiledStruct.decode_fast(buf, 0): the generated decoder, no checks
  kinspect decode       CompiledStruct.decode(buf): the public decoder (whole-buffer check,
                        errors made readable)
  kinspect scan         CompiledStruct.scan(buf): walks the message, builds no values
  kinspect encode       CompiledStruct.encode(value)
  kio read / write      kio.serial.entity_reader / entity_writer (kio's native reader)
  kafka-python decode / encode   Cls[version].decode(buf) / obj.encode()

Only public methods are called: if the codec later routes them to a native path, the
numbers show it. Ratios are time ratios: "x kio" = kinspect time / kio time for the same
direction (decode and scan against kio's read, encode against kio's write; < 1 is faster
than kio); "scan speed-up" = kinspect decode time / kinspect scan time.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import timeit
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinspect.protocol.codec import Codec  # noqa: E402

try:
    from kio.serial import entity_reader, entity_writer
except ImportError:  # kio is a test dependency: without it, its rows are left out
    entity_reader = entity_writer = None

try:
    import kafka.protocol.consumer.fetch as kp_fetch
    import kafka.protocol.metadata as kp_metadata
    import kafka.protocol.producer.produce as kp_produce
    from kafka.record.default_records import DefaultRecordBatchBuilder
except ImportError:
    kp_fetch = kp_metadata = kp_produce = DefaultRecordBatchBuilder = None


# ------------------------------------------------------------------ the messages


def record_batch(base_offset: int, target_size: int, *, value_size: int = 1000, transactional: bool = False,
                 producer_id: int = -1) -> bytes:
    """One uncompressed v2 record batch of about target_size bytes, built by kafka-python."""
    if DefaultRecordBatchBuilder is None:
        raise SystemExit("kafka-python is needed to build record batches: pip install kafka-python")
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional, producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1, base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 24,
    )
    i = 0
    while builder.size() < target_size - value_size - 40:
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"key-%06d" % i,
                       value=bytes((i + j) % 251 for j in range(value_size)), headers=[("trace", b"abc")])
        i += 1
    batch = bytearray(builder.build())
    batch[0:8] = base_offset.to_bytes(8, "big", signed=True)  # not covered by the CRC
    return bytes(batch)


def metadata_v12() -> dict:
    brokers = [{"NodeId": i, "Host": f"broker-{i}.kafka.svc.cluster.local", "Port": 9092, "Rack": f"rack-{i % 3}"}
               for i in range(6)]
    topics = []
    for t in range(100):
        partitions = [
            {"ErrorCode": 0, "PartitionIndex": p, "LeaderId": (t + p) % 6, "LeaderEpoch": 17,
             "ReplicaNodes": [(t + p + k) % 6 for k in range(3)], "IsrNodes": [(t + p + k) % 6 for k in range(3)],
             "OfflineReplicas": []}
            for p in range(12)
        ]
        topics.append({"ErrorCode": 0, "Name": f"service-{t:03d}.events.v1", "TopicId": uuid.UUID(int=t + 1),
                       "IsInternal": False, "Partitions": partitions, "TopicAuthorizedOperations": -2147483648})
    return {"ThrottleTimeMs": 0, "Brokers": brokers, "ClusterId": "Lp0yT1cVQ1uYpZ3mM4Y5aA", "ControllerId": 1,
            "Topics": topics}


def produce_v9() -> dict:
    batch = record_batch(0, 16 * 1024)
    return {
        "TransactionalId": None, "Acks": -1, "TimeoutMs": 30000,
        "TopicData": [{"Name": "orders", "PartitionData": [{"Index": p, "Records": batch} for p in range(16)]}],
    }


def fetch_v12() -> dict:
    topics = []
    offset = 1000
    for t in range(3):
        partitions = []
        for p in range(4):
            records = b""
            aborted = []
            for b in range(4):
                transactional = (p + b) % 3 == 0
                if transactional:
                    aborted.append({"ProducerId": 4000 + b, "FirstOffset": offset})
                batch = record_batch(offset, 4096, value_size=500, transactional=transactional,
                                     producer_id=4000 + b if transactional else -1)
                records += batch
                offset += 8
            if t == 2 and p == 3:
                records += record_batch(offset, 4096, value_size=500)[:1500]  # a batch cut short
            partitions.append({
                "PartitionIndex": p, "ErrorCode": 0, "HighWatermark": offset, "LastStableOffset": offset - 8,
                "LogStartOffset": 0, "AbortedTransactions": aborted or None, "PreferredReadReplica": -1,
                "Records": records,
            })
        topics.append({"Topic": f"payments-{t}", "Partitions": partitions})
    return {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 123456, "Responses": topics}


def api_versions_v3() -> dict:
    return {
        "ErrorCode": 0,
        "ApiKeys": [{"ApiKey": k, "MinVersion": 0, "MaxVersion": 3 + k % 11} for k in range(60)],
        "ThrottleTimeMs": 0,
        "SupportedFeatures": [{"Name": "metadata.version", "MinVersion": 1, "MaxVersion": 27},
                              {"Name": "kraft.version", "MinVersion": 0, "MaxVersion": 1}],
        "FinalizedFeaturesEpoch": 1234,
        "FinalizedFeatures": [{"Name": "metadata.version", "MaxVersionLevel": 27, "MinVersionLevel": 27}],
    }


def kio_class(module: str, name: str):
    if entity_reader is None:
        return None
    import importlib

    return getattr(importlib.import_module(module), name)


def kafka_python_class(name: str, version: int):
    if kp_metadata is None:
        return None
    import kafka.protocol.metadata.api_versions as kp_api_versions

    classes = {
        "MetadataResponse": kp_metadata.MetadataResponse,
        "ProduceRequest": kp_produce.ProduceRequest,
        "FetchResponse": kp_fetch.FetchResponse,
        "ApiVersionsResponse": kp_api_versions.ApiVersionsResponse,
    }
    return classes[name][version]


MESSAGES = [
    # name, api key, direction, version, builder, kio module:class, kafka-python class
    ("metadata", 3, "response", 12, metadata_v12, ("kio.schema.metadata.v12.response", "MetadataResponse"),
     "MetadataResponse"),
    ("produce", 0, "request", 9, produce_v9, ("kio.schema.produce.v9.request", "ProduceRequest"), "ProduceRequest"),
    ("fetch", 1, "response", 12, fetch_v12, ("kio.schema.fetch.v12.response", "FetchResponse"), "FetchResponse"),
    ("apiversions", 18, "response", 3, api_versions_v3,
     ("kio.schema.api_versions.v3.response", "ApiVersionsResponse"), "ApiVersionsResponse"),
]


# ------------------------------------------------------------------ timing


def measure(fn, repeat: int, min_time: float) -> float:
    """Median seconds per call: timeit.repeat with a loop count that lasts about min_time."""
    timer = timeit.Timer(fn)
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= min_time / 2 or number >= 1 << 24:
            break
        number = max(number * 2, int(number * (min_time / max(elapsed, 1e-9)) * 0.6))
    number = max(1, int(number * min_time / max(elapsed, 1e-9)))
    times = timer.repeat(repeat=repeat, number=number)
    return statistics.median(times) / number


def kp_encode(obj) -> bytes:
    # kafka-python 3.0.12's decoder leaves the _header slot unset; encode() needs it.
    try:
        obj._header
    except AttributeError:
        obj._header = None
    return obj.encode(version=obj.API_VERSION)


def bench_message(codec: Codec, spec, repeat: int, min_time: float) -> list[dict]:
    name, key, direction, version, build, kio_ref, kp_name = spec
    compiled = codec.body(key, direction, version)
    value = build()
    buf = bytes(compiled.encode(value))
    size = len(buf)
    decoded, _ = compiled.decode(buf)
    assert decoded == value, f"{name}: kinspect does not read back what it wrote"

    ops: list[tuple[str, str, object]] = []
    decode_fast = getattr(compiled, "decode_fast", None)
    if decode_fast is not None:
        ops.append(("decode_fast", "kinspect", lambda: decode_fast(buf, 0)))
    ops += [
        ("decode", "kinspect", lambda: compiled.decode(buf)),
        ("scan", "kinspect", lambda: compiled.scan(buf)),
        # Record-batch summaries are built when asked for: this row pays for them too.
        ("scan+records", "kinspect", lambda: compiled.scan(buf).records),
        ("encode", "kinspect", lambda: compiled.encode(decoded)),
    ]
    kio_cls = kio_class(*kio_ref)
    if kio_cls is not None:
        reader, writer = entity_reader(kio_cls), entity_writer(kio_cls)
        entity, end = reader(buf, 0)
        assert end == size, f"{name}: kio read {end} of {size} bytes"
        check = io.BytesIO()
        writer(check, entity)
        assert check.getvalue() == buf, f"{name}: kio writes other bytes"

        def kio_write():
            out = io.BytesIO()
            writer(out, entity)
            return out

        ops += [("decode", "kio", lambda: reader(buf, 0)), ("encode", "kio", kio_write)]
    kp_cls = kafka_python_class(kp_name, version)
    if kp_cls is not None:
        obj = kp_cls.decode(buf)
        assert bytes(kp_encode(obj)) == buf, f"{name}: kafka-python writes other bytes"
        ops += [
            ("decode", "kafka-python", lambda: kp_cls.decode(buf)),
            ("encode", "kafka-python", lambda: kp_encode(obj)),
        ]

    rows = []
    for op, impl, fn in ops:
        seconds = measure(fn, repeat, min_time)
        rows.append({
            "message": name, "api_key": key, "direction": direction, "version": version, "bytes": size,
            "op": op, "impl": impl, "seconds": seconds, "us_per_frame": seconds * 1e6,
            "mb_per_s": size / seconds / 1e6, "frames_per_s": 1 / seconds,
        })
    by = {(r["op"], r["impl"]): r["seconds"] for r in rows}
    for r in rows:
        if r["impl"] == "kinspect":
            kio_op = "encode" if r["op"] == "encode" else "decode"
            if (kio_op, "kio") in by:
                r["x_kio"] = r["seconds"] / by[(kio_op, "kio")]
            if r["op"] in ("scan", "scan+records"):
                r["scan_speedup_vs_decode"] = by[("decode", "kinspect")] / r["seconds"]
                if ("decode_fast", "kinspect") in by:
                    r["scan_speedup_vs_decode_fast"] = by[("decode_fast", "kinspect")] / r["seconds"]
        elif r["impl"] == "kafka-python" and (r["op"], "kio") in by:
            r["x_kio"] = r["seconds"] / by[(r["op"], "kio")]
    return rows


def print_table(rows: list[dict]) -> None:
    header = ("message", "bytes", "op", "impl", "us/frame", "MB/s", "frames/s", "x kio", "scan speed-up")
    lines = []
    for r in rows:
        speedup = ""
        if "scan_speedup_vs_decode" in r:
            speedup = f"{r['scan_speedup_vs_decode']:.2f}x decode"
            if "scan_speedup_vs_decode_fast" in r:
                speedup += f", {r['scan_speedup_vs_decode_fast']:.2f}x fast"
        lines.append((
            r["message"], f"{r['bytes']:,}", r["op"], r["impl"], f"{r['us_per_frame']:,.1f}", f"{r['mb_per_s']:,.1f}",
            f"{r['frames_per_s']:,.0f}", f"{r['x_kio']:.2f}" if "x_kio" in r else "", speedup,
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    right = {1, 4, 5, 6, 7}

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    previous = None
    for r, line in zip(rows, lines):
        if previous is not None and r["message"] != previous:
            print()
        previous = r["message"]
        print(fmt(line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also save the numbers as JSON")
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats, median taken (default 7, at least 7)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds each repeat lasts at least (default 0.2)")
    parser.add_argument("--only", action="append", choices=[m[0] for m in MESSAGES], help="bench only these messages")
    args = parser.parse_args(argv)
    repeat = max(7, args.repeat)

    codec = Codec()
    rows = []
    for spec in MESSAGES:
        if args.only and spec[0] not in args.only:
            continue
        rows += bench_message(codec, spec, repeat, args.min_time)
    print(f"kinspect codec benchmark: python {platform.python_version()} ({platform.python_implementation()}), "
          f"median of {repeat} repeats")
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": platform.machine(), "repeat": repeat, "min_time": args.min_time, "rows": rows,
        }, indent=2) + "\n")
        print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
