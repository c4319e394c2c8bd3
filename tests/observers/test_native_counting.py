"""The metrics' counting in C (observers._counting): it counts the common events itself, and leaks nothing.

That it counts what the Python handlers count is test_metrics_equivalence's: the /metrics text of
both against the prometheus_client reference, on recorded and made-up traffic.
"""

from __future__ import annotations

import random

import pytest

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from kinspect.session import ConnectionInfo, Session
from tests.observers.test_metrics_equivalence import metadata_response, recorded
from tests.support.native import bytes_grown, native_module
from tests.support.proxy_harness import metadata, request_frame

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


def _scan_outcomes(codec: Codec, conversations, count_first: bool, mutate) -> list:
    """Each event's scan (its facts, or the DecodeError's text), the C counting asked first or not."""
    observer = MetricsObserver(codec=codec)
    outcomes = []
    for n, steps in enumerate(conversations):
        session = Session(codec, ConnectionInfo(n, f"client-{n}", "broker"))
        for client, broker in steps:
            events = session.client_data(mutate(client), 0.0).events + session.broker_data(mutate(broker), 0.001).events
            for e in events:
                if count_first:
                    observer.on_event(e)  # the counting scans what it counts (directly in C when it can)
                if type(e).__name__ in ("Request", "Response") and e.complete:
                    try:
                        scan = e.scan()
                        outcomes.append((scan.to_dict(), scan.int_slots, scan.topic_partitions))
                    except DecodeError as exc:
                        outcomes.append(("DecodeError", str(exc)))
    return outcomes


@pytest.mark.parametrize("integers", [False, True])
@pytest.mark.parametrize("flip", [0, 40])
def test_the_scans_the_counting_makes_are_the_events_own(integers, flip):
    """The counting calls the codec's C scan directly (as Request.scan and Response.scan do); the events' scans,
    good bodies and bodies with one byte in `flip` changed, are those the events make themselves."""
    def mutator():
        rng = random.Random(flip)  # the same changes for both runs

        def mutate(data: bytes) -> bytes:
            if not flip:
                return data
            data = bytearray(data)
            for _ in range(len(data) // flip):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        return mutate

    outcomes = []
    for count_first in (True, False):
        codec = Codec()
        codec.integer_facts = integers
        _scan_outcomes(codec, recorded(), False, lambda d: d)  # the codec's C scans made once, as in a proxy
        outcomes.append(_scan_outcomes(codec, recorded(), count_first, mutator()))
    assert len(outcomes[0]) > (100 if flip else 400)
    if flip:
        assert sum(o[0] == "DecodeError" for o in outcomes[0]) > 10
    assert outcomes[0] == outcomes[1]


def _memo_state(observer: MetricsObserver) -> list:
    """Each plan's memo as the trial sees it: lookups, hits, whether it still memoizes, and its bodies."""
    return [(direction, key, c.lookups, c.hits, c.memo is None, sorted(c.memo or ()))
            for direction, plans in (("request", observer._req), ("response", observer._resp))
            for key, c in sorted(plans.items())]


def test_the_memo_is_looked_up_as_the_reference_does(codec: Codec):
    """The C compares a body with the memo's last entry before it makes a key: the lookups and hits it counts, the
    entries it keeps and whether the memo stays on must be the reference's, through the memo's clearing (more
    distinct bodies than it holds) and the trial that switches it off (bodies that stop repeating)."""
    native, reference = MetricsObserver(), MetricsObserver(native=False)
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    rng = random.Random(39)
    cid = 0
    for phase, distinct in (("repeating", 1), ("a few", 3), ("more than it holds", 6), ("never again", 10**6)):
        for _ in range(400):
            cid += 1
            topics = {f"t{rng.randrange(distinct)}": 0}
            events = (session.client_data(metadata(codec, cid, list(topics)), 0.0).events
                      + session.broker_data(metadata_response(codec, cid, topics), 0.001).events)
            for e in events:
                native.on_event(e)
                reference.on_event(e)
        assert _memo_state(native) == _memo_state(reference), phase
    assert any(state[4] for state in _memo_state(reference)), "the trial never switched a memo off"


def test_each_version_counts_into_its_own_plan_and_new_plans_are_seen(codec: Codec):
    """The C counting remembers the plan it last found for an api: requests of two versions of one api,
    interleaved, still count each into its own series, and plans the Python adds or drops are seen."""
    observer = CountingCalls()
    session = Session(codec, ConnectionInfo(1, "c", "b"))
    versions = {0: 1, 1: 3, 2: 1, 3: 3, 4: 3, 5: 1} | {n: (1, 3)[n % 3 == 0] for n in range(6, 60)}
    for cid, version in versions.items():
        frame = request_frame(codec, 18, version, cid, {"ClientSoftwareName": "k", "ClientSoftwareVersion": "0"}
                              if version >= 3 else {})
        for e in session.client_data(frame, 0.0).events:
            observer.on_event(e)
    calls = observer.python_calls
    assert calls == 2  # the first request of each version made its plan; the C counted the rest

    def requests(version: int):
        return observer.registry.get_sample_value("kinspect_requests_total", {"api": "ApiVersions",
                                                                              "version": str(version)})

    counts = [sum(v == version for v in versions.values()) for version in (1, 3)]
    assert [requests(1), requests(3)] == counts
    last = versions[59]
    observer._req.clear()  # plans dropped: the next request, of the version last seen, goes to the Python again
    for e in session.client_data(request_frame(codec, 18, last, 99, {}), 0.0).events:
        observer.on_event(e)
    assert observer.python_calls == calls + 1
    assert requests(last) == sum(v == last for v in versions.values()) + 1
