"""What tests of relays without sockets share: a transport that keeps what was written, an event's facts as a tuple
to compare, the /metrics lines that depend on the traffic alone, and the recorded conversations played as reads."""

from __future__ import annotations

import itertools
import random

from kinspect.session import Exchange, Problem, Request, Response
from kinspect.session.events import frame_bytes
from tests.support.paths import TRAFFIC
from tests.support.proxy_harness import stream_frames

# Every recorded client connection: its requests, beside a .responses.bin of the broker's answers.
CONVERSATIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


class RecordingTransport:
    """A transport stub for Relay: what is written is kept, as bytes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data) -> None:
        self.sent.append(bytes(data))

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, key):
        return ("127.0.0.1", 1) if key == "peername" else None


# The process's own state, not the traffic's: the loop, the process and its collector, and the CPU time the
# inspection took (none is counted when reads are inspected at once).
PROCESS_STATE = ("kinspect_event_loop_", "process_", "python_gc_", "kinspect_inspection_cpu_seconds")


def traffic_lines(metrics_text: str) -> list[str]:
    """The samples of a /metrics text that two runs given the same traffic must share (no comments, no
    process state, no wall-clock times at which series were created)."""
    return [line for line in metrics_text.splitlines()
            if not line.startswith(PROCESS_STATE) and "_created" not in line.split(" ")[0] and not line.startswith("# ")]


def event_fact(event) -> tuple:
    """What an observer can read of an event (a frame let go of after the observers saw it: None)."""
    if isinstance(event, (Request, Response)):
        frame = None if event.frame is None else frame_bytes(event.frame)
        tags = (event.header_tags,) if isinstance(event, Request) else ()
        return (type(event).__name__, event.time, event.offset, event.api_key, event.api_version,
                event.correlation_id, event.size, *tags, event.complete, frame)
    if isinstance(event, Exchange):
        return ("Exchange", event.request.correlation_id, event.latency)
    assert isinstance(event, Problem)
    return ("Problem", event.time, event.kind, event.direction, event.detail)


def conversation(path) -> tuple[bytes, bytes]:
    """A recorded connection's requests and responses."""
    return path.read_bytes(), path.with_name(path.name.replace("requests", "responses")).read_bytes()


def longest() -> tuple[bytes, bytes]:
    """The recorded conversation of the most requests."""
    return max((conversation(p) for p in CONVERSATIONS), key=lambda c: len(stream_frames(c[0])))


def cut(frame: bytes, rng: random.Random, most: int) -> list[bytes]:
    """A frame cut into reads of 1..most bytes."""
    out, pos = [], 0
    while pos < len(frame):
        size = rng.randint(1, most)
        out.append(frame[pos:pos + size])
        pos += size
    return out


def play(relay, requests: bytes, responses: bytes, how: str, rng: random.Random) -> None:
    """A conversation as a relay's reads: "streams" (every request in one read, then every response), "frames"
    (each request, then its response, a read each), or each frame cut into reads of 1..N bytes (how = "N")."""
    if how == "streams":
        relay.client.data_received(requests)
        relay.broker.data_received(responses)
        return
    most = None if how == "frames" else int(how)
    for q, r in itertools.zip_longest(stream_frames(requests), stream_frames(responses)):
        for frame, read in ((q, relay.client.data_received), (r, relay.broker.data_received)):
            if frame is not None:
                for piece in ([frame] if most is None else cut(frame, rng, most)):
                    read(piece)
