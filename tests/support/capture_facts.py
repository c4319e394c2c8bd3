"""What tests of the capture's row building share: the recorded conversations' EXCHANGE tuples, and copies of a
row or a SIDE with some fields changed."""

from __future__ import annotations

from kinspect.capture.facts import FIELDS, FactsTaker
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Session
from tests.support.paths import TRAFFIC

AT = {name: i for i, name in enumerate(FIELDS)}
SIDE_FIELDS = ("tag_bytes", "tagged", "delta", "slots", "stats", "topics", "codes", "records")


def recorded_facts(codec: Codec) -> list[tuple]:
    """The EXCHANGE tuples of every recorded conversation (node ids on some connections, not on others)."""
    take = FactsTaker(codec).take
    facts = []
    for n, requests in enumerate(sorted(TRAFFIC.glob("*/*.requests.bin"))):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        session = Session(codec, ConnectionInfo(n, f"127.0.0.1:{4000 + n}", "127.0.0.1:9092",
                                                node_id=n if n % 2 else None))
        events = session.client_data(requests.read_bytes(), 1.0 + n).events
        events += session.broker_data(responses.read_bytes(), 1.5 + n).events
        events += session.close(2.0 + n)
        facts += [take(e)[0] for e in events if type(e) is Exchange]
    assert len(facts) > 200
    return facts


def with_fields(facts: tuple, **values) -> tuple:
    """An EXCHANGE tuple with the named fields (capture.facts.FIELDS) replaced."""
    out = list(facts)
    for name, value in values.items():
        out[AT[name]] = value
    return tuple(out)


def with_side(side: tuple, **values) -> tuple:
    """A SIDE tuple with the named fields (SIDE_FIELDS) replaced."""
    out = list(side)
    for name, value in values.items():
        out[SIDE_FIELDS.index(name)] = value
    return tuple(out)
