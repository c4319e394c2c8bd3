"""Capture formats and link types: every recorded pcap yields the recorded conversations' frames, byte for byte."""

from __future__ import annotations

import json
import struct

import dpkt
import pytest

from kinspect.pcap.reader import PacketReader
from tests.pcap.helpers import reassemble
from tests.support.paths import ROOT

DATA = ROOT / "tests" / "data" / "pcap"
TRAFFIC = ROOT / "tests" / "data" / "traffic" / "kafka_python"
PCAPS = json.loads((DATA / "pcaps.json").read_text())


def _expected_requests() -> list[bytes]:
    return [p.read_bytes() for p in sorted(TRAFFIC.glob("*.requests.bin"))]


def _check(path, port):
    flows, stats, decoded = reassemble(path, [port])
    assert stats.gaps == 0 and stats.discarded_bytes == 0 and stats.resyncs == 0
    assert decoded.decode_errors == 0
    # Tansu answered one Produce with acks=0 in the recording: decoded, with the warning `kinspect decode` gives.
    answered = [r for f in flows.values() for r in f.records if "acks=0" in r.get("warning", "")]
    assert len(answered) == 1 and answered[0]["api_name"] == "Produce" and decoded.unpaired_responses == 0
    ordered = sorted(flows.values(), key=lambda f: f.flow.id)
    # The replay sent the conversations in order, one connection each: the flows are the same, in order.
    assert [f.stream("request") for f in ordered] == _expected_requests()
    assert stats.frames == PCAPS[path.name if path.name in PCAPS else "ipv4-ethernet.pcap"]["frames_sent"] * 2
    return ordered


@pytest.mark.parametrize("name", sorted(PCAPS))
def test_recorded_formats_and_link_types(name):
    path = DATA / name
    flows = _check(path, PCAPS[name]["port"])
    with PacketReader(path) as reader:
        expected = {"ipv4-ethernet.pcap": 1, "ipv4-sll.pcap": 113, "ipv6-sll2.pcap": 276, "ipv6-ethernet.pcapng": 1}
        assert reader.link_type == expected[name]
        assert reader.format == ("pcapng" if name.endswith(".pcapng") else "pcap")
    host = "[::1]" if name.startswith("ipv6") else "127.0.0.1"
    assert all(f.flow.name.endswith(f"->{host}:{PCAPS[name]['port']}") for f in flows)
    assert all(f.flow.direction_from == "syn" for f in flows)


def _relink(tmp_path, linktype: int, header) -> object:
    """ipv4-ethernet.pcap with each Ethernet header replaced (BSD loopback and raw IP cannot be captured on Linux)."""
    out = tmp_path / f"linktype{linktype}.pcap"
    with open(DATA / "ipv4-ethernet.pcap", "rb") as f, open(out, "wb") as g:
        writer = dpkt.pcap.Writer(g, linktype=linktype, snaplen=262144)
        for ts, buf in dpkt.pcap.Reader(f):
            writer.writepkt(header + buf[14:], ts)
    return out


@pytest.mark.parametrize("linktype,header", [
    (0, struct.pack("<I", 2)),     # BSD loopback (null), little-endian host
    (0, struct.pack(">I", 2)),     # ... written on a big-endian host
    (108, struct.pack(">I", 2)),   # OpenBSD loopback
    (101, b""),                    # raw IP
    (228, b""),                    # raw IPv4
])
def test_loopback_and_raw_ip_link_types(tmp_path, linktype, header):
    _check(_relink(tmp_path, linktype, header), PCAPS["ipv4-ethernet.pcap"]["port"])


def test_direction_without_syn_or_port(tmp_path):
    """Flows whose start was never seen and no --port: the side whose bytes read as requests is the client."""
    out = tmp_path / "nosyn.pcap"
    with open(DATA / "ipv4-ethernet.pcap", "rb") as f, open(out, "wb") as g:
        writer = dpkt.pcap.Writer(g, linktype=1, snaplen=262144)
        for ts, buf in dpkt.pcap.Reader(f):
            if not dpkt.ethernet.Ethernet(buf).data.data.flags & dpkt.tcp.TH_SYN:
                writer.writepkt(buf, ts)
    flows, stats, decoded = reassemble(out)
    port = PCAPS["ipv4-ethernet.pcap"]["port"]
    with_frames = [f for f in flows.values() if f.frames["request"]]
    assert with_frames and all(f.flow.broker[1] == port for f in with_frames)
    assert all(f.flow.direction_from in ("requests", "guess") for f in flows.values())
    assert stats.guessed_directions == stats.flows
    assert decoded.decode_errors == 0
    assert stats.frames >= 0.9 * PCAPS["ipv4-ethernet.pcap"]["frames_sent"] * 2
