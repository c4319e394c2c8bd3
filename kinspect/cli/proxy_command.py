"""`kinspect proxy`: run the sidecar proxy from a config file, flags overriding it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from kinspect.cli.common import add_spec_options
from kinspect.config import ConfigError, load_config
from kinspect.protocol.codec import Codec
from kinspect.protocol.spec_registry import SpecRegistry
from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.problem_log import ProblemLog
from kinspect.proxy.server import ProxyServer

log = logging.getLogger("kinspect.proxy")

# flag -> dotted config key
FLAG_KEYS = {
    "mode": "proxy.mode",
    "listen": "proxy.listen",
    "upstream": "proxy.upstream",
    "bootstrap_server": "proxy.bootstrap_servers",
    "advertised_host": "proxy.advertised_host",
    "node_port_base": "proxy.node_port_base",
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
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(run=run)


def overrides_from(args: argparse.Namespace) -> dict:
    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None}
    if args.upstream_map:
        pairs = [item.partition("=") for item in args.upstream_map]
        bad = [a for a, sep, b in pairs if not sep or not b]
        if bad:
            raise ConfigError(f"--upstream-map {bad[0]!r} is not ADVERTISED=ACTUAL")
        overrides["proxy.upstream_map"] = {a: b for a, _, b in pairs}
    return overrides


def install_event_loop() -> str:
    """uvloop when installed (the default install has it), asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def serve(server: ProxyServer) -> None:
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"kinspect: proxy listening on {server.listeners[0].host}:{server.bootstrap_port} "
          f"({server.config.proxy.mode} mode)", flush=True)
    await stop.wait()
    log.info("stopping: %d connections, %d requests in flight", len(server.relays), server.inflight())
    await server.shutdown()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, overrides_from(args))
    config.specs.directories += args.spec_dir
    codec = Codec(SpecRegistry.default(config.specs.directories))
    try:
        server = ProxyServer(config, codec, Dispatcher([ProblemLog()]))
    except ValueError as exc:
        print(f"kinspect: {exc}")
        return 2
    loop_name = install_event_loop()
    log.info("event loop: %s", loop_name)
    try:
        asyncio.run(serve(server))
    except OSError as exc:
        print(f"kinspect: cannot listen: {exc}")
        return 2
    return 0
