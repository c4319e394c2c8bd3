"""`kinspect decode REQUESTS [RESPONSES] [--roundtrip]` (a recorded connection) or `--pcap FILE`: JSON Lines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kinspect.cli.common import add_spec_options, codec_from_args
from kinspect.offline_decode import DecodeStats, decode_conversation


def add_parser(commands) -> None:
    p = commands.add_parser(
        "decode", help="decode recorded Kafka traffic (a connection, or a pcap) to JSON Lines",
        description="REQUESTS holds the client-to-broker bytes of one connection as they crossed the socket "
        "(4-byte size-prefixed frames); RESPONSES the broker-to-client bytes of the same connection.",
    )
    p.add_argument("requests", type=Path, nargs="?")
    p.add_argument("responses", type=Path, nargs="?")
    p.add_argument("--pcap", type=Path, metavar="FILE",
                   help="decode every Kafka TCP flow of a tcpdump capture (pcap or pcapng) instead (docs/pcap.md)")
    p.add_argument("--port", type=int, action="append", default=[], metavar="P",
                   help="with --pcap: a broker port (repeatable); only flows on these ports are read")
    p.add_argument("--by", choices=("flow", "time"), default="flow",
                   help="with --pcap: records flow after flow (default) or interleaved by packet time")
    p.add_argument("--roundtrip", action="store_true", help="re-encode every frame and report any that differ")
    p.add_argument("--output", "-o", type=Path, help="write JSON Lines here instead of standard output")
    add_spec_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if (args.pcap is None) == (args.requests is None):
        print("kinspect: decode takes REQUESTS [RESPONSES] or --pcap FILE (one of them)", file=sys.stderr)
        return 2
    codec = codec_from_args(args)
    if args.pcap is not None:
        from kinspect.pcap.decode_run import run as run_pcap

        return run_pcap(args, codec)
    try:
        requests = args.requests.read_bytes()
        responses = args.responses.read_bytes() if args.responses else None
    except OSError as exc:
        print(f"kinspect: {exc.filename}: cannot read: {exc.strerror}", file=sys.stderr)
        return 2
    stats = DecodeStats()
    try:
        out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    except OSError as exc:
        print(f"kinspect: --output {args.output}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        for record in decode_conversation(codec, requests, responses, roundtrip=args.roundtrip, stats=stats):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        if args.output:
            out.close()
    for problem in stats.errors:
        print(f"kinspect: {problem['direction']}s: {problem['error']}", file=sys.stderr)
    summary = f"{stats.frames} frames, {stats.decode_errors} failed to decode"
    if args.roundtrip:
        summary += f", {stats.roundtrip_mismatches} re-encoded differently"
    print(f"kinspect: {summary}", file=sys.stderr)
    return 0 if stats.ok else 1
