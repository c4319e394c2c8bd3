"""Damaged captures (packets dropped, duplicated, reordered, cut by a small snaplen, started mid-stream).

Gaps are reported, every frame outside a gap or an unframed stretch is still found and
decoded, no frame is made up, nothing raises.
"""

from __future__ import annotations

import pytest

from tests.pcap import damage
from tests.pcap.helpers import reassemble

pytestmark = pytest.mark.integration
_MASK = 0xFFFFFFFF


def _spans(flows):
    """(client port, direction) -> {offset from the intact flow's ISN: (size, data)} plus the noted byte ranges."""
    return {(f.client_port, d): f for f in flows.values() for d in ("request", "response")}


def _compare(intact, damaged):
    """Frames of a damaged run against the intact run, by TCP position; returns (found, lost to notes)."""
    whole = _spans(intact)
    found = lost = 0
    for (port, direction), got in _spans(damaged).items():
        ref = whole.get((port, direction))
        assert ref is not None, f"flow from port {port} is not in the intact capture"
        if got.flow.streams[direction][0].isn is None:
            continue  # the capture starts after this direction's last byte
        base = ref.flow.streams[direction][0].isn
        rebase = (got.flow.streams[direction][0].isn - base) & _MASK
        reference = {off: (size, data) for off, size, data in ref.frames[direction]}
        for off, size, data in got.frames[direction]:
            at = (off + rebase) & _MASK
            # No frame is made up: each one is a frame of the intact capture, at the same place.
            assert reference.get(at) == (size, data), (port, direction, at, size)
        have = {(off + rebase) & _MASK for off, _, _ in got.frames[direction]}
        noted = [((off + rebase) & _MASK, count) for _, off, count in got.notes[direction]]
        starts = [(off + rebase) & _MASK for off, _, _ in got.frames[direction]] + [o for o, _ in noted]
        ends = [((off + rebase) & _MASK) + 4 + size for off, size, _ in got.frames[direction]] + \
            [o + n for o, n in noted]
        first, last = min(starts, default=None), max(ends, default=0)
        for off, (size, _) in reference.items():
            if off in have:
                found += 1
                continue
            inside = any(start < off + 4 + size and off < start + count for start, count in noted)
            before = first is None or off < first  # a capture started mid-stream never had it
            # Lost after the last byte the capture shows of this direction, with no ACK or FIN after
            # it to tell it was ever sent: no capture reader can know of it.
            after = off >= last
            assert inside or before or after, \
                f"port {port} {direction}: the frame at {off} ({size} bytes) was lost unreported"
            lost += 1
    return found, lost


@pytest.fixture(scope="module")
def intact(recorded):
    flows, stats, decoded = reassemble(recorded["pcap"], [recorded["port"]])
    assert stats.frames > 200 and decoded.decode_errors == 0
    return flows, stats, decoded


@pytest.mark.parametrize("how", ["duplicate", "reorder"])
def test_duplicates_and_reordering_change_nothing(recorded, intact, tmp_path, how):
    path = getattr(damage, how)(recorded["pcap"], tmp_path / f"{how}.pcap")
    flows, stats, decoded = reassemble(path, [recorded["port"]])
    assert stats.gaps == 0 and stats.resyncs == 0
    assert stats.frames == intact[1].frames and decoded.decode_errors == 0
    # Pairing is as in the intact capture: a response is never seen before its request.
    assert decoded.unpaired_responses == intact[2].unpaired_responses
    found, lost = _compare(intact[0], flows)
    assert lost == 0 and found == intact[1].frames
    if how == "duplicate":
        assert stats.retransmitted_bytes > intact[1].retransmitted_bytes


@pytest.mark.parametrize("how", ["drop", "snaplen", "start_midway"])
def test_losses_are_reported_and_the_rest_decodes(recorded, intact, tmp_path, how):
    if how == "start_midway":
        # Flows whose SYN is gone regain framing on a plausible header. A cut that falls where every such flow's
        # next packet starts a frame needs no resync (seen once in CI): a later cut then does.
        for fraction in (0.3, 0.45, 0.6):
            path = damage.start_midway(recorded["pcap"], tmp_path / f"{how}-{fraction}.pcap", fraction)
            flows, stats, decoded = reassemble(path, [recorded["port"]])
            if stats.resyncs > 0:
                break
        assert stats.resyncs > 0
    else:
        path = getattr(damage, how)(recorded["pcap"], tmp_path / f"{how}.pcap")
        flows, stats, decoded = reassemble(path, [recorded["port"]])
        assert stats.gaps > 0 and stats.gap_bytes > 0
    found, lost = _compare(intact[0], flows)
    assert found > 0 and lost > 0, (found, lost)
    # Every frame kinspect still frames decodes: a request whole, a response when its request was seen.
    assert decoded.decode_errors == 0, [r for f in flows.values() for r in f.records if r.get("error")][:3]
    assert decoded.frames == stats.frames
