"""ProxyServer set-up without traffic: modes, config errors, and what inspection copies."""

from __future__ import annotations

import pytest

from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.proxy.observers import Dispatcher, EventLog
from kinspect.proxy.problem_log import ProblemLog
from kinspect.proxy.server import HEAD_BYTES, ProxyServer


def _server(overrides: dict, observers=()) -> ProxyServer:
    return ProxyServer(load_config(None, overrides), Codec(), Dispatcher(observers))


PASSTHROUGH = {"proxy.listen": "127.0.0.1:0", "proxy.upstream": "127.0.0.1:9092"}


def test_bodies_are_kept_only_when_an_observer_reads_them():
    assert _server(PASSTHROUGH, [ProblemLog()]).session_config.inspect_max_bytes == HEAD_BYTES
    assert _server(PASSTHROUGH, [ProblemLog(), EventLog()]).session_config.inspect_max_bytes == 1024 * 1024

    class Unknown:  # an observer that does not say is assumed to read bodies
        def on_event(self, event):
            pass

    assert _server(PASSTHROUGH, [Unknown()]).session_config.inspect_max_bytes == 1024 * 1024


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"proxy.listen": "127.0.0.1:0"}, "proxy.upstream is required"),
        ({"proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0"}, "proxy.bootstrap_servers is required"),
        ({**PASSTHROUGH, "proxy.routes": ["127.0.0.1:1"]}, "is not LISTEN=UPSTREAM"),
        ({**PASSTHROUGH, "proxy.listen": "nonsense"}, "is not HOST:PORT"),
        ({"proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0", "proxy.bootstrap_servers": ["b:1"],
          "proxy.upstream_map": {"a:1": "b"}}, "is not HOST:PORT"),
    ],
)
def test_configuration_errors_name_the_key(overrides, problem):
    with pytest.raises(ValueError, match=problem):
        _server(overrides)
