"""`kinspect capture --pcap FILE --out DIR`: a tcpdump capture to the proxy's Parquet capture files."""

from __future__ import annotations

import argparse
from pathlib import Path

from kinspect.cli.common import add_spec_options, codec_from_args


def add_parser(commands) -> None:
    p = commands.add_parser(
        "capture", help="write the Kafka exchanges of a tcpdump capture as Parquet capture files",
        description="Reads a pcap or pcapng file, reassembles each Kafka TCP flow and writes every exchange in "
        "the capture schema the proxy writes (kinspect analyze reads it). Times are the packets' times.",
    )
    p.add_argument("--pcap", type=Path, required=True, metavar="FILE", help="capture file (pcap or pcapng)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory for the Parquet files")
    p.add_argument("--port", type=int, action="append", default=[], metavar="P",
                   help="a broker port (repeatable); only flows on these ports are read")
    add_spec_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinspect.pcap.capture_run import run as run_pcap

    return run_pcap(args, codec_from_args(args))
