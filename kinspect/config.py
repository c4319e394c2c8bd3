"""kinspect's configuration: a TOML file checked key by key, with errors that name the key.

Every section is a dataclass below; its fields are the keys, their defaults the
defaults, and the comment beside each is its documentation (config/kinspect.toml
shows them all). Command-line flags override the file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path



class ConfigError(ValueError):
    """A configuration file or value that is not valid; names the key."""


@dataclass
class SpecsConfig:
    directories: list[str] = field(default_factory=list)  # extra message-definition directories; later ones win


@dataclass
class ProxyConfig:
    mode: str = "passthrough"  # passthrough | rewrite
    listen: str = "127.0.0.1:19092"  # passthrough: the listener; rewrite: the bootstrap listener
    upstream: str = ""  # passthrough: the broker host:port behind `listen`
    routes: list[str] = field(default_factory=list)  # passthrough: more "LISTEN=UPSTREAM" pairs
    bootstrap_servers: list[str] = field(default_factory=list)  # rewrite: brokers to bootstrap from
    advertised_host: str = ""  # rewrite: host clients use to reach kinspect (default: the listen host)
    node_port_base: int = 0  # rewrite: broker node N gets port base + N (0: use node_ports only)
    node_ports: dict[str, int] = field(default_factory=dict)  # rewrite: node id -> port, wins over the base
    rewrite_node_endpoints: bool = True  # rewrite: also KIP-951 NodeEndpoints (holds Produce v10+/Fetch v16+ responses whole)
    fetch_max_version: int = 15  # rewrite: highest Fetch version offered to clients (0: the broker's own)
    upstream_map: dict[str, str] = field(default_factory=dict)  # rewrite: advertised "host:port" -> address kinspect connects to
    connect_timeout: float = 10.0  # seconds to reach a broker before the client is disconnected
    shutdown_grace: float = 10.0  # seconds in-flight requests get to finish on SIGTERM/SIGINT
    max_connections: int = 10000  # client connections at once; more are refused
    readiness_probe_interval: float = 10.0  # seconds between broker checks while no client connects (0: off)


@dataclass
class InspectConfig:
    max_frame_bytes: int = 100 * 1024 * 1024  # larger frames are reported (Kafka's socket.request.max.bytes)
    inspect_max_bytes: int = 1024 * 1024  # frames above this are inspected by their header only
    max_inflight: int = 1000  # unanswered requests tracked per connection
    request_timeout: float = 300.0  # seconds an unanswered request is tracked
    # A forwarded read waits up to this long to be inspected with others (0: at once). Batches fill at 32
    # reads long before 100 ms under load, so the timer is only a backstop for quiet connections. A short
    # one costs: the timer firing and starting again every few ms, and batches flushed part-full. On 8
    # connections of small requests one at a time, 5 ms cost 10% more CPU a request than 100 ms, and 2 ms
    # 9% more than 5 ms (paired rounds, docs/performance.md). Scrapes and a connection's end inspect first.
    batch_delay_ms: float = 100.0


@dataclass
class MetricsConfig:
    enabled: bool = True  # serve Prometheus metrics, /healthz and /readyz
    listen: str = "127.0.0.1:9464"  # where /metrics, /healthz and /readyz are served
    topic_bytes: bool = False  # bytes by topic (opt-in: topic names are not a bounded set)
    max_topics: int = 100  # distinct topics with their own series; the rest count under "other"
    max_unknown_series: int = 200  # series for label values not in the specs (unknown versions, tags, errors); the rest: "other"


@dataclass
class LogConfig:
    format: str = "json"  # json (one JSON object a line) | console (readable)
    level: str = "INFO"  # DEBUG | INFO | WARNING | ERROR
    debug_requests: bool = False  # log every decoded request (credentials and record data withheld)
    debug_responses: bool = False  # log decoded responses too
    include_apis: list[str] = field(default_factory=list)  # only these apis (empty: all)
    exclude_apis: list[str] = field(default_factory=list)  # never these apis
    sample_rate: float = 1.0  # fraction of requests logged (0.0-1.0)
    max_body_chars: int = 4096  # longer rendered bodies are truncated


@dataclass
class CaptureConfig:
    enabled: bool = False  # write every exchange as a row of Parquet (schema: kinspect/capture/schema.py)
    directory: str = "captures"  # where capture files go (relative to the config file)
    max_file_bytes: int = 64 * 1024 * 1024  # a file is finished once it reaches this size
    max_file_seconds: float = 300.0  # ... or once its first row is this old
    queue_rows: int = 100000  # exchanges waiting for the writer thread; more are dropped and counted
    row_group_rows: int = 10000  # rows per Parquet row group (written when full, or when the file ends)
    queue_bytes: int = 256 * 1024 * 1024  # bytes of facts the queue may hold; more are dropped and counted
    writer_process: bool = True  # build and write rows in a process of their own (else in the proxy's writer thread)
    writer_priority: str = "auto"  # that process's: low (nice +10), idle (idle class, paced), auto (idle where it may leave it)


@dataclass
class TlsConfig:
    enabled: bool = False
    ca_file: str | None = None  # CA bundle to verify the peer (default: the system's)
    cert_file: str | None = None  # our certificate (required towards clients)
    key_file: str | None = None
    verify: bool = True  # verify the peer's certificate (brokers: on by default)
    server_hostname: str | None = None  # name to check in the broker's certificate (default: its host)


@dataclass
class UpgradeConfig:
    targets: list[str] = field(default_factory=list)  # broker releases (3.9.2, 4.3.1 or a spec directory) to check clients against


@dataclass
class TlsSection:
    client: TlsConfig = field(default_factory=TlsConfig)  # [tls.client]: TLS from clients to kinspect
    broker: TlsConfig = field(default_factory=TlsConfig)  # [tls.broker]: TLS from kinspect to brokers


@dataclass
class Config:
    specs: SpecsConfig = field(default_factory=SpecsConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)
    tls: TlsSection = field(default_factory=TlsSection)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    upgrade: UpgradeConfig = field(default_factory=UpgradeConfig)


_CHOICES = {
    ("proxy", "mode"): ("passthrough", "rewrite"),
    ("log", "format"): ("json", "console"),
    ("log", "level"): ("DEBUG", "INFO", "WARNING", "ERROR"),
    ("capture", "writer_priority"): ("auto", "low", "idle"),  # capture.writer.PRIORITIES (config imports no other layer)
}


def _check(where: str, value, kind: str):
    """Check a value against a field's annotation; return it (converted where harmless)."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "str | None":
        if value is None or isinstance(value, str):
            return value
    elif kind == "list[str]":
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    elif kind == "dict[str, str]":
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return value
    elif kind == "dict[str, int]":
        if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            return value
    raise ConfigError(f"{where} must be {kind.replace(' | None', '')}, not {value!r}")


def _apply(target, data: dict, where: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    for key, value in data.items():
        name = f"{where}.{key}" if where else key
        f = fields.get(key)
        if f is None:
            kind = "section" if not where else "key"
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown {kind} {name} (known: {known})")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{name} must be a table")
            _apply(current, value, name)
            continue
        value = _check(name, value, f.type)
        choices = _CHOICES.get((where, key))
        if choices and value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        setattr(target, key, value)


def load_config(path: str | Path | None, overrides: dict | None = None) -> Config:
    """Read a config file (None gives the defaults), then apply overrides {"proxy.listen": ...}."""
    config = Config()
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text("utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except RecursionError:  # tomllib recurses once per nesting level
            raise ConfigError(f"{path}: values nested too deeply") from None
        try:
            _apply(config, data, "")
            _check_addresses(config, _dotted(data))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        # Relative paths in the file are relative to the file.
        base = path.parent
        config.specs.directories = [str(base / d) if not Path(d).is_absolute() else d for d in config.specs.directories]
        if "directory" in data.get("capture", {}) and not Path(config.capture.directory).is_absolute():
            config.capture.directory = str(base / config.capture.directory)
        for tls in (config.tls.client, config.tls.broker):
            for attr in ("ca_file", "cert_file", "key_file", "server_hostname"):
                value = getattr(tls, attr)
                if value is None:
                    continue
                if value == "":
                    setattr(tls, attr, None)  # "" in the file means unset
                elif attr != "server_hostname" and not Path(value).is_absolute():
                    setattr(tls, attr, str(base / value))
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.rpartition(".")
        target = config
        for part in section.split("."):
            target = getattr(target, part)
        _apply(target, {key: value}, section)
    _check_addresses(config, set(overrides or {}))
    return config


# Keys whose values are HOST:PORT addresses; checked at load so the error names the file and key.
_ADDRESS_KEYS = ("proxy.listen", "proxy.upstream", "proxy.routes", "proxy.bootstrap_servers",
                 "proxy.upstream_map", "metrics.listen")


def _dotted(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and not prefix:
            keys |= _dotted(value, f"{key}.")
    return keys


def _is_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) < 65536)


def _check_addresses(config: Config, keys: set[str]) -> None:
    """Each HOST:PORT value among these keys is one; the error names the key (the caller adds the file)."""
    for key in _ADDRESS_KEYS:
        if key not in keys:
            continue
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if isinstance(value, str):
            values = [value] if value else []
        elif isinstance(value, dict):
            values = [v for pair in value.items() for v in pair]
        elif key == "proxy.routes":
            bad = [item for item in value if "=" not in item]
            if bad:
                raise ConfigError(f"{key} {bad[0]!r} is not LISTEN=UPSTREAM")
            values = [part for item in value for part in item.split("=", 1)]
        else:
            values = list(value)
        for text in values:
            if not _is_address(text):
                raise ConfigError(f"{key} {text!r} is not HOST:PORT")


def config_keys(config: Config | None = None, prefix: str = "") -> dict[str, object]:
    """Every key with its value, dotted ("proxy.listen"): for docs and the tests that check them."""
    config = config if config is not None else Config()
    out: dict[str, object] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(config_keys(value, f"{name}."))
        else:
            out[name] = value
    return out
