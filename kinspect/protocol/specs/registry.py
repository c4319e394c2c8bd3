"""The set of message specs in force: built-in layers plus user directories, later layers winning.

A layer is a directory of message definitions. For each (api key, request|response,
version) the definition comes from the last layer whose validVersions include that
version, so Kafka 4.3.1 wins over 3.9.2 where both define a version and 3.9.2 still
serves the versions 4.x removed; user directories extend or override both.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kinspect.protocol.errors import SpecError
from kinspect.protocol.specs.json_format import load_spec_file
from kinspect.protocol.specs.model import MessageSpec, parse_message
from kinspect.protocol.specs.versions import VersionRange

INDEX_FILE = "index.json"
INDEX_FORMAT = 1


@dataclass(frozen=True)
class SpecLayer:
    """One directory of definitions, with the name it is known by."""

    name: str
    messages: tuple[MessageSpec, ...]
    path: str = ""


def load_directory(path: Path, name: str | None = None) -> SpecLayer:
    """Load every *.json definition of a directory (Apache format, comments allowed)."""
    path = Path(path)
    if not path.is_dir():
        raise SpecError(f"{path}: not a directory of message definitions")
    messages = []
    for file in sorted(path.glob("*.json")):
        if file.name == INDEX_FILE:
            continue
        messages.append(parse_message(load_spec_file(file), str(file)))
    if not messages:
        raise SpecError(f"{path}: holds no *.json message definitions")
    return SpecLayer(name or path.name, tuple(messages), str(path))


def builtin_specs_dir() -> Path:
    """Where the project's own specs/ are: inside the installed package, or the source tree."""
    try:
        # kinspect.specs is a namespace package (no __init__.py): ask for a file inside it,
        # whose path is real for both installed and editable packages.
        index = resources.files("kinspect.specs").joinpath(INDEX_FILE)
        if index.is_file():
            return Path(str(index)).parent
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    candidate = Path(__file__).resolve().parents[3] / "specs"
    if (candidate / INDEX_FILE).is_file():
        return candidate
    raise SpecError("the built-in specs/ directory (with index.json) was not found")


def load_builtin_layers(specs_dir: Path | None = None) -> list[SpecLayer]:
    """The built-in layers listed in specs/index.json, oldest release first.

    The layers are immutable, so a process parses each directory once: every Codec and registry
    made later shares them (a test run made 14 in one process, 2 s of parsing).
    """
    specs_dir = Path(specs_dir).resolve() if specs_dir else builtin_specs_dir().resolve()
    try:
        stat = (specs_dir / INDEX_FILE).stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None  # _load_layers says what is missing
    return list(_load_layers(specs_dir, stamp))


@functools.lru_cache(maxsize=8)
def _load_layers(specs_dir: Path, index_stamp: tuple[int, int] | None) -> tuple[SpecLayer, ...]:
    """The layers of `specs_dir`, parsed; remembered per directory and version of its index file."""
    try:
        index = json.loads((specs_dir / INDEX_FILE).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{specs_dir / INDEX_FILE}: {exc}") from None
    if index.get("format") != INDEX_FORMAT:
        raise SpecError(f"{specs_dir / INDEX_FILE}: unknown format {index.get('format')!r}")
    return tuple(load_directory(specs_dir / layer["directory"], layer["release"]) for layer in index["layers"])


class SpecRegistry:
    """Resolves (api key, direction, version) and header versions to message specs."""

    def __init__(self, layers: list[SpecLayer]) -> None:
        self.layers = list(layers)
        # (kind, api_key or header name) -> [(VersionRange, MessageSpec, layer name)], newest layer last
        self._entries: dict[tuple[str, object], list[tuple[VersionRange, MessageSpec, str]]] = {}
        self._names: dict[int, str] = {}
        for layer in self.layers:
            for msg in layer.messages:
                if msg.kind in ("request", "response"):
                    key = (msg.kind, msg.api_key)
                    if not msg.valid_versions.empty:
                        self._names[msg.api_key] = _api_name(msg.name, msg.kind)
                elif msg.kind == "header":
                    key = ("header", msg.name)
                else:
                    key = ("data", msg.name)
                self._entries.setdefault(key, []).append((msg.valid_versions, msg, layer.name))
        self._cache: dict = {}

    @classmethod
    def default(cls, extra_dirs: list[Path | str] = ()) -> "SpecRegistry":
        """Built-in specs, then each extra directory in order (later ones win)."""
        layers = load_builtin_layers()
        layers.extend(load_directory(Path(d)) for d in extra_dirs)
        return cls(layers)

    def _resolve(self, key: tuple[str, object], version: int) -> tuple[MessageSpec, str] | None:
        cache_key = (key, version)
        hit = self._cache.get(cache_key)
        if hit is None and cache_key not in self._cache:
            for versions, msg, layer in reversed(self._entries.get(key, ())):
                if version in versions:
                    hit = (msg, layer)
                    break
            self._cache[cache_key] = hit
        return hit

    def message(self, api_key: int, direction: str, version: int) -> MessageSpec | None:
        """The request or response definition of one api version, or None."""
        hit = self._resolve((direction, api_key), version)
        return hit[0] if hit else None

    def layer_of(self, api_key: int, direction: str, version: int) -> str | None:
        hit = self._resolve((direction, api_key), version)
        return hit[1] if hit else None

    def header(self, name: str, version: int) -> MessageSpec | None:
        hit = self._resolve(("header", name), version)
        return hit[0] if hit else None

    def api_name(self, api_key: int) -> str | None:
        return self._names.get(api_key)

    def api_keys(self) -> list[int]:
        return sorted(self._names)

    def api_key_of(self, name: str) -> int | None:
        """Look an api up by name ("Produce", "ProduceRequest") or by number."""
        if name.isdigit():
            return int(name) if int(name) in self._names else None
        wanted = name.lower().removesuffix("request").removesuffix("response")
        for key, api in self._names.items():
            if api.lower() == wanted:
                return key
        return None

    def versions(self, api_key: int, direction: str) -> list[int]:
        """Every version of an api in this direction that some layer defines."""
        found: set[int] = set()
        for versions, _, _ in self._entries.get((direction, api_key), ()):
            if not versions.empty:
                found.update(range(versions.low, min(versions.high, versions.low + 4096) + 1))
        return sorted(found)

    def data_specs(self) -> list[MessageSpec]:
        return [entries[-1][1] for (kind, _), entries in self._entries.items() if kind == "data"]


def _api_name(message_name: str, kind: str) -> str:
    suffix = "Request" if kind == "request" else "Response"
    return message_name[: -len(suffix)] if message_name.endswith(suffix) else message_name


def version_spans(versions: list[int]) -> str:
    """Render a sorted list of versions as ranges: [0,1,2,5] -> "0-2, 5"."""
    spans = []
    for v in versions:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
