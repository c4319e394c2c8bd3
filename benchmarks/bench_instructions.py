"""Instructions a small exchange costs the proxy's user space, counted by callgrind: steady under any load.

Usage: python benchmarks/bench_instructions.py [--trees TREE,...] [--workloads apiversions,produce]
                                               [--exchanges N] [--warm N]

On a shared 2-core machine the proxy's CPU a request moves by 10-30% from run to run, so a change worth
a few percent cannot be seen in bench_proxy.py. This benchmark runs a model of the proxy in-process:
8 relays of the default app (metrics and inventory on, batches of 16 reads), whose transports take the
writes and do nothing. Each exchange is a request read and its response read: forwarded, queued,
framed, turned into events and observed. The model runs under `valgrind --tool=callgrind` twice, with
`warm` and with `warm + exchanges` exchanges (after 400 of warm-up). The difference, over `exchanges`,
is the instructions an exchange costs. That leaves out start-up, the kernel and uvloop's own reads. With
PYTHONHASHSEED=0, runs of one tree agree within 0.1%.

--trees: kinspect source trees to compare (each with its C extensions built in place: `python setup.py
build_ext --inplace`); the first is the reference of the ratios. Default: this checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 400  # exchanges before the counted ones (plans, memos and caches made)
RELAYS = 8


def _model(tree: str, workload: str, exchanges: int) -> None:
    """The proxy model: WARM_UP + exchanges exchanges through RELAYS relays, then the last batch inspected."""
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
        for i in range(total):
            relay = relays[i % RELAYS]
            relay.client.data_received(requests[i])
            relay.broker.data_received(responses[i])
        server.inspection_queue.flush()

    uvloop.new_event_loop().run_until_complete(run())


def _instructions(tree: str, workload: str, exchanges: int) -> int:
    """The instructions callgrind counts for the whole model run."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
           "--model", tree, workload, str(exchanges)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"the model failed under callgrind ({tree}, {workload}): {result.stderr[-2000:]}")
    for line in result.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1].strip())
    raise SystemExit(f"callgrind gave no count ({tree}, {workload}): {result.stderr[-2000:]}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--model":
        _model(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", default=str(ROOT), help="kinspect source trees, comma-separated (default: this one)")
    p.add_argument("--workloads", default="apiversions,produce", help="apiversions and/or produce")
    p.add_argument("--exchanges", type=int, default=2000, help="exchanges counted (default 2000)")
    p.add_argument("--warm", type=int, default=500, help="exchanges of the shorter run, subtracted (default 500)")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
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
    print(f"instructions an exchange (callgrind; {RELAYS} relays, default app, {args.exchanges} exchanges counted "
          f"after {WARM_UP + args.warm}; PYTHONHASHSEED=0)")
    print(f"{'workload':<12} {'tree':<40} {'instructions':>13} {'x first':>8}")
    for w in workloads:
        first = None
        for tree in trees:
            short = _instructions(tree, w, args.warm)
            long = _instructions(tree, w, args.warm + args.exchanges)
            each = (long - short) / args.exchanges
            if each <= 0:
                raise SystemExit(f"{w}, {tree}: the longer run counted no more than the shorter; count more exchanges")
            first = first or each
            print(f"{w:<12} {tree[-40:]:<40} {each:>13,.0f} {each / first:>7.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
