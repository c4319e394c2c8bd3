"""Idle memory: how much resident memory a proxy holds per open, idle client connection."""

from __future__ import annotations

import socket
import time

from proc_cpu import open_fds, rss_kib

CHUNK = 100  # connections opened, then answered, at a time: the listener's backlog is never overrun


def _read_frame(sock: socket.socket) -> None:
    need, got = 4, bytearray()
    while len(got) < need:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the proxy")
        got += data
        if len(got) >= 4:
            need = 4 + int.from_bytes(got[:4], "big")


def measure_idle(port: int, proxy_pid: int, count: int, frame: bytes, host: str = "127.0.0.1",
                 settle_s: float = 10.0) -> dict:
    """Open `count` connections through the proxy, each answering one request (`frame`), then idle.

    Each connection does what every Kafka client does first (one ApiVersions) so that the proxy
    holds its per-connection state and its broker connection; then nothing more is sent.
    RSS per connection = (RSS with every connection open - RSS before) / count.
    """
    socks: list[socket.socket] = []
    warm = socket.create_connection((host, port), timeout=10)
    warm.sendall(frame)
    _read_frame(warm)
    warm.close()
    fds0, rss0 = open_fds(proxy_pid), rss_kib(proxy_pid)
    t0 = time.perf_counter()
    try:
        while len(socks) < count:
            chunk = [socket.create_connection((host, port), timeout=30) for _ in range(min(CHUNK, count - len(socks)))]
            socks.extend(chunk)
            for sock in chunk:
                sock.sendall(frame)
            for sock in chunk:
                _read_frame(sock)
        opened_s = time.perf_counter() - t0
        # RSS settles once the proxy has handled every connection: poll until it stops moving.
        deadline = time.monotonic() + settle_s
        last = rss_kib(proxy_pid)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = rss_kib(proxy_pid)
            if now == last:
                break
            last = now
        rss1, fds1 = rss_kib(proxy_pid), open_fds(proxy_pid)
    finally:
        for sock in socks:
            sock.close()
    return {
        "connections": count, "rss_before_kib": rss0, "rss_after_kib": rss1,
        "kib_per_connection": (rss1 - rss0) / count, "proxy_fds_before": fds0, "proxy_fds_after": fds1,
        "open_seconds": opened_s,
    }
