"""/metrics, /healthz and /readyz over a minimal HTTP/1.1 server on the proxy's asyncio loop.

One request per connection (the response says Connection: close); GET and HEAD only.
/metrics renders the registry in the Prometheus text format, /healthz answers 200 while
the process runs, /readyz answers 200 when `ready()` says so (the proxy's listeners are
serving and the latest attempt to reach a broker did not fail) and 503 otherwise, with the
reason in the body; /clients (when given a `clients()`) answers the client inventory as
JSON (kinspect/observers/inventory.py); any other path is a 404. `settle()`, when given, is
called before /metrics and /clients are rendered: the proxy inspects the reads still waiting
for their batch, so that a scrape counts every byte forwarded before it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("kinspect.metrics")

MAX_HEAD_BYTES = 16 * 1024  # request line and headers
READ_TIMEOUT = 10.0  # seconds a client has to send its request head
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}
_TEXT = "text/plain; charset=utf-8"


def readiness_of(server) -> Callable[[], tuple[bool, str]]:
    """A ready() for a ProxyServer, from its stats snapshot: (ready, the reason in one line)."""

    def ready() -> tuple[bool, str]:
        stats = server.stats()
        return stats.ready, stats.readiness()

    return ready


class HttpEndpoints:
    """The HTTP server; `start(host, port)` binds (port 0 picks a free one, see `.port`), `close()` stops."""

    def __init__(self, registry: CollectorRegistry, ready: Callable[[], tuple[bool, str] | bool] | None = None,
                 clients: Callable[[], bytes] | None = None, settle: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.settle = settle
        self.ready = ready or (lambda: True)
        self.clients = clients
        self.port: int | None = None
        self.host: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> HttpEndpoints:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD_BYTES)
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = sockname[0], sockname[1]
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)
        return self

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=2.0)
        await self._server.wait_closed()
        self._server = None

    # ------------------------------------------------------------------ requests

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._clients.add(task)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            status, content_type, body, method = self._respond(head)
            headers = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
                       f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                       f"Connection: close\r\n\r\n").encode("latin-1")
            writer.write(headers if method == "HEAD" else headers + body)
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()

    def _respond(self, head: bytes) -> tuple[int, str, bytes, str]:
        try:
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, target, version = line.split(" ")
            if not version.startswith("HTTP/"):
                raise ValueError(version)
        except ValueError:
            return 400, _TEXT, b"bad request\n", "GET"
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"method not allowed\n", method
        if self.settle is not None and (path == "/metrics" or path == "/clients"):
            try:
                self.settle()
            except Exception:  # the counts are a batch behind; the scrape still answers
                log.exception("inspecting the waiting reads before %s failed", path)
        if path == "/metrics":
            try:
                return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry), method
            except Exception:
                log.exception("rendering /metrics failed")
                return 500, _TEXT, b"metrics failed\n", method
        if path == "/clients" and self.clients is not None:
            try:
                return 200, "application/json", json.dumps(self.clients()).encode(), method
            except Exception:
                log.exception("rendering /clients failed")
                return 500, _TEXT, b"clients failed\n", method
        if path == "/healthz":
            return 200, _TEXT, b"ok", method
        if path == "/readyz":
            try:
                answer = self.ready()
                ready, reason = answer if isinstance(answer, tuple) else (bool(answer), "")
            except Exception:
                log.exception("readiness check failed")
                ready, reason = False, "not ready: the readiness check failed"
            reason = reason or ("ready" if ready else "not ready")
            return (200 if ready else 503), _TEXT, reason.encode() + b"\n", method
        return 404, _TEXT, b"not found\n", method


__all__ = ["HttpEndpoints", "readiness_of"]
