"""Options shared by subcommands: the config file and extra spec directories."""

from __future__ import annotations

import argparse

from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.protocol.spec_registry import SpecRegistry


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kinspect TOML config file (its [specs] directories are loaded)")
    parser.add_argument(
        "--spec-dir", action="append", default=[], metavar="DIR",
        help="extra directory of message definitions; extends or overrides the built-in specs (repeatable)",
    )


def registry_from_args(args: argparse.Namespace) -> SpecRegistry:
    config = load_config(args.config)
    return SpecRegistry.default(config.specs.directories + list(args.spec_dir))


def codec_from_args(args: argparse.Namespace) -> Codec:
    return Codec(registry_from_args(args))
