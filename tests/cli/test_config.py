"""The configuration: config/kinspect.toml documents every key, and bad keys or values are named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kinspect.config import ConfigError, config_keys, load_config
from tests.support.paths import ROOT

EXAMPLE = ROOT / "config" / "kinspect.toml"


def _example_keys() -> set[str]:
    keys, section = set(), ""
    for line in EXAMPLE.read_text().splitlines():
        if m := re.match(r"^\[([a-z_.]+)\]$", line):
            section = m.group(1)
        elif m := re.match(r"^([a-z_]+) = ", line):
            keys.add(f"{section}.{m.group(1)}")
    return keys


def test_the_example_shows_every_key_and_nothing_else():
    assert _example_keys() == set(config_keys())


def test_the_example_loads_with_the_defaults():
    config = load_config(EXAMPLE)
    loaded, defaults = config_keys(config), config_keys()
    for key, value in defaults.items():
        if key == "proxy.upstream":
            continue  # the example names a broker; the default is none
        if key.startswith("tls.") and key.split(".")[-1] in ("ca_file", "cert_file", "key_file", "server_hostname"):
            assert loaded[key] is None
            continue
        if key == "capture.directory":  # relative to the file, like the tls paths
            assert loaded[key] == str(EXAMPLE.parent / value)
            continue
        assert loaded[key] == value, key


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[proxy]\nlisten_port = 1\n", "unknown key proxy.listen_port"),
        ("[proxxy]\n", "unknown section proxxy"),
        ("[proxy]\nmode = \"mirror\"\n", "proxy.mode must be one of passthrough, rewrite"),
        ("[inspect]\nmax_inflight = \"many\"\n", "inspect.max_inflight must be int"),
        ("[tls.broker]\nverify = \"yes\"\n", "tls.broker.verify must be bool"),
        ("[proxy]\nnode_ports = { \"1\" = \"x\" }\n", "proxy.node_ports must be dict"),
        ("[proxy\n", "Expected"),
    ],
)
def test_bad_keys_and_values_are_named(tmp_path, text, problem):
    path = tmp_path / "k.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(path)


def test_overrides_win_over_the_file(tmp_path):
    path = tmp_path / "k.toml"
    path.write_text('[proxy]\nlisten = "127.0.0.1:1"\nupstream = "127.0.0.1:2"\n')
    config = load_config(path, {"proxy.listen": "127.0.0.1:3", "proxy.bootstrap_servers": ["a:1"]})
    assert config.proxy.listen == "127.0.0.1:3" and config.proxy.upstream == "127.0.0.1:2"
    assert config.proxy.bootstrap_servers == ["a:1"]
    with pytest.raises(ConfigError, match="proxy.connect_timeout must be float"):
        load_config(None, {"proxy.connect_timeout": "soon"})


def test_the_sidecar_config_loads():
    sidecar = ROOT / "deploy" / "config" / "kinspect-sidecar.toml"
    config = load_config(sidecar)
    assert config.proxy.mode == "rewrite" and config.metrics.listen == "0.0.0.0:9464"
