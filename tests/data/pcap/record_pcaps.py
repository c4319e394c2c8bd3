"""Records the small pcaps of tests/data/pcap: recorded Kafka conversations replayed over loopback TCP under tcpdump.

Usage (as root, tcpdump and editcap installed)::

    .venv/bin/python tests/data/pcap/record_pcaps.py [--out tests/data/pcap]

The conversations are tests/data/traffic/kafka_python (kafka-python against Tansu, recorded
by a relay). Each connection is replayed over a fresh TCP connection: the client socket
sends a request frame, the server socket reads it and answers with the recorded response
of the same correlation id (none for acks=0), and so on. tcpdump writes what crossed:

  ipv4-ethernet.pcap    tcpdump -i lo, 127.0.0.1          (pcap, Ethernet)
  ipv6-sll2.pcap        tcpdump -i any, ::1               (pcap, Linux cooked v2)
  ipv4-sll.pcap         tcpdump -i any -y LINUX_SLL       (pcap, Linux cooked v1)
  ipv6-ethernet.pcapng  tcpdump -i lo, ::1, then editcap -F pcapng
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.pcap.recording import Tcpdump  # noqa: E402

TRAFFIC = ROOT / "tests" / "data" / "traffic" / "kafka_python"


def frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(data):
        size = struct.unpack_from(">i", data, pos)[0]
        out.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return out


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def replay(host: str, family: int, port: int, connections: list[tuple[bytes, bytes]]) -> int:
    """Each conversation over its own connection to a listener on port; returns the frames sent."""
    sent = 0
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen()
        for requests, responses in connections:
            answers: dict[int, list[bytes]] = {}
            for frame in frames(responses):
                answers.setdefault(struct.unpack_from(">i", frame, 4)[0], []).append(frame)
            client = socket.create_connection((host, port))
            server, _ = listener.accept()
            with client, server:
                for frame in frames(requests):
                    client.sendall(frame)
                    _read_exact(server, len(frame))
                    for answer in answers.pop(struct.unpack_from(">i", frame, 8)[0], [])[:1]:
                        server.sendall(answer)
                        _read_exact(client, len(answer))
                    sent += 1
                client.shutdown(socket.SHUT_WR)
                server.shutdown(socket.SHUT_WR)
                assert client.recv(1) == b"" and server.recv(1) == b""
    return sent


def _free_port(host: str, family: int) -> int:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def conversations() -> list[tuple[bytes, bytes]]:
    out = []
    for requests in sorted(TRAFFIC.glob("*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        out.append((requests.read_bytes(), responses.read_bytes() if responses.exists() else b""))
    return out


def record_all(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    convs = conversations()
    made = {}
    plan = [
        ("ipv4-ethernet.pcap", "127.0.0.1", socket.AF_INET, "lo", ()),
        ("ipv6-sll2.pcap", "::1", socket.AF_INET6, "any", ()),
        ("ipv4-sll.pcap", "127.0.0.1", socket.AF_INET, "any", ("-y", "LINUX_SLL")),
        ("ipv6-ethernet.pcapng", "::1", socket.AF_INET6, "lo", ()),
    ]
    for name, host, family, interface, extra in plan:
        port = _free_port(host, family)
        target = out / name
        raw = target.with_suffix(".pcap.tmp") if name.endswith(".pcapng") else target
        with Tcpdump(raw, port, interface=interface, extra=extra) as dump:
            sent = replay(host, family, port, convs)
        if raw != target:
            subprocess.run([shutil.which("editcap") or "editcap", "-F", "pcapng", str(raw), str(target)], check=True)
            raw.unlink()
        made[name] = {"port": port, "frames_sent": sent, "packets": dump.captured}
        dump.stderr.unlink()
    (out / "pcaps.json").write_text(json.dumps(made, indent=2) + "\n")
    return made


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    print(json.dumps(record_all(parser.parse_args().out), indent=2))
