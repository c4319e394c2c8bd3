"""Upgrade targets: what a broker release accepts, read from its message specs, and what it would reject.

A target is one layer of specs on its own (not layered over older releases): the
shipped releases in specs/ (3.9.2, 4.3.1) by name, or a user's spec directory, named
by its path or by its directory name when it is one of `spec_dirs`. An api version is
accepted when the release's request definition lists it in validVersions; magic 0/1
record batches are rejected once the release's lowest Produce version is 3 or more
(KIP-724 and KIP-896 removed them together with Produce v0-v2 in Kafka 4.0).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from kinspect.protocol.errors import SpecError
from kinspect.protocol.specs.registry import INDEX_FILE, SpecLayer, builtin_specs_dir, load_directory

PRODUCE = 0
API_REMOVED = "api removed"
VERSION_REMOVED = "api version removed"
VERSION_TOO_NEW = "api version too new"
MAGIC_REMOVED = "record format v0/v1 removed"


@dataclass(frozen=True)
class Target:
    """One broker release, as the request versions it accepts and the oldest record format it takes."""

    name: str
    accepted: dict[int, tuple[int, int]]  # api key -> (min, max) request version
    min_record_magic: int  # 2: magic 0/1 batches are rejected; 0: every format is taken
    api_names: dict[int, str] = field(default_factory=dict, compare=False)


def target_from_layer(layer: SpecLayer) -> Target:
    accepted: dict[int, tuple[int, int]] = {}
    names: dict[int, str] = {}
    for msg in layer.messages:
        if msg.kind != "request" or msg.api_key is None or msg.valid_versions.empty:
            continue
        accepted[msg.api_key] = (msg.valid_versions.low, msg.valid_versions.high)
        names[msg.api_key] = msg.name.removesuffix("Request")
    produce = accepted.get(PRODUCE)
    min_magic = 2 if produce is not None and produce[0] >= 3 else 0
    return Target(layer.name, accepted, min_magic, names)


def builtin_releases(specs_dir: Path | None = None) -> dict[str, Path]:
    """Release name -> directory of the built-in spec layers (specs/index.json)."""
    specs_dir = Path(specs_dir) if specs_dir else builtin_specs_dir()
    try:
        index = json.loads((specs_dir / INDEX_FILE).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{specs_dir / INDEX_FILE}: {exc}") from None
    return {layer["release"]: specs_dir / layer["directory"] for layer in index.get("layers", ())}


@functools.lru_cache(maxsize=32)
def _load(release: str, spec_dirs: tuple[str, ...]) -> Target:
    builtin = builtin_releases()
    if release in builtin:
        return target_from_layer(load_directory(builtin[release], release))
    for directory in spec_dirs:
        path = Path(directory)
        if release in (str(directory), path.name) or (Path(release).is_dir() and Path(release).resolve() == path.resolve()):
            return target_from_layer(load_directory(path))
    if Path(release).is_dir():
        return target_from_layer(load_directory(Path(release)))
    known = ", ".join([*builtin, *(Path(d).name for d in spec_dirs)])
    raise SpecError(f"unknown upgrade target {release!r}: not a shipped release or a spec directory (known: {known})")


def load_target(release: str, spec_dirs: list = ()) -> Target:
    """The target named `release`: a shipped release, or a spec directory (by path, or by name among spec_dirs)."""
    return _load(str(release), tuple(str(d) for d in spec_dirs))


def incompatible(target: Target, api_key: int, version: int, magics=()) -> str | None:
    """None if `target` accepts the request, else a short reason why it would reject it."""
    span = target.accepted.get(api_key)
    if span is None:
        return API_REMOVED
    if version < span[0]:
        return VERSION_REMOVED
    if version > span[1]:
        return VERSION_TOO_NEW
    if api_key == PRODUCE and magics and min(magics) < target.min_record_magic:
        return MAGIC_REMOVED
    return None


__all__ = ["Target", "builtin_releases", "incompatible", "load_target", "target_from_layer"]
