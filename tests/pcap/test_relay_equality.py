"""Every frame kinspect reassembles from a tcpdump capture equals the relay's bytes, in order, per connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pcap.helpers import reassemble

pytestmark = pytest.mark.integration


def _relay_connections(relay_dir: Path) -> list[tuple[bytes, bytes]]:
    connections = []
    for requests in sorted(relay_dir.glob("*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        connections.append((requests.read_bytes(), responses.read_bytes() if responses.exists() else b""))
    return connections


def _agree(a: bytes, b: bytes) -> bool:
    return a.startswith(b) or b.startswith(a)


def test_frames_equal_the_relays_bytes(recorded):
    flows, stats, decoded = reassemble(recorded["pcap"], [recorded["port"]])
    assert stats.gaps == 0 and stats.resyncs == 0, stats
    relay = _relay_connections(recorded["relay_dir"])
    unused = list(range(len(relay)))
    exact = frames = 0
    client_ids = set()
    for got in sorted(flows.values(), key=lambda f: f.flow.id):
        requests, responses = got.stream("request"), got.stream("response")
        if not requests and not responses:
            continue
        # The relay numbers connections in accept order, which tcpdump does not show: match by content.
        match = next((i for i in unused if _agree(requests, relay[i][0]) and _agree(responses, relay[i][1])), None)
        assert match is not None, f"{got.flow.name}: no relayed connection carries these frames"
        unused.remove(match)
        frames += len(got.frames["request"]) + len(got.frames["response"])
        for direction, notes in got.notes.items():
            # Only a frame still incomplete when the flow ended may be left unframed.
            assert all(kind == "discarded" for kind, _, _ in notes) and len(notes) <= 1, (got.flow.name, notes)
        if (requests, responses) == relay[match]:
            exact += 1
        else:
            # The relay records what it wrote into a socket; a connection torn down (RST, or a
            # peer gone before reading) never put those last bytes on the wire for tcpdump to see.
            assert got.flow.reset or len(got.flow.fins) < 2, got.flow.name
        client_ids |= {r.get("client_id") for r in got.records if r.get("direction") == "request"}
    assert not [i for i in unused if relay[i] != (b"", b"")], "relayed connections missing from the capture"
    assert {"pcap-confluent", "pcap-kafka-python", "pcap-aiokafka"} <= client_ids
    assert exact >= 0.8 * (len(relay)) and frames > 200, (exact, len(relay), frames)
    assert decoded.decode_errors == 0


def test_memory_is_bounded_by_the_inspection_limit(recorded):
    """Frames over inspect_max_bytes are kept by their head only: the peak stays near the limit, not the frames."""
    import tracemalloc

    from kinspect.config import InspectConfig
    from kinspect.pcap.pipeline import inspect_pcap
    from kinspect.protocol.codec import Codec

    class Nothing:
        def frame_events(self, *args):
            pass

        stream_note = flow_closed = frame_events

    def sizes(stream: bytes):
        pos = 0
        while pos + 4 <= len(stream):
            size = int.from_bytes(stream[pos:pos + 4], "big")
            yield size
            pos += 4 + size

    largest = max(size for pair in _relay_connections(recorded["relay_dir"]) for b in pair for size in sizes(b))
    limits = InspectConfig(inspect_max_bytes=256 * 1024)
    assert largest > 5 * limits.inspect_max_bytes  # frames that kept whole would not fit the bound below
    codec = Codec()
    inspect_pcap(recorded["pcap"], codec, limits, Nothing(), [recorded["port"]])  # the codec compiles its decoders
    tracemalloc.start()
    try:
        stats, _ = inspect_pcap(recorded["pcap"], codec, limits, Nothing(), [recorded["port"]])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats.frames > 200
    assert peak < 5 * limits.inspect_max_bytes, peak
