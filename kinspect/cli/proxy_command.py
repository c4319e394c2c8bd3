"""`kinspect proxy`: run the sidecar proxy from a config file, flags overriding it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from kinspect.capture.metrics import CaptureCollector
from kinspect.capture.observer import CaptureObserver
from kinspect.cli.common import add_spec_options
from kinspect.config import ConfigError, load_config
from kinspect.protocol.codec import Codec
from kinspect.protocol.spec_registry import SpecRegistry
from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.problem_log import ProblemLog
from kinspect.proxy.server import ProxyServer, parse_address
from kinspect.logs import configure_logging
from kinspect.observers.debug_log import DebugLog
from kinspect.observers.http_endpoints import HttpEndpoints, listeners_serving
from kinspect.observers.inventory import InventoryObserver
from kinspect.observers.metrics import MetricsObserver
from kinspect.upgrade.targets import load_target

log = logging.getLogger("kinspect.proxy")

# flag -> dotted config key
FLAG_KEYS = {
    "mode": "proxy.mode",
    "listen": "proxy.listen",
    "upstream": "proxy.upstream",
    "bootstrap_server": "proxy.bootstrap_servers",
    "advertised_host": "proxy.advertised_host",
    "node_port_base": "proxy.node_port_base",
    "metrics_enabled": "metrics.enabled",
    "metrics_listen": "metrics.listen",
    "log_format": "log.format",
    "log_level": "log.level",
    "debug_requests": "log.debug_requests",
}


def add_parser(commands) -> None:
    p = commands.add_parser("proxy", help="run the sidecar proxy")
    add_spec_options(p)
    p.add_argument("--mode", choices=["passthrough", "rewrite"])
    p.add_argument("--listen", metavar="HOST:PORT", help="listener (rewrite mode: the bootstrap listener)")
    p.add_argument("--upstream", metavar="HOST:PORT", help="passthrough: the broker behind the listener")
    p.add_argument("--bootstrap-server", action="append", metavar="HOST:PORT", help="rewrite: a broker to bootstrap from")
    p.add_argument("--advertised-host", help="rewrite: the host clients use to reach kinspect")
    p.add_argument("--node-port-base", type=int, metavar="PORT", help="rewrite: broker node N listens at PORT+N")
    p.add_argument("--upstream-map", action="append", metavar="ADVERTISED=ACTUAL",
                   help="rewrite: connect to ACTUAL host:port for a broker advertised as ADVERTISED (repeatable)")
    p.add_argument("--no-metrics", dest="metrics_enabled", action="store_false", default=None,
                   help="do not collect or serve metrics")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="where /metrics, /healthz and /readyz are served")
    p.add_argument("--log-format", choices=["json", "console"])
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--debug-requests", action="store_true", default=None,
                   help="log every decoded request (credentials and record data withheld)")
    p.add_argument("--capture-dir", metavar="DIR",
                   help="capture every exchange as Parquet rows into DIR (sets capture.enabled)")
    p.set_defaults(run=run)


def overrides_from(args: argparse.Namespace) -> dict:
    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None}
    if args.upstream_map:
        pairs = [item.partition("=") for item in args.upstream_map]
        bad = [a for a, sep, b in pairs if not sep or not b]
        if bad:
            raise ConfigError(f"--upstream-map {bad[0]!r} is not ADVERTISED=ACTUAL")
        overrides["proxy.upstream_map"] = {a: b for a, _, b in pairs}
    if args.capture_dir is not None:
        overrides["capture.enabled"] = True
        overrides["capture.directory"] = args.capture_dir
    return overrides


def install_event_loop() -> str:
    """uvloop when installed (the default install has it), asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def build_observers(config, codec: Codec | None = None) -> tuple[list, MetricsObserver | None]:
    """The observers the config asks for: problems always; metrics, the debug log and the capture when enabled.

    The capture observer (when enabled) is in the list; its writer thread starts in serve().
    """
    observers: list = [ProblemLog()]
    metrics = None
    if config.metrics.enabled:
        metrics = MetricsObserver(topic_bytes=config.metrics.topic_bytes, max_topics=config.metrics.max_topics,
                                   max_unknown_series=config.metrics.max_unknown_series)
        observers.append(metrics)
        # The client inventory (/clients) and its metrics, beside /metrics; targets from [upgrade].
        inventory = InventoryObserver([load_target(t, config.specs.directories) for t in config.upgrade.targets],
                                      config.metrics.max_unknown_series, metrics.label_overflow,
                                      api_name=codec.registry.api_name if codec is not None else None)
        metrics.registry.register(inventory.collector())
        observers.append(inventory)
    if config.log.debug_requests or config.log.debug_responses:
        observers.append(DebugLog(
            include=config.log.include_apis or None, exclude=config.log.exclude_apis,
            sample_rate=config.log.sample_rate, responses=config.log.debug_responses,
            max_body_chars=config.log.max_body_chars,
        ))
    if config.capture.enabled:
        capture = CaptureObserver.from_config(config.capture, codec)
        observers.append(capture)
        if metrics is not None:
            metrics.registry.register(CaptureCollector(capture.writer))
    return observers, metrics


def capture_of(observers: list) -> CaptureObserver | None:
    return next((o for o in observers if isinstance(o, CaptureObserver)), None)


async def serve(server: ProxyServer, metrics: MetricsObserver | None, capture: CaptureObserver | None = None) -> None:
    if capture is not None:
        capture.start()
    await server.start()
    endpoints = None
    if metrics is not None:
        host, port = parse_address(server.config.metrics.listen, "metrics.listen")
        inventory = next((o for o in server.dispatcher.observers if isinstance(o, InventoryObserver)), None)
        endpoints = await HttpEndpoints(metrics.registry, listeners_serving(server),
                                        inventory.clients_json if inventory is not None else None).start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    where = f"; metrics on http://{server.config.metrics.listen.rsplit(':', 1)[0]}:{endpoints.port}/metrics" if endpoints else ""
    print(f"kinspect: proxy listening on {server.listeners[0].host}:{server.bootstrap_port} "
          f"({server.config.proxy.mode} mode){where}", flush=True)
    await stop.wait()
    log.info("stopping: %d connections, %d requests in flight", len(server.relays), server.inflight())
    await server.shutdown()
    if capture is not None:
        # Every exchange is in the queue now: write them all and finish the open file.
        await asyncio.to_thread(capture.close)
    if endpoints is not None:
        await endpoints.close()


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, overrides_from(args))
    config.specs.directories += args.spec_dir
    configure_logging(config.log.format, config.log.level)
    codec = Codec(SpecRegistry.default(config.specs.directories))
    try:
        observers, metrics = build_observers(config, codec)
        server = ProxyServer(config, codec, Dispatcher(observers))
    except ValueError as exc:
        print(f"kinspect: {exc}")
        return 2
    if metrics is not None:
        metrics.server = server
    loop_name = install_event_loop()
    log.info("event loop: %s", loop_name)
    capture = capture_of(observers)
    try:
        asyncio.run(serve(server, metrics, capture))
    except (OSError, ValueError) as exc:
        print(f"kinspect: cannot start: {exc}")
        return 2
    finally:
        if capture is not None:
            capture.close()  # a no-op after serve() closed it; otherwise writes what was queued
    return 0
