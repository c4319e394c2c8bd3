"""Exchanges whose bodies share one scan (the metrics' memo) give the facts a fresh read gives."""

from __future__ import annotations

from kinspect.capture.facts import FactsTaker
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session
from tests.support.paths import TRAFFIC


def test_shared_scans_give_the_same_facts(codec: Codec):
    taker = FactsTaker(codec)  # before any scan: scans count integer fields from here on
    metrics = MetricsObserver()
    shared = fresh = 0
    for requests in sorted(TRAFFIC.glob("*/*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        for _ in range(2):  # the same conversation twice: its bodies repeat
            session = Session(codec, ConnectionInfo(1, "c:1", "b:1"))
            events = session.client_data(requests.read_bytes(), 1.0).events
            events += session.broker_data(responses.read_bytes(), 2.0).events
            for event in events:
                if type(event).__name__ in ("Request", "Response"):
                    metrics.handlers[type(event)](event)
            for event in events:
                if type(event) is Exchange:
                    scans = [e._scanned for e in (event.request, event.response) if e is not None]
                    got = taker.take(event)
                    assert got == FactsTaker(codec).take(event)
                    shared += any(s is not None for s in scans)
                    fresh += 1
    assert fresh > 200 and shared > 100
