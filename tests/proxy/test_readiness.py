"""/readyz follows the broker: ready while it can be reached, 503 with the reason once it cannot;
connect failures of a retrying client are logged at a bounded rate, with what was held back counted."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest

from kinspect.proxy.log_limit import RateLimitedLog
from tests.support.proxy_harness import ProxyHarness, poll_until
from tests.support.tansu import TansuBroker

pytestmark = pytest.mark.integration


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_says_whether_the_broker_can_be_reached():
    broker = TansuBroker().start()
    proxy = ProxyHarness({"proxy.listen": "127.0.0.1:0", "proxy.upstream": broker.bootstrap,
                          "proxy.readiness_probe_interval": 0.2})
    try:
        proxy.start()
        port = proxy.call(_endpoints(proxy))
        assert poll_until(lambda: _readyz(port)[0] == 200, timeout=10)
        broker.stop()
        status, reason = poll_until(lambda: (lambda r: r if r[0] == 503 else None)(_readyz(port)), timeout=10)
        assert "latest attempt to reach a broker failed" in reason
    finally:
        proxy.stop()
        broker.stop()


async def _endpoints(proxy: ProxyHarness) -> int:
    from kinspect.observers.http_endpoints import HttpEndpoints, readiness_of
    from prometheus_client import CollectorRegistry

    endpoints = await HttpEndpoints(CollectorRegistry(), readiness_of(proxy.server)).start("127.0.0.1", 0)
    proxy.app.endpoints = endpoints  # closed with the app
    return endpoints.port


def test_repeated_warnings_are_bounded_and_counted(caplog):
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("kinspect.test"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="kinspect.test"):
        for second in range(25):  # a client retrying every second for 25 s
            now[0] = float(second)
            limited.warning("b:9092", "connection %d closed: no broker reachable", second)
        limited.warning("other:9092", "connection %d closed: no broker reachable", 99)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "connection 0 closed: no broker reachable",
        "connection 10 closed: no broker reachable (9 more like it in the last 10 s not logged)",
        "connection 20 closed: no broker reachable (9 more like it in the last 10 s not logged)",
        "connection 99 closed: no broker reachable",
    ]
