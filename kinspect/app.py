"""The composition root: builds the proxy application (server, pipeline plan, observers, endpoints) from a config.

`kinspect proxy`, `kinspect demo` and the tests' harness all assemble kinspect here, so a
config means the same thing wherever it is used.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kinspect.capture.metrics import CaptureCollector
from kinspect.capture.observer import CaptureObserver
from kinspect.config import Config
from kinspect.observers.debug_log import DebugLog
from kinspect.observers.http_endpoints import HttpEndpoints, readiness_of
from kinspect.observers.inventory import InventoryObserver
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.specs.registry import SpecRegistry
from kinspect.proxy.observers import Dispatcher
from kinspect.proxy.problem_log import ProblemLog
from kinspect.proxy.server import ProxyServer, parse_address
from kinspect.upgrade.targets import load_target


def install_event_loop() -> str:
    """uvloop when installed (the default install has it), asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def build_observers(config: Config, codec: Codec | None = None) -> tuple[list, MetricsObserver | None]:
    """The observers the config asks for: problems always; metrics, the debug log and the capture when enabled.

    The capture observer (when enabled) is in the list; its writer thread starts with the app.
    """
    observers: list = [ProblemLog()]
    metrics = None
    if config.metrics.enabled:
        metrics = MetricsObserver(topic_bytes=config.metrics.topic_bytes, max_topics=config.metrics.max_topics,
                                  max_unknown_series=config.metrics.max_unknown_series, codec=codec)
        observers.append(metrics)
        # The client inventory (/clients) and its metrics beside /metrics; upgrade targets from [upgrade].
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


@dataclass
class App:
    """kinspect's proxy with everything around it; `start()` and `stop()` run on the proxy's event loop."""

    config: Config
    codec: Codec
    server: ProxyServer
    observers: list
    metrics: MetricsObserver | None = None
    capture: CaptureObserver | None = None
    inventory: InventoryObserver | None = None
    endpoints: HttpEndpoints | None = None
    _started: bool = field(default=False, repr=False)

    async def start(self, serve_http: bool = True) -> None:
        """Start the capture writer, the listeners and (with metrics) /metrics, /healthz, /readyz."""
        if self.capture is not None:
            self.capture.start()
        self._started = True
        await self.server.start()
        if serve_http and self.metrics is not None:
            host, port = parse_address(self.config.metrics.listen, "metrics.listen")
            try:
                clients = self.inventory.clients_json if self.inventory is not None else None
                self.endpoints = await HttpEndpoints(self.metrics.registry, readiness_of(self.server), clients,
                                                     self.server.settle).start(host, port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {host}:{port} (metrics.listen): {exc.strerror or exc}") \
                    from None

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight exchanges finish (up to the grace), write every capture row, close."""
        await self.server.shutdown(grace)
        if self.capture is not None:
            # Every exchange is queued now: write them all and finish the open file (it blocks: off the loop).
            await asyncio.to_thread(self.capture.close)
        if self.endpoints is not None:
            await self.endpoints.close()

    def close_capture(self) -> None:
        """Outside the loop, after a failed start or run: write what was queued (a no-op once stopped)."""
        if self.capture is not None:
            self.capture.close()

    @property
    def metrics_port(self) -> int | None:
        return self.endpoints.port if self.endpoints is not None else None


def build_app(config: Config, codec: Codec | None = None, extra_observers: tuple | list = ()) -> App:
    """Everything the config asks for, with `extra_observers` (the demo's summary, a test's log) beside them.

    Raises ValueError for a config the server cannot use (the message names the key).
    """
    codec = codec or Codec(SpecRegistry.default(config.specs.directories))
    observers, metrics = build_observers(config, codec)
    observers.extend(extra_observers)
    server = ProxyServer(config, codec, Dispatcher(observers))
    if metrics is not None:
        metrics.server = server
    capture = next((o for o in observers if isinstance(o, CaptureObserver)), None)
    inventory = next((o for o in observers if isinstance(o, InventoryObserver)), None)
    return App(config, codec, server, observers, metrics, capture, inventory)
