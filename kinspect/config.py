"""kinspect's configuration: a TOML file checked key by key, with errors that name the key."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A configuration file or value that is not valid; names the key."""


@dataclass
class SpecsConfig:
    # Directories of extra message definitions (Apache JSON format); later ones win.
    directories: list[str] = field(default_factory=list)


@dataclass
class Config:
    specs: SpecsConfig = field(default_factory=SpecsConfig)


_SECTIONS = {"specs": SpecsConfig}


def _check(section: str, key: str, value, expected) -> None:
    if expected == "list[str]":
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f"{section}.{key} must be a list of strings, not {value!r}")


def load_config(path: str | Path | None) -> Config:
    """Read a config file (None gives the defaults); unknown sections or keys are errors."""
    config = Config()
    if path is None:
        return config
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for section, values in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}] (known: {', '.join(sorted(_SECTIONS))})")
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section} must be a table")
        target = getattr(config, section)
        known = target.__dataclass_fields__
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{path}: unknown key {section}.{key} (known: {', '.join(sorted(known))})")
            _check(section, key, value, known[key].type)
            if section == "specs" and key == "directories":
                # Relative directories are relative to the config file.
                value = [str((path.parent / v).resolve()) if not Path(v).is_absolute() else v for v in value]
            setattr(target, key, value)
    return config
