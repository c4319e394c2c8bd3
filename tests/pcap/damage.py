"""Damaged copies of a capture: whole packet records dropped, duplicated, reordered or skipped at the start (dpkt)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import dpkt


def _rewrite(src: Path, dst: Path, change) -> Path:
    with open(src, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        link, snaplen = reader.datalink(), reader.snaplen
        records = list(reader)
    with open(dst, "wb") as f:
        writer = dpkt.pcap.Writer(f, snaplen=snaplen, linktype=link)
        for ts, buf in change(records):
            writer.writepkt(buf, ts)
    return dst


def drop(src: Path, dst: Path, every: int = 25) -> Path:
    return _rewrite(src, dst, lambda rs: [r for i, r in enumerate(rs) if i % every != every - 1])


def duplicate(src: Path, dst: Path, every: int = 7) -> Path:
    return _rewrite(src, dst, lambda rs: [x for i, r in enumerate(rs) for x in ([r, r] if i % every == 0 else [r])])


def reorder(src: Path, dst: Path, every: int = 5) -> Path:
    def swap(rs):
        rs = list(rs)
        for i in range(0, len(rs) - 1, every):
            rs[i], rs[i + 1] = rs[i + 1], rs[i]
        return rs
    return _rewrite(src, dst, swap)


def start_midway(src: Path, dst: Path, fraction: float = 0.3) -> Path:
    return _rewrite(src, dst, lambda rs: rs[int(len(rs) * fraction):])


def snaplen(src: Path, dst: Path, length: int = 200) -> Path:
    """editcap -s: every packet cut to `length` bytes, as tcpdump -s would have captured it."""
    subprocess.run([shutil.which("editcap") or "editcap", "-s", str(length), str(src), str(dst)], check=True,
                   capture_output=True)
    return dst
