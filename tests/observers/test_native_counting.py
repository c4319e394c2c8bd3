"""The metrics' counting in C (observers._counting): it counts the common events itself, and leaks nothing.

That it counts what the Python handlers count is test_metrics_equivalence's: the /metrics text of
both against the prometheus_client reference, on recorded and made-up traffic.
"""

from __future__ import annotations

import pytest

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Session
from tests.observers.test_metrics_equivalence import metadata_response, recorded
from tests.support.native import bytes_grown, native_module
from tests.support.proxy_harness import metadata

_counting, _MISSING = native_module("kinspect.observers._counting")


class CountingCalls(MetricsObserver):
    """Counts the events its Python handlers get: what the C counting gave back."""

    def __init__(self, **settings) -> None:
        self.python_calls = 0
        super().__init__(**settings)
        if type(self.handlers[next(iter(self.handlers))]).__name__ != "builtin_function_or_method":
            pytest.fail("kinspect.observers._counting is not built: reinstall with a C compiler")

    def _request(self, e):
        self.python_calls += 1
        super()._request(e)

    def _response(self, e):
        self.python_calls += 1
        super()._response(e)

    def _exchange(self, e):
        self.python_calls += 1
        super()._exchange(e)


def replay(codec: Codec, observer, conversations) -> int:
    counted = 0
    for n, steps in enumerate(conversations):
        session = Session(codec, ConnectionInfo(n, f"client-{n}", "broker"))
        for client, broker in steps:
            events = session.client_data(client, 0.0).events + session.broker_data(broker, 0.001).events
            for e in events:
                observer.on_event(e)
            counted += sum(type(e).__name__ in ("Request", "Response", "Exchange") for e in events)
    return counted


def test_the_c_counting_counts_the_common_events_itself(codec: Codec):
    observer = CountingCalls()
    counted = replay(codec, observer, recorded())
    # Python gets the first event of each (api, version, direction) (it makes the plan) and the rare ones
    # (header tagged fields, an exchange of an api without a latency cell yet).
    assert counted > 700
    assert observer.python_calls < 0.2 * counted, (observer.python_calls, counted)


def test_many_events_leave_no_garbage(codec: Codec):
    observer = MetricsObserver()
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    steps = [(metadata(codec, cid, ["t"]), metadata_response(codec, cid, {"t": cid % 3})) for cid in range(3000)]

    def rounds():
        for client, broker in steps:
            for e in session.client_data(client, 0.0).events + session.broker_data(broker, 0.001).events:
                observer.on_event(e)

    grown = bytes_grown(rounds)
    assert grown < 64 * 1024, grown
    assert observer.registry.get_sample_value("kinspect_requests_total", {"api": "Metadata", "version": "12"}) == 12000
