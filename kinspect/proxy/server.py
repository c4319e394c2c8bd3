"""The proxy server: listeners in passthrough or rewrite mode, connections, graceful shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from dataclasses import dataclass

from kinspect.config import Config
from kinspect.protocol.codec import Codec
from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.inspection_queue import InspectionQueue
from kinspect.proxy.log_limit import RateLimitedLog
from kinspect.proxy.relay import Relay, native_inspect_reads
from kinspect.proxy.stats import ServerStats
from kinspect.proxy.tls import broker_side_context, client_side_context
from kinspect.session import ConnectionInfo, Plan, Session, SessionConfig
from kinspect.session.address_rewrite import AddressRewrite, NodeMap

log = logging.getLogger("kinspect.proxy")


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass
class Listener:
    """One local port and where its connections go: a fixed broker, or a broker node by id."""

    host: str
    port: int
    upstreams: list[tuple[str, int]]
    node_id: int | None = None
    server: asyncio.AbstractServer | None = None


class ProxyServer:
    def __init__(self, config: Config, codec: Codec, dispatcher: Dispatcher | None = None) -> None:
        self.config = config
        self.codec = codec
        self.dispatcher = dispatcher or Dispatcher()
        self.rewrite = config.proxy.mode == "rewrite"
        delay = config.inspect.batch_delay_ms
        if not delay >= 0:
            raise ValueError(f"inspect.batch_delay_ms must be 0 or more, not {delay!r}")
        # Forwarded reads wait here to be inspected in batches (see inspection_queue); rewrite mode
        # changes responses as they pass, so it inspects every read at once.
        self.inspection_queue = (InspectionQueue(delay / 1000, inspect_reads=native_inspect_reads())
                                 if delay > 0 and not self.rewrite else None)
        self.session_config = SessionConfig(
            max_frame_bytes=config.inspect.max_frame_bytes, inspect_max_bytes=config.inspect.inspect_max_bytes,
            max_inflight=config.inspect.max_inflight, request_timeout=config.inspect.request_timeout,
        )
        self.client_ssl = client_side_context(config.tls.client)
        self.broker_ssl = broker_side_context(config.tls.broker)
        self.listeners: list[Listener] = []
        self.node_listeners: dict[int, Listener] = {}
        self.relays: set[Relay] = set()
        self.connections_total = 0
        self.refused_connections = 0
        self.inspection_failures = 0
        # Failed attempts to reach a broker, by why: timeout (proxy.connect_timeout), refused, error.
        self.connect_failures = {"timeout": 0, "refused": 0, "error": 0}
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start(); metrics count its tasks
        self.closed_bytes = {"client": 0, "broker": 0}  # bytes received from each side, closed connections
        self._ids = itertools.count(1)
        self._sweeper: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # connects and new node listeners, ended by shutdown
        self.nodes: NodeMap | None = None
        self._stopping = False
        self._upstream: tuple[bool, float] | None = None  # (reached, when) of the latest broker connect or probe
        self._probe: asyncio.Task | None = None
        self._connect_log = RateLimitedLog(log)
        proxy = config.proxy
        listen_host, listen_port = parse_address(proxy.listen, "proxy.listen")
        if self.rewrite:
            if not proxy.bootstrap_servers:
                raise ValueError("proxy.bootstrap_servers is required in rewrite mode")
            self.nodes = NodeMap(
                proxy.advertised_host or listen_host, proxy.node_port_base or None,
                {int(k): v for k, v in proxy.node_ports.items()},
            )
            self.upstream_map = {
                parse_address(k, "proxy.upstream_map key"): parse_address(v, "proxy.upstream_map value")
                for k, v in proxy.upstream_map.items()
            }
            boot = [parse_address(b, "proxy.bootstrap_servers") for b in proxy.bootstrap_servers]
            self.listeners.append(Listener(listen_host, listen_port, boot))
            transform = AddressRewrite(codec, self.nodes, proxy.rewrite_node_endpoints, self._broker_seen,
                                       proxy.fetch_max_version)
        else:
            transform = None
            if not proxy.upstream:
                raise ValueError("proxy.upstream is required in passthrough mode")
            self.listeners.append(Listener(listen_host, listen_port, [parse_address(proxy.upstream, "proxy.upstream")]))
            for route in proxy.routes:
                listen, sep, upstream = route.partition("=")
                if not sep:
                    raise ValueError(f"proxy.routes entry {route!r} is not LISTEN=UPSTREAM")
                host, port = parse_address(listen, "proxy.routes listener")
                self.listeners.append(Listener(host, port, [parse_address(upstream, "proxy.routes upstream")]))
        # What every session keeps of each frame (whole frames only where an observer reads
        # bodies), and the response transform of rewrite mode: one plan for all connections.
        self.plan = Plan(self.dispatcher.body_predicate(), transform)

    # ------------------------------------------------------------------ listening

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for i, listener in enumerate(self.listeners):
            key = "proxy.listen" if i == 0 else "proxy.routes"
            try:
                sock = self._bind(listener.host, listener.port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {listener.host}:{listener.port} ({key}): "
                                         f"{exc.strerror or exc}") from None
            await self._listen(listener, sock)
        self._sweeper = self.loop.create_task(self._sweep())
        if self.config.proxy.readiness_probe_interval > 0:
            self._probe = self.loop.create_task(self._probe_upstream())

    def _bind(self, host: str, port: int) -> socket.socket:
        """Bind and listen at once: connections queue in the backlog until accept starts."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _listen(self, listener: Listener, sock: socket.socket) -> None:
        listener.port = sock.getsockname()[1]
        if self._stopping:
            sock.close()
            return
        listener.server = await asyncio.get_running_loop().create_server(
            lambda: self._accept(listener), sock=sock, ssl=self.client_ssl, start_serving=True,
        )
        if self._stopping:  # shutdown began while the server was being made
            listener.server.close()
        log.info("listening on %s:%d for %s", listener.host, listener.port,
                 f"node {listener.node_id}" if listener.node_id is not None else
                 ", ".join(f"{h}:{p}" for h, p in listener.upstreams))

    @property
    def bootstrap_port(self) -> int:
        return self.listeners[0].port

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def housekeeping_tasks(self) -> tuple:
        """The tasks that live as long as the server: the sweeper of old requests and the readiness probe."""
        return tuple(task for task in (self._sweeper, self._probe) if task is not None)

    def _node_listener(self, node_id: int, host: str, port: int) -> None:
        """Learn a broker's address; give it a local listener the first time it is seen."""
        self.nodes.upstream[node_id] = (host, port)
        host, port = self.upstream_map.get((host, port), (host, port))
        listener = self.node_listeners.get(node_id)
        if listener is not None:
            listener.upstreams = [(host, port)]
            return
        local_port = self.nodes.port_for(node_id)  # KeyError: no port for this node (config)
        listen_host = self.listeners[0].host
        listener = Listener(listen_host, local_port, [(host, port)], node_id)
        self.node_listeners[node_id] = listener
        self.listeners.append(listener)
        try:
            sock = self._bind(listen_host, local_port)
        except OSError as exc:
            # Still rewrite: clients must only ever be given kinspect's addresses. They will
            # fail to reach this node until the port is free, which the log says loudly.
            log.error("cannot listen on %s:%d for node %d: %s; clients told to use it will fail to connect",
                      listen_host, local_port, node_id, exc)
            return
        self._spawn(self._listen(listener, sock))

    def _broker_seen(self, node_id: int, host: str, port: int) -> None:
        """The address rewrite met a broker: give it a listener, or follow its move."""
        if node_id not in self.node_listeners or self.nodes.upstream.get(node_id) != (host, port):
            self._node_listener(node_id, host, port)

    # ------------------------------------------------------------------ connections

    def _accept(self, listener: Listener):
        upstreams = list(listener.upstreams)
        info = ConnectionInfo(next(self._ids), "", ", ".join(f"{h}:{p}" for h, p in upstreams), listener.node_id)
        session = Session(self.codec, info, self.session_config, self.plan)
        relay = Relay(self, session, self.dispatcher, upstreams)
        self.connections_total += 1
        self.relays.add(relay)
        relay.closed.add_done_callback(lambda _: self._closed(relay))
        return relay.client

    def _closed(self, relay: Relay) -> None:
        self.relays.discard(relay)
        self.closed_bytes["client"] += relay.client_bytes
        self.closed_bytes["broker"] += relay.broker_bytes

    def client_connected(self, relay: Relay) -> None:
        """Called by the relay once the client's transport is up: refuse, or reach the broker."""
        if self._stopping or len(self.relays) > self.config.proxy.max_connections:
            self.refused_connections += 1
            why = ("the proxy is stopping" if self._stopping
                   else f"{len(self.relays) - 1} connections open (proxy.max_connections)")
            log.warning("connection %d from %s refused: %s", relay.session.connection.id,
                        relay.session.connection.client_address, why)
            relay.abort()
            return
        self._spawn(self._connect(relay))

    async def _connect(self, relay: Relay) -> None:
        loop = asyncio.get_running_loop()
        errors = []
        for host, port in relay.upstreams:
            if relay.closed.done():
                return
            try:
                await asyncio.wait_for(
                    loop.create_connection(lambda: relay.broker, host, port, ssl=self.broker_ssl,
                                           server_hostname=(self.config.tls.broker.server_hostname or host)
                                           if self.broker_ssl else None),
                    self.config.proxy.connect_timeout,
                )
            except (OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    why = "timeout"
                    errors.append(f"{host}:{port}: no answer within {self.config.proxy.connect_timeout:g} s "
                                  "(proxy.connect_timeout)")
                else:
                    why = "refused" if isinstance(exc, ConnectionRefusedError) else "error"
                    errors.append(f"{host}:{port}: {exc}")
                self.connect_failures[why] += 1
                self._upstream = (False, time.monotonic())
                continue
            self._upstream = (True, time.monotonic())
            if relay.closed.done() or self._stopping:  # the client left, or shutdown began, meanwhile
                relay.close()
                return
            relay.session.connection.broker = f"{host}:{port}"
            relay.connected()
            return
        # A client that retries fast must not flood the log: one line per broker set every few seconds.
        self._connect_log.warning(",".join(f"{h}:{p}" for h, p in relay.upstreams),
                                  "connection %d from %s closed: no broker reachable (%s)", relay.session.connection.id,
                                  relay.session.connection.client_address, "; ".join(errors))
        relay.close()

    async def _check_upstream(self, timeout: float) -> None:
        """Try to reach the first listener's broker; the outcome is what /readyz reports."""
        host, port = self.listeners[0].upstreams[0]
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.broker_ssl,
                                        server_hostname=(self.config.tls.broker.server_hostname or host)
                                        if self.broker_ssl else None), timeout)
            writer.close()
            self._upstream = (True, time.monotonic())
        except (OSError, asyncio.TimeoutError) as exc:
            self._upstream = (False, time.monotonic())
            self._connect_log.warning(f"probe {host}:{port}", "readiness probe: broker %s:%d not reachable: %s",
                                      host, port, exc or type(exc).__name__)

    async def _probe_upstream(self) -> None:
        """Keep readiness honest while no client connects: try the broker when nothing was heard for a while."""
        interval = self.config.proxy.readiness_probe_interval
        while True:
            last = self._upstream
            if last is None or time.monotonic() - last[1] >= interval:
                await self._check_upstream(self.config.proxy.connect_timeout)
            await asyncio.sleep(max(0.05, interval - (time.monotonic() - self._upstream[1])))

    def stats(self) -> ServerStats:
        """The server's state now, read by the metrics collector and the health endpoints."""
        relays = list(self.relays)
        sent = dict(self.closed_bytes)
        for relay in relays:
            sent["client"] += relay.client_bytes
            sent["broker"] += relay.broker_bytes
        tasks = 0
        if self.loop is not None and not self.loop.is_closed():
            for _ in range(5):
                try:
                    tasks = len(asyncio.all_tasks(self.loop))
                    break
                except RuntimeError:  # the task set changed while read from another thread
                    continue
        made = [listener.server for listener in self.listeners if listener.server is not None]
        serving = (not self._stopping and bool(self.listeners) and self.listeners[0].server is not None
                   and all(s.is_serving() for s in made))
        upstream = self._upstream
        return ServerStats(
            connections_open=len(relays), connections_total=self.connections_total,
            connections_refused=self.refused_connections, connections_limit=self.config.proxy.max_connections,
            bytes_from_clients=sent["client"], bytes_from_brokers=sent["broker"],
            inflight=sum(relay.session.inflight for relay in relays), inflight_limit=self.config.inspect.max_inflight,
            connect_failures=dict(self.connect_failures), inspection_failures=self.inspection_failures, tasks=tasks,
            inspection_cpu_seconds=self.inspection_queue.cpu_seconds if self.inspection_queue is not None else 0.0,
            serving=serving, upstream_reachable=upstream[0] if upstream else None,
            upstream_checked_ago=time.monotonic() - upstream[1] if upstream else None,
        )

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.settle()  # a response waiting to be inspected must not time its request out
            now = time.monotonic()  # the clock the relays stamp events with
            for relay in list(self.relays):
                events = relay.session.sweep(now)
                if events:
                    self.dispatcher.dispatch(events)

    # ------------------------------------------------------------------ stopping

    def settle(self) -> None:
        """Inspect every read forwarded so far (before a scrape, a sweep, a shutdown's count)."""
        if self.inspection_queue is not None:
            self.inspection_queue.flush()

    def inflight(self) -> int:
        self.settle()  # requests forwarded but not yet inspected are in flight too
        return sum(relay.session.inflight for relay in self.relays)

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight exchanges finish up to the grace period, then close all."""
        self._stopping = True
        grace = self.config.proxy.shutdown_grace if grace is None else grace
        for listener in self.listeners:
            if listener.server is not None:
                listener.server.close()
        for task in list(self._tasks):  # pending broker connects and listeners being made
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        for listener in self.listeners:
            if listener.server is not None:
                listener.server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.relays and self.inflight() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for relay in list(self.relays):
            relay.close()
        if self.relays:
            await asyncio.wait([r.closed for r in list(self.relays)], timeout=2.0)
        for task in (self._sweeper, self._probe):
            if task is not None:
                task.cancel()
        for listener in self.listeners:
            if listener.server is not None:
                await listener.server.wait_closed()
