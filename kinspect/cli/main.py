"""Entry point of the `kinspect` command: parses arguments and runs a subcommand.

Commands are imported lazily: only the one being run is, so a base install (without the
pipeline or demo extras) still runs `kinspect --help`, `decode`, `specs` and `proxy`, and a
command that needs a missing extra says in one line how to install it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kinspect import __version__

# name -> (module, one-line help, extras the command cannot run without)
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "specs": ("kinspect.cli.specs_command", "import, list and show message specs", ()),
    "decode": ("kinspect.cli.decode_command", "decode recorded Kafka traffic (a connection, or a pcap) to JSON Lines", ()),
    "proxy": ("kinspect.cli.proxy_command", "run the sidecar proxy", ()),
    "clients": ("kinspect.cli.clients_command",
                "the client inventory (software, versions, addresses) and what a broker upgrade would reject", ()),
    "capture": ("kinspect.cli.capture_command", "write a pcap file's Kafka exchanges as Parquet captures", ()),
    "analyze": ("kinspect.cli.analyze_command", "analyze capture files with PySpark: tables and an HTML report",
                ("pipeline",)),
    "capture": ("kinspect.cli.capture_command",
                "write the Kafka exchanges of a tcpdump capture as Parquet capture files", ("proxy",)),
    # demo checks its own packages: --no-workload needs fewer
    "demo": ("kinspect.cli.demo_command",
             "run a broker with kinspect in front of it and a sample workload; print what kinspect saw", ()),
}


class _MissingExtra(Exception):
    """A command module could not be imported because a package of an extra is missing."""

    def __init__(self, command: str, module: str) -> None:
        super().__init__(command, module)
        self.command, self.module = command, module


def _load(name: str):
    try:
        return importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        from kinspect.cli.common import MODULE_EXTRA

        if exc.name and exc.name.split(".")[0] in MODULE_EXTRA:
            raise _MissingExtra(name, exc.name.split(".")[0]) from None
        raise


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (only=NAME) one with NAME's options and the others by name and help."""
    parser = argparse.ArgumentParser(prog="kinspect", description="Kafka protocol inspector")
    parser.add_argument("--version", action="version", version=f"kinspect {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text, _) in COMMANDS.items():
        if only is None or name == only:
            _load(name).add_parser(commands)
        else:
            commands.add_parser(name, help=help_text)
    return parser


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line (its first word that is not an option), if any."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def _extras_needed(args: argparse.Namespace) -> tuple[str, ...]:
    """The extras this run needs: the command's own, and the proxy extra (pyarrow) when the proxy captures."""
    extras = COMMANDS[args.command][2]
    if args.command == "proxy":
        from kinspect.config import load_config

        # Capture writes Parquet from a thread: without pyarrow it would fail only at the first row.
        if getattr(args, "capture_dir", None) is not None or load_config(args.config).capture.enabled:
            extras += ("proxy",)
    return extras


# Commands that write capture files and never run the pipeline: run as the `kinspect` command, their process bars
# pandas, which pyarrow would import for nothing (capture.barred_imports). Not when main() is called with arguments
# from another program (a test's process), whose pandas is its own.
WITHOUT_PANDAS = frozenset({"proxy", "capture"})


def main(argv: list[str] | None = None) -> int:
    from kinspect.cli.common import MODULE_EXTRA, missing_extra_message, missing_modules, native_codec_notice

    own_process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _chosen(argv)
    try:
        args = build_parser(only=command or "").parse_args(argv)
    except _MissingExtra as exc:
        extra = MODULE_EXTRA[exc.module]
        print(missing_extra_message(exc.command, (extra,), [exc.module]), file=sys.stderr)
        return 2
    from kinspect.config import ConfigError
    from kinspect.protocol.errors import SpecError

    try:
        extras = _extras_needed(args)
        missing = missing_modules(*extras)
        if missing:
            print(missing_extra_message(args.command, extras, missing), file=sys.stderr)
            return 2
        if own_process and args.command in WITHOUT_PANDAS:
            from kinspect.capture.barred_imports import bar_pandas

            bar_pandas()
        notice = native_codec_notice()
        if notice:
            print(notice, file=sys.stderr)
        return args.run(args)
    except (SpecError, ConfigError) as exc:
        print(f"kinspect: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        if module not in MODULE_EXTRA:
            raise
        print(missing_extra_message(args.command, (MODULE_EXTRA[module],), [module]), file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
