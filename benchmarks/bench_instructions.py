"""Instructions and cache misses a small exchange costs the proxy's user space, counted by callgrind: steady under load.

Usage: python benchmarks/bench_instructions.py [--trees TREE,...] [--workloads apiversions,produce]
                                               [--exchanges N] [--warm N] [--cold]

On a shared 2-core machine the proxy's CPU a request moves by 10-30% from run to run, so a change worth
a few percent cannot be seen in bench_proxy.py. This benchmark runs a model of the proxy in-process:
8 relays of the default app (metrics and inventory on; batches of 16 reads, whatever the proxy's
default, so that figures compare across trees and days), whose transports take the writes and do nothing.
Each exchange is a request read and its response read: forwarded, queued, framed, turned into events and
observed. The model runs under `valgrind --tool=callgrind` twice, with
`warm` and with `warm + exchanges` exchanges, each counted from the end of its start (imports, the app,
the frames to feed, 400 exchanges of warm-up), when callgrind_control switches callgrind's instruments
on. The difference, over `exchanges`, is what an exchange costs. That leaves out start-up, the kernel
and uvloop's own reads. With PYTHONHASHSEED=0, runs of one tree agree within 0.1%. (Until 2026-11-29
the runs were counted whole, which also counted the model's making of each exchange's frames: about
4,400 instructions an exchange more.)

--cold: what the live proxy pays most for. Live, the broker and the clients run between the proxy's
batches and take its caches, so a batch's code and data come back from memory, not from the core's
L2. Here callgrind simulates the caches (its last level set to this machine's L2) and, before each
batch of 16 reads, the model reads a buffer half again the L2's size, one byte a cache line (an
array's strided slice; callgrind does not count inside array_subscr, which the proxy never calls).
The output adds, per exchange, the L1 misses and the L2 misses of code and data. On 2026-11-29 an
ApiVersions exchange cost 31,216 instructions, 946 L1 code misses and 298 L2 misses (27,920, 764 and
289 after that day's changes): at the 30-100 ns an L2 miss costs, the misses weigh as much as the
instructions. Live caches are not emptied as fully between batches, so this is an upper bound
(docs/performance.md, "Cache misses counted").

--trees: kinspect source trees to compare (each with its C extensions built in place: `python setup.py
build_ext --inplace`); the first is the reference of the ratios. Default: this checkout.
"""

from __future__ import annotations

import argparse
import array
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 400  # exchanges before the counted ones (plans, memos and caches made)
RELAYS = 8
BATCH_READS = 2 * RELAYS  # a batch: one exchange (two reads) of each relay, and the walk of --cold before it
CACHE_LINE = 64


def _model(tree: str, workload: str, exchanges: int, walk: int = 0, gate: str = "") -> None:
    """The proxy model: WARM_UP + exchanges exchanges through RELAYS relays, then the last batch inspected;
    with `walk`, that many bytes read (one a cache line) before each batch's first read. With `gate`, after
    the warm-up it makes the file gate + ".ready" and waits for gate + ".go" (callgrind's instruments are
    switched on meanwhile), and after the last batch it ends the process at once."""
    sys.path.insert(0, tree)
    sys.path.insert(1, str(ROOT / "benchmarks"))
    import uvloop

    import small_requests
    from kinspect.app import build_app
    from kinspect.config import load_config
    from kinspect.proxy.relay import Relay
    from kinspect.session import ConnectionInfo, Session

    class Sink:
        """A transport that takes every write."""

        __slots__ = ()
        write = staticmethod(len)
        is_closing = staticmethod(bool)
        get_write_buffer_size = staticmethod(int)

    async def run() -> None:
        app = build_app(load_config(None, {"proxy.upstream": "127.0.0.1:1"}))
        server, codec = app.server, app.server.codec
        server.inspection_queue.max_reads = BATCH_READS
        relays = []
        for n in range(RELAYS):
            session = Session(codec, ConnectionInfo(n, "c:1", "b:1"), server.session_config, server.plan)
            relay = Relay(server, session, server.dispatcher, [])
            relay.client.transport, relay.broker.transport, relay._early = Sink(), Sink(), None
            relays.append(relay)
        if workload == "produce":
            partition = {"Index": 0, "ErrorCode": 0, "BaseOffset": 5, "LogAppendTimeMs": -1, "LogStartOffset": 0,
                         "RecordErrors": [], "ErrorMessage": None}
            response = codec.encode_response(0, 9, {"CorrelationId": 0}, {
                "Responses": [{"Name": "t", "PartitionResponses": [partition]}], "ThrottleTimeMs": 0})
        else:
            response = codec.encode_response(18, 3, {"CorrelationId": 0}, {"ErrorCode": 0, "ApiKeys": [
                {"ApiKey": k, "MinVersion": 0, "MaxVersion": 9} for k in range(60)], "ThrottleTimeMs": 0})
        total = WARM_UP + exchanges
        requests = small_requests.workloads(codec, "t", "f")[workload].frames(0, total)
        # encode_response gives the frame after its size prefix; each response answers its request's correlation id
        responses = [struct.pack(">ii", len(response), i) + response[4:] for i in range(total)]
        walked = array.array("B", bytes(walk))

        def feed(first: int, last: int) -> None:
            for i in range(first, last):
                relay = relays[i % RELAYS]
                if walk and 2 * i % BATCH_READS == 0:  # what the other processes do to the caches between batches
                    walked[::CACHE_LINE]
                relay.client.data_received(requests[i])
                relay.broker.data_received(responses[i])

        feed(0, WARM_UP)
        if gate:
            Path(gate + ".ready").touch()
            while not os.path.exists(gate + ".go"):  # polled: the instruments come on within a few polls
                time.sleep(0.005)
        feed(WARM_UP, total)
        server.inspection_queue.flush()

    uvloop.new_event_loop().run_until_complete(run())
    if gate:
        os._exit(0)  # the interpreter's shutdown, instrumented, would only cost time


def _l2() -> tuple[int, int, int]:
    """This machine's L2: size, ways, line (glibc's sysconf names; 2 MiB, 16, 64 where it does not say)."""
    names = ("SC_LEVEL2_CACHE_SIZE", "SC_LEVEL2_CACHE_ASSOC", "SC_LEVEL2_CACHE_LINESIZE")
    try:
        found = tuple(os.sysconf(n) for n in names)
    except (ValueError, OSError):
        found = (0, 0, 0)
    return found if all(v > 0 for v in found) else (2 << 20, 16, CACHE_LINE)


def _counts(tree: str, workload: str, exchanges: int, cold: bool) -> dict[str, int]:
    """What callgrind counts for the model run past its warm-up: instructions, and with `cold` the cache misses.

    The start (imports, specs, the app, the warm-up) runs with callgrind's instruments off, which is most of
    a run's time under them; callgrind_control switches them on when the model says it is ready."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--instr-atstart=no"]
    walk = 0
    if cold:
        size, ways, line = _l2()
        walk = size * 3 // 2
        # the walk (an array's strided slice) is simulated, so it evicts, but not counted
        cmd += ["--cache-sim=yes", f"--LL={size},{ways},{line}", "--toggle-collect=*array_subscr",
                "--collect-atstart=yes"]
    with tempfile.TemporaryDirectory() as gates:
        gate = os.path.join(gates, "gate")
        cmd += [sys.executable, __file__, "--model", tree, workload, str(exchanges), str(walk), gate]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as model:
            deadline = time.monotonic() + 1800
            while not os.path.exists(gate + ".ready") and model.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if os.path.exists(gate + ".ready"):
                switched = subprocess.run(["callgrind_control", "-i", "on", str(model.pid)], capture_output=True,
                                          text=True, timeout=120)
                if switched.returncode != 0:
                    model.kill()
                    raise SystemExit(f"callgrind_control could not switch the instruments on: {switched.stderr}")
                Path(gate + ".go").touch()
            else:
                model.kill()
            _, stderr = model.communicate(timeout=max(1.0, deadline - time.monotonic()))
    if model.returncode != 0:
        raise SystemExit(f"the model failed under callgrind ({tree}, {workload}): {stderr[-2000:]}")
    names = values = None
    for line in stderr.splitlines():
        if "Events    :" in line:
            names = line.split(":", 1)[1].split()
        if "Collected :" in line:
            values = [int(v) for v in line.split(":", 1)[1].split()]
    if names is None or values is None or len(names) != len(values):
        raise SystemExit(f"callgrind gave no count ({tree}, {workload}): {stderr[-2000:]}")
    return dict(zip(names, values))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--model":
        _model(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0,
               sys.argv[6] if len(sys.argv) > 6 else "")
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", default=str(ROOT), help="kinspect source trees, comma-separated (default: this one)")
    p.add_argument("--workloads", default="apiversions,produce", help="apiversions and/or produce")
    p.add_argument("--exchanges", type=int, default=2000, help="exchanges counted (default 2000)")
    p.add_argument("--warm", type=int, default=500, help="exchanges of the shorter run, subtracted (default 500)")
    p.add_argument("--cold", action="store_true",
                   help="the caches taken before each batch: count L1 and L2 misses too (slower)")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is missing: install Debian's valgrind package (as root: apt-get install valgrind)")
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in ("apiversions", "produce"):
            raise SystemExit(f"--workloads: apiversions or produce, not {w!r}")
    for tree in trees:  # once outside callgrind: what a first run does (bytecode written) is not counted
        for w in workloads:
            subprocess.run([sys.executable, __file__, "--model", tree, w, "1"], check=True, capture_output=True,
                           env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=600)
    what = "instructions and cache misses" if args.cold else "instructions"
    print(f"{what} an exchange (callgrind; {RELAYS} relays, default app, {args.exchanges} exchanges counted "
          f"after {WARM_UP + args.warm}; PYTHONHASHSEED=0)")
    if args.cold:
        size, ways, line = _l2()
        print(f"  cold: before each batch of {2 * RELAYS} reads, {size * 3 // 2 >> 10} KiB read; caches simulated: "
              f"L1 as callgrind finds them, L2 {size >> 10} KiB {ways}-way as the last level")
        print(f"{'workload':<12} {'tree':<40} {'instructions':>13} {'L1 misses code/data':>20} "
              f"{'L2 misses code/data':>20} {'L2 misses':>9} {'x first':>8}")
    else:
        print(f"{'workload':<12} {'tree':<40} {'instructions':>13} {'x first':>8}")
    for w in workloads:
        first = None
        for tree in trees:
            # the two runs at once: each is one process on one core, and counts do not depend on the load
            with ThreadPoolExecutor(2) as pool:
                runs = (args.warm, args.warm + args.exchanges)
                short, long = pool.map(lambda n: _counts(tree, w, n, args.cold), runs)
            each = {k: (long[k] - short[k]) / args.exchanges for k in long}
            if each["Ir"] <= 0:
                raise SystemExit(f"{w}, {tree}: the longer run counted no more than the shorter; count more exchanges")
            if args.cold:
                l1 = (each["I1mr"], each["D1mr"] + each["D1mw"])
                l2 = (each["ILmr"], each["DLmr"] + each["DLmw"])
                key = sum(l2)
                first = first or key
                print(f"{w:<12} {tree[-40:]:<40} {each['Ir']:>13,.0f} {f'{l1[0]:,.0f} / {l1[1]:,.0f}':>20} "
                      f"{f'{l2[0]:,.0f} / {l2[1]:,.0f}':>20} {key:>9,.0f} {key / first:>7.3f}x", flush=True)
            else:
                first = first or each["Ir"]
                print(f"{w:<12} {tree[-40:]:<40} {each['Ir']:>13,.0f} {each['Ir'] / first:>7.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
