"""Capture files (pcap, pcapng) to TCP segments, with dpkt doing every format and link-layer parse."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import dpkt
import dpkt.loopback
import dpkt.pcapng
import dpkt.sll
import dpkt.sll2

PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

# Link types dpkt parses down to IP, by their LINKTYPE_ number (pcap header / pcapng IDB).
_LINK_TYPES = {
    0: ("BSD loopback", dpkt.loopback.Loopback),
    1: ("Ethernet", dpkt.ethernet.Ethernet),
    108: ("OpenBSD loopback", dpkt.loopback.Loopback),
    113: ("Linux cooked (SLL)", dpkt.sll.SLL),
    276: ("Linux cooked v2 (SLL2)", dpkt.sll2.SLL2),
    # Raw IP: no link header at all, the IP version nibble tells IPv4 from IPv6.
    12: ("raw IP", None), 14: ("raw IP", None), 101: ("raw IP", None),
    228: ("raw IPv4", dpkt.ip.IP), 229: ("raw IPv6", dpkt.ip6.IP6),
}

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = dpkt.tcp.TH_FIN, dpkt.tcp.TH_SYN, dpkt.tcp.TH_RST, dpkt.tcp.TH_ACK


class CaptureError(Exception):
    """The file cannot be read as a packet capture (the message is one line for the user)."""


@dataclass(slots=True)
class Segment:
    """One TCP segment: addresses as packed bytes, `missing` payload bytes the capture cut (snaplen)."""

    time: float
    src: bytes
    sport: int
    dst: bytes
    dport: int
    seq: int
    ack: int
    flags: int
    data: bytes
    missing: int


def _raw_ip(buf: bytes):
    return dpkt.ip6.IP6(buf) if buf[:1] and buf[0] >> 4 == 6 else dpkt.ip.IP(buf)


def address(packed: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(packed) == 16 else socket.AF_INET, packed)


class PacketReader:
    """Iterates the TCP segments of a capture file; counts what it skips.

    Counters: packets, segments, skipped (not TCP over IP, or IP fragments), malformed
    (dpkt could not parse the headers); `truncated` is set when the file ends inside a record.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise CaptureError(f"{path}: {exc.strerror}") from None
        try:
            magic = self._file.read(4)
            self._file.seek(0)
            if len(magic) < 4:
                raise CaptureError(f"{path}: too short to be a capture file ({len(magic)} bytes)")
            try:
                if magic == PCAPNG_MAGIC:
                    self.format = "pcapng"
                    self._reader = dpkt.pcapng.Reader(self._file)
                else:
                    self.format = "pcap"
                    self._reader = dpkt.pcap.Reader(self._file)
            except (ValueError, dpkt.NeedData, dpkt.UnpackError):
                raise CaptureError(
                    f"{path}: not a pcap or pcapng file (magic number {magic.hex()})") from None
            except Exception as exc:  # dpkt reads a damaged header in ways of its own
                raise CaptureError(f"{path}: cannot read the capture header ({exc})") from None
            self.link_type = self._reader.datalink()
            if self.link_type not in _LINK_TYPES:
                raise CaptureError(f"{path}: unsupported link type {self.link_type} "
                                   f"(supported: Ethernet, Linux cooked SLL/SLL2, BSD loopback, raw IP)")
        except BaseException:
            self._file.close()
            raise
        self.link_name, self._link = _LINK_TYPES[self.link_type]
        self.packets = self.segments_read = self.skipped = self.malformed = 0
        self.truncated = False

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> PacketReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def segments(self) -> Iterator[Segment]:
        link = self._link or _raw_ip
        strip = self._link is not None and self._link not in (dpkt.ip.IP, dpkt.ip6.IP6)  # a link header on top
        tcp_class, ip4_class = dpkt.tcp.TCP, dpkt.ip.IP
        records = iter(self._reader)
        while True:
            try:
                ts, buf = next(records)
            except StopIteration:
                return
            except (dpkt.NeedData, dpkt.UnpackError, ValueError, OverflowError):
                self.truncated = True  # the file ends (or breaks) inside a record header
                return
            self.packets += 1
            try:
                ip = link(buf).data if strip else link(buf)
            except (dpkt.NeedData, dpkt.UnpackError, ValueError, IndexError, KeyError):
                self.malformed += 1
                continue
            tcp = getattr(ip, "data", None)
            if type(tcp) is not tcp_class:
                self.skipped += 1  # not TCP, not IP, or a fragment dpkt left undecoded
                continue
            data = tcp.data
            # What the capture cut (snaplen): the IP length says how much was sent.
            sent = ip.len if type(ip) is ip4_class else (ip.plen + 40 if ip.plen else 0)
            missing = sent - len(ip) if sent else 0
            self.segments_read += 1
            yield Segment(float(ts), ip.src, tcp.sport, ip.dst, tcp.dport, tcp.seq, tcp.ack, tcp.flags, data,
                          missing if missing > 0 else 0)
