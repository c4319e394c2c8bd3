"""Entry point of the `kinspect` command: parses arguments and runs a subcommand."""

from __future__ import annotations

import argparse
import sys

from kinspect import __version__
from kinspect.cli import analyze_command, capture_command, decode_command, demo_command, proxy_command, specs_command
from kinspect.config import ConfigError
from kinspect.protocol.errors import SpecError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinspect", description="Kafka protocol inspector")
    parser.add_argument("--version", action="version", version=f"kinspect {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    specs_command.add_parser(commands)
    decode_command.add_parser(commands)
    proxy_command.add_parser(commands)
    analyze_command.add_parser(commands)
    demo_command.add_parser(commands)
    capture_command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (SpecError, ConfigError) as exc:
        print(f"kinspect: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
