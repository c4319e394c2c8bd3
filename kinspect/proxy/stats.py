"""A snapshot of the proxy server's state: what the metrics collector and the health endpoints read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ServerStats:
    connections_open: int
    connections_total: int
    connections_refused: int
    connections_limit: int
    bytes_from_clients: int  # received from clients (open and closed connections)
    bytes_from_brokers: int
    inflight: int  # requests awaiting a response, all connections
    inflight_limit: int  # per connection (inspect.max_inflight)
    connect_failures: dict = field(default_factory=dict)  # reason -> failed attempts to reach a broker
    inspection_failures: int = 0
    inspection_cpu_seconds: float = 0.0  # CPU time spent inspecting queued reads (inspect.batch_delay_ms > 0)
    tasks: int = 0  # asyncio tasks alive on the proxy's loop
    serving: bool = False  # every listener made is serving, and the server is not stopping
    upstream_reachable: bool | None = None  # outcome of the latest broker connect or probe; None before any
    upstream_checked_ago: float | None = None  # seconds since that outcome

    @property
    def ready(self) -> bool:
        """Serving, and the latest attempt to reach a broker (a client's or the readiness probe's) did not fail."""
        return self.serving and self.upstream_reachable is not False

    def readiness(self) -> str:
        """Why /readyz says what it says, in one line."""
        if not self.serving:
            return "not ready: the listeners are not serving (starting or stopping)"
        if self.upstream_reachable is None:
            return "ready (no broker has been tried yet)"
        if not self.upstream_reachable:
            return f"not ready: the latest attempt to reach a broker failed ({self.upstream_checked_ago:.0f} s ago)"
        return "ready"
