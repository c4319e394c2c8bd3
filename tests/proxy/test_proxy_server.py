"""ProxyServer set-up without traffic: modes, config errors, and what inspection copies."""

from __future__ import annotations

import pytest

from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.proxy.observers import Dispatcher
from tests.support.event_log import EventLog
from kinspect.proxy.problem_log import ProblemLog
from kinspect.proxy.server import ProxyServer
from kinspect.protocol.framing.stream import HOLD, KEEP_HEAD, KEEP_PIECES, KEEP_WHOLE


def _server(overrides: dict, observers=()) -> ProxyServer:
    return ProxyServer(load_config(None, overrides), Codec(), Dispatcher(observers))


PASSTHROUGH = {"proxy.listen": "127.0.0.1:0", "proxy.upstream": "127.0.0.1:9092"}


def test_bodies_are_kept_only_when_an_observer_reads_them():
    heads = _server(PASSTHROUGH, [ProblemLog()]).plan
    assert heads.request_mode(3, 12) == KEEP_HEAD and heads.response_mode(3, 12) == KEEP_HEAD
    # The session itself reads SASL handshakes and KIP-511 client software, whoever observes.
    assert heads.request_mode(17, 0) == KEEP_WHOLE and heads.request_mode(18, 3) == KEEP_WHOLE
    assert _server(PASSTHROUGH, [ProblemLog(), EventLog()]).plan.response_mode(3, 12) == KEEP_WHOLE

    class Unknown:  # an observer that does not say is assumed to read bodies
        def on_event(self, event):
            pass

    assert _server(PASSTHROUGH, [Unknown()]).plan.request_mode(0, 9) == KEEP_PIECES  # Produce: whole, in its reads

    class Picky:  # an observer that says per frame kind
        def wants_body(self, api_key, version, direction):
            return api_key == 0 and direction == "request"

        def on_event(self, event):
            pass

    picky = _server(PASSTHROUGH, [ProblemLog(), Picky()]).plan
    assert picky.request_mode(0, 9) == KEEP_PIECES and picky.response_mode(0, 9) == KEEP_HEAD


def test_rewrite_mode_holds_only_responses_that_carry_addresses():
    rewrite = {"proxy.mode": "rewrite", "proxy.listen": "127.0.0.1:0", "proxy.bootstrap_servers": ["b:1"],
               "proxy.node_port_base": 20000}
    plan = _server(rewrite, [ProblemLog()]).plan
    assert plan.response_mode(3, 12) == HOLD and plan.response_mode(10, 4) == HOLD
    # ApiVersions answers, to offer Fetch up to proxy.fetch_max_version (15): never a Fetch response to hold
    assert plan.response_mode(18, 3) == HOLD and plan.response_mode(1, 15) == KEEP_HEAD
    assert plan.response_mode(1, 16) == HOLD  # a client that fetches at v16 all the same
    uncapped = _server({**rewrite, "proxy.fetch_max_version": 0}, [ProblemLog()]).plan
    assert uncapped.response_mode(18, 3) == KEEP_HEAD and uncapped.response_mode(1, 16) == HOLD


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


def test_dispatcher_calls_an_observers_handlers_and_on_event_for_the_rest():
    from kinspect.session import ConnectionInfo, Problem

    calls = []

    class Split:
        event_types = (Problem,)

        def __init__(self):
            self.handlers = {Problem: lambda e: calls.append(("handler", e.kind))}

        def on_event(self, event):
            calls.append(("on_event", event.kind))

    class Plain:
        def on_event(self, event):
            calls.append(("plain", event.kind))

    class Broken:
        handlers = {Problem: lambda e: 1 / 0}

        def on_event(self, event):
            raise AssertionError("its handler is called instead")

    dispatcher = Dispatcher([Split(), Plain(), Broken()])
    dispatcher.dispatch([Problem(ConnectionInfo(1, "c", "b"), 0.0, "unknown_api", "request", "x")])
    assert calls == [("handler", "unknown_api"), ("plain", "unknown_api")]
    assert dispatcher.failures == 1
