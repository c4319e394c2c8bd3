"""How fast kinspect reads tcpdump captures of Kafka traffic: MB of pcap per second and CPU seconds per MB.

    python benchmarks/bench_pcap.py [--mb 120] [--reps 5] [--pcap FILE --port P]

Records a capture first (unless --pcap): confluent-kafka produces about MB/2 megabytes of
records (values of 100 B to 16 KB) to Tansu and a consumer reads them back, while
`tcpdump -i lo` writes every packet of the broker's port. Then, interleaved over reps,
medians reported, each over the same file:
  dpkt only        PacketReader.segments(): reading the file and dpkt's Ethernet/IP/TCP parse (the floor)
  kinspect         + reassembly, framing, sessions (pairing) and no output: what decode and capture share
  decode --pcap    + JSON Lines of every frame, to /dev/null (full bodies: slow by design)
  tshark           `tshark -r F -d tcp.port==P,kafka -T fields -e kafka.correlation_id` (Wireshark's dissector)
CPU seconds come from /proc/self/stat (utime+stime; children's for tshark). MB/s is wall-clock
time, which on a shared machine includes waiting for a core; MB/CPU-s is what one core does.
Both files are measured: as recorded on loopback (segments up to 64 KB) and resegmented to
a 1448-byte MSS, as an Ethernet network carries the same bytes (about 30x the packets).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.config import InspectConfig  # noqa: E402
from kinspect.pcap.decode_run import _JsonSink  # noqa: E402
from kinspect.pcap.pipeline import inspect_pcap  # noqa: E402
from kinspect.pcap.reader import PacketReader  # noqa: E402
from kinspect.protocol.codec import Codec  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(children: bool = False) -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    # After the ")": state is field 3, so utime/stime/cutime/cstime (14-17) are at 11-14 here.
    own, kids = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    return (kids if children else own) / TICKS


def record(path: Path, mb: float) -> int:
    from confluent_kafka import Consumer, Producer

    from tests.pcap.recording import Tcpdump
    from tests.support.tansu import TansuBroker

    sizes = (100, 1000, 4000, 16000)
    target = int(mb * 1e6 / 2)
    with TansuBroker() as broker:
        with Tcpdump(path, broker.port) as dump:
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10, "client.id": "bench-pcap"})
            sent = count = 0
            while sent < target:
                value = os.urandom(sizes[count % len(sizes)])
                while True:
                    try:
                        producer.produce("bench.pcap", value)
                        break
                    except BufferError:
                        producer.poll(0.05)
                sent += len(value)
                count += 1
                producer.poll(0)
            assert producer.flush(60) == 0
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench.pcap",
                                 "client.id": "bench-pcap", "auto.offset.reset": "earliest",
                                 # as every group here: the default (45 s) kept this first join waiting about 20 s
                                 "session.timeout.ms": 6000})
            consumer.subscribe(["bench.pcap"])
            got, deadline = 0, time.monotonic() + 120
            while got < count and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 1.0):
                    if msg.error() is None:
                        got += 1
            consumer.close()
        print(f"recorded {path.stat().st_size / 1e6:.1f} MB: {count} records produced, {got} consumed, "
              f"{dump.captured} packets; tcpdump: {dump.stderr.read_text().strip().splitlines()[-1]}")
        return broker.port


def resegment(src: Path, dst: Path, mss: int) -> None:
    """The same capture as an Ethernet network would carry it: every TCP payload cut into mss-byte segments.

    Loopback hands tcpdump segments of up to 64 KB; a real network's 1500-byte MTU makes
    about 30 times more packets of the same bytes, and per-packet work is what a pcap reader
    pays for. The packets are rebuilt with dpkt (sequence numbers follow the cuts).
    """
    import dpkt

    with open(src, "rb") as f, open(dst, "wb") as g:
        reader = dpkt.pcap.Reader(f)
        writer = dpkt.pcap.Writer(g, snaplen=262144, linktype=reader.datalink())
        for ts, buf in reader:
            eth = dpkt.ethernet.Ethernet(buf)
            ip, tcp = eth.data, eth.data.data
            payload = tcp.data
            if len(payload) <= mss:
                writer.writepkt(buf, ts)
                continue
            for start in range(0, len(payload), mss):
                part = dpkt.tcp.TCP(sport=tcp.sport, dport=tcp.dport, seq=(tcp.seq + start) & 0xFFFFFFFF, ack=tcp.ack,
                                    flags=tcp.flags, win=tcp.win, data=payload[start:start + mss])
                part_ip = dpkt.ip.IP(src=ip.src, dst=ip.dst, p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=part)
                part_ip.len = 20 + len(part)
                frame = dpkt.ethernet.Ethernet(src=eth.src, dst=eth.dst, type=eth.type, data=part_ip)
                writer.writepkt(bytes(frame), ts)


class _Nothing:
    def frame_events(self, flow, direction, offset, time, events, frame):
        pass

    def stream_note(self, flow, direction, item):
        pass

    def flow_closed(self, flow, events):
        pass


def run_dpkt(path: Path, port: int, codec: Codec) -> int:
    with PacketReader(path) as reader:
        for _ in reader.segments():
            pass
        return reader.packets


def run_kinspect(path: Path, port: int, codec: Codec) -> int:
    stats, _ = inspect_pcap(path, codec, InspectConfig(), _Nothing(), [port])
    assert stats.frames and not stats.gaps, stats
    return stats.frames


def run_decode(path: Path, port: int, codec: Codec) -> int:
    with open(os.devnull, "w", encoding="utf-8") as out:
        sink = _JsonSink(codec, out, "time")
        stats, _ = inspect_pcap(path, codec, InspectConfig(), sink, [port])
    assert sink.builder.stats.frames == stats.frames
    return stats.frames


def run_tshark(path: Path, port: int, codec: Codec) -> int:
    result = subprocess.run([shutil.which("tshark") or "tshark", "-r", str(path), "-d", f"tcp.port=={port},kafka",
                             "-T", "fields", "-e", "kafka.correlation_id"], capture_output=True, check=True)
    return result.stdout.count(b"\n")


RUNS = {"dpkt only": run_dpkt, "kinspect": run_kinspect, "decode --pcap": run_decode, "tshark": run_tshark}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=120.0, help="approximate size of the recorded capture")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pcap", type=Path, help="measure this capture instead of recording one")
    parser.add_argument("--port", type=int, help="the broker port of --pcap")
    parser.add_argument("--skip", default="", help="comma-separated runs to leave out (e.g. tshark)")
    parser.add_argument("--mss", type=int, default=1448, help="segment size of the resegmented copy (0: none)")
    args = parser.parse_args()
    codec = Codec()
    with tempfile.TemporaryDirectory(prefix="bench-pcap-") as tmp:
        path, port = args.pcap, args.port
        if path is None:
            path = Path(tmp) / "kafka.pcap"
            port = record(path, args.mb)
        files = {"loopback, as recorded": path}
        if args.mss:
            files[f"resegmented to MSS {args.mss}"] = Path(tmp) / "kafka-mss.pcap"
            resegment(path, files[f"resegmented to MSS {args.mss}"], args.mss)
        runs = {name: fn for name, fn in RUNS.items() if name not in args.skip.split(",")}
        for label, pcap in files.items():
            measure(label, pcap, port, codec, runs, args.reps)


def measure(label: str, path: Path, port: int, codec: Codec, runs: dict, reps: int) -> None:
    mb = path.stat().st_size / 1e6
    packets = run_dpkt(path, port, codec)
    walls: dict = {name: [] for name in runs}
    cpus: dict = {name: [] for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():  # interleaved, so drift hits all alike
            children = name == "tshark"
            c0, t0 = cpu_seconds(children), time.perf_counter()
            fn(path, port, codec)
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(cpu_seconds(children) - c0)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\n{label}: {mb:.1f} MB of pcap, {packets} packets ({mb * 1e6 / packets:,.0f} bytes each on average), "
          f"{reps} reps, medians (load average {load} on {os.cpu_count()} cores):")
    base = statistics.median(walls["kinspect"])
    for name in runs:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        spread = f"{min(walls[name]):.2f}-{max(walls[name]):.2f} s"
        per_cpu = f"{mb / cpu:8.1f}" if cpu > 0 else "     inf"
        print(f"  {name:14s} {mb / wall:8.1f} MB/s  {per_cpu} MB/CPU-s  {cpu / mb * 1000:7.2f} CPU ms/MB  "
              f"{packets / wall / 1000:7.1f} k packets/s  ({wall / base:5.2f}x kinspect's time; wall {spread})")

if __name__ == "__main__":
    main()
