"""`kinspect decode --pcap` and `kinspect capture --pcap`: the records of `kinspect decode`, Parquet rows, bad input."""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from kinspect.cli.main import main
from tests.pcap.recording import Tcpdump
from tests.support.paths import ROOT

DATA = ROOT / "tests" / "data" / "pcap"
TRAFFIC = ROOT / "tests" / "data" / "traffic" / "kafka_python"
PCAP = DATA / "ipv4-ethernet.pcap"
PORT = json.loads((DATA / "pcaps.json").read_text())["ipv4-ethernet.pcap"]["port"]
PCAP_ONLY = ("flow", "connection", "time", "latency")


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, [json.loads(line) for line in out.splitlines()], err


def test_decode_pcap_prints_the_records_of_decode(capsys):
    code, records, err = _run(capsys, "decode", "--pcap", str(PCAP))
    assert code == 0, err
    assert "176 frames decoded, 0 failed" in err
    by_connection: dict = {}
    for r in records:
        by_connection.setdefault(r["connection"], []).append(r)
    assert list(by_connection) == sorted(by_connection)  # --by flow: flow after flow
    compared = 0
    for n, requests in enumerate(sorted(TRAFFIC.glob("*.requests.bin"))):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        _, offline, _ = _run(capsys, "decode", str(requests), str(responses))
        ours = [{k: v for k, v in r.items() if k not in PCAP_ONLY} for r in by_connection[n + 1]]
        assert ours == offline, requests.name
        compared += len(offline)
    assert compared == 176
    assert all(r["time"] > 1.6e9 for r in records)  # packet times: epoch seconds
    assert all(r["latency"] >= 0 for r in records if "latency" in r)


def test_decode_pcap_by_time_interleaves_by_packet_time(capsys):
    code, records, _ = _run(capsys, "decode", "--pcap", str(PCAP), "--by", "time", "--port", str(PORT))
    assert code == 0 and len(records) == 176
    times = [r["time"] for r in records]
    assert times == sorted(times)


def test_capture_pcap_writes_the_capture_schema(capsys, tmp_path):
    code = main(["capture", "--pcap", str(PCAP), "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 0, err
    rows = pq.read_table(tmp_path / "out").to_pylist()
    assert len(rows) == 88  # one row per request (acks=0 ones too)
    _, records, _ = _run(capsys, "decode", "--pcap", str(PCAP))
    request_times = sorted(round(r["time"] * 1e6) for r in records if r["direction"] == "request")
    assert sorted(round(r["request_time"].timestamp() * 1e6) for r in rows) == request_times
    answered = [r for r in rows if r["response_time"] is not None]
    assert answered and all(
        r["latency_us"] == round((r["response_time"] - r["request_time"]).total_seconds() * 1e6) for r in answered)
    assert {r["broker"] for r in rows} == {f"127.0.0.1:{PORT}"}


def test_the_capture_command_never_imports_pandas(capsys, tmp_path):
    """Run as the `kinspect` command, its process bars pandas, which pyarrow would import for nothing
    (capture.barred_imports); called from a program (this test's process), it leaves that program's imports alone."""
    import pandas  # noqa: F401 (installed here: only the bar keeps it out)

    from kinspect.capture.barred_imports import BarredImports

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "kinspect.cli.main", "capture", "--pcap",
                             str(PCAP), "--out", str(tmp_path / "command")], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    # (-X importtime lists the refused attempt at "pandas" too; an import would list its modules)
    assert "pyarrow.lib" in imported and not [name for name in imported if name.startswith("pandas.")]
    assert pq.read_table(tmp_path / "command").num_rows == 88
    assert main(["capture", "--pcap", str(PCAP), "--out", str(tmp_path / "called")]) == 0
    capsys.readouterr()
    assert not any(isinstance(finder, BarredImports) for finder in sys.meta_path)


def test_port_filter_with_no_kafka(capsys):
    code, records, err = _run(capsys, "decode", "--pcap", str(PCAP), "--port", "1")
    assert code == 1 and not records
    assert err.strip().splitlines()[-1] == f"kinspect: {PCAP}: no Kafka frames found on port 1"


def _one_line_error(capsys, *argv):
    code, _, err = _run(capsys, *argv)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kinspect: "), err
    return code, lines[0]


@pytest.mark.parametrize("command", ["decode", "capture"])
def test_bad_files_get_one_line(capsys, tmp_path, command):
    def run(path):
        extra = ["--out", str(tmp_path / "out")] if command == "capture" else []
        return _one_line_error(capsys, command, "--pcap", str(path), *extra)

    wrong = tmp_path / "wrong.pcap"
    wrong.write_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
    assert run(wrong) == (2, f"kinspect: {wrong}: not a pcap or pcapng file (magic number 47455420)")
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    assert run(empty)[0] == 2
    link = tmp_path / "usb.pcap"
    link.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 189))
    assert run(link) == (2, f"kinspect: {link}: unsupported link type 189 (supported: Ethernet, Linux cooked "
                            "SLL/SLL2, BSD loopback, raw IP)")
    missing = tmp_path / "missing.pcap"
    assert run(missing) == (2, f"kinspect: {missing}: No such file or directory")


def test_truncated_capture(capsys, tmp_path):
    data = PCAP.read_bytes()
    for cut in (24 + 10, len(data) // 2, len(data) - 7):  # inside a record header, mid-way, in the last packet
        path = tmp_path / f"cut{cut}.pcap"
        path.write_bytes(data[:cut])
        code, records, err = _run(capsys, "decode", "--pcap", str(path))
        if cut == 34:
            assert code == 1 and "no Kafka frames found" in err
        else:
            assert code == 0 and records, err
        if cut == 34:
            assert "the capture file ends inside a packet record (truncated)" in err
        else:  # a packet cut short reads as a snaplen cut: its missing bytes are a gap
            assert "gaps (" in err and "bytes not captured" in err, err


@pytest.mark.integration
def test_non_kafka_traffic_on_the_port(capsys, tmp_path):
    """HTTP, then 3 MB of random bytes, under tcpdump: no frame is made up, every byte is reported, exit 1."""
    path = tmp_path / "http.pcap"
    # The same random bytes every run: fresh ones make up a plausible frame now and then (a first size
    # prefix under 3 MB: about one run in 1,400), which kinspect then rightly reports as a frame that
    # failed to decode; CI failed once on that.
    noise = random.Random(20261125).randbytes(3 * 1024 * 1024)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with Tcpdump(path, port):
            client = socket.create_connection(("127.0.0.1", port))
            server, _ = listener.accept()
            with client, server:
                for _ in range(20):
                    client.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    server.recv(65536)
                    server.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                    client.recv(65536)
            client = socket.create_connection(("127.0.0.1", port))
            server, _ = listener.accept()
            with client, server:
                client.sendall(noise)
                client.shutdown(socket.SHUT_WR)
                got = 0
                while chunk := server.recv(1 << 20):
                    got += len(chunk)
                assert got == len(noise)
    for argv in (["--port", str(port)], []):  # with --port, and with every TCP flow read
        code, records, err = _run(capsys, "decode", "--pcap", str(path), *argv)
        assert code == 1, err
        assert err.strip().splitlines()[-1].startswith(f"kinspect: {path}: no Kafka frames found")
        assert "bytes not framed while regaining sync" in err
        assert not [r for r in records if "api_key" in r or "size" in r]
        discarded = sum(r.get("discarded", 0) for r in records)
        http = len(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n") + 43
        assert discarded == 20 * http + len(noise)
