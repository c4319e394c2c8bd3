"""Records a pcap with tcpdump on loopback while real clients talk to Tansu through a recording relay."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.support.recording_relay import RecordingRelay
from tests.support.tansu import TansuBroker

TCPDUMP = shutil.which("tcpdump") or "/usr/bin/tcpdump"


class Tcpdump:
    """tcpdump -i lo -w FILE port P: started once it says it listens, stopped by SIGINT once its file is whole."""

    def __init__(self, path: Path, port: int, *, interface: str = "lo", extra: tuple = (), snaplen: int = 0) -> None:
        self.path = path
        self.cmd = [TCPDUMP, "-i", interface, "--immediate-mode", "-U", "-B", "262144", "-s", str(snaplen),
                    "-w", str(path), *extra, "tcp", "port", str(port)]
        self.stderr = path.with_suffix(".tcpdump.log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Tcpdump:
        self._log = open(self.stderr, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self._log)
        self._wait_for(lambda: b"listening on" in self.stderr.read_bytes(), "start listening")
        return self

    def _wait_for(self, condition, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None and what == "start listening":
                raise RuntimeError(f"tcpdump exited: {self.stderr.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                log = self.stderr.read_text(errors="replace")
                raise RuntimeError(f"tcpdump did not {what} within {timeout} s: {log}")
            time.sleep(0.05)

    def _settled(self) -> bool:
        """The file has not grown over the last few looks: tcpdump has written what the kernel gave it."""
        size = self.path.stat().st_size if self.path.exists() else -1
        self._sizes = (getattr(self, "_sizes", []) + [size])[-6:]
        return len(self._sizes) == 6 and len(set(self._sizes)) == 1

    def __exit__(self, *exc) -> None:
        # SIGINT drops what is still in the kernel's ring: first wait until the written file stops growing
        # (-U writes each packet as it comes).
        self._wait_for(self._settled, "settle its output file")
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        self._log.close()
        # tcpdump prints "N packets captured" once its file is flushed and closed.
        self._wait_for(lambda: b"packets captured" in self.stderr.read_bytes(), "report its packet count")

    @property
    def captured(self) -> int:
        for line in self.stderr.read_text(errors="replace").splitlines():
            if line.endswith("packets captured"):
                return int(line.split()[0])
        return -1


def record(out_dir: Path, clients: dict, *, count: int = 40) -> dict:
    """Run each client (name -> workload function) at once through one relay; return what was recorded."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pcap = out_dir / "clients.pcap"
    relay_dir = out_dir / "relay"
    results: dict = {}
    errors: list = []
    with RecordingRelay("127.0.0.1", 0, relay_dir) as relay:
        with TansuBroker(advertised_port=relay.port) as broker:
            relay.upstream_port = broker.port
            with Tcpdump(pcap, relay.port) as dump:
                def run(name, work):
                    try:
                        results[name] = work(relay.address, f"pcap.{name}", count)
                    except Exception as exc:  # reported below, with the client's name
                        errors.append(f"{name}: {exc!r}")

                threads = [threading.Thread(target=run, args=item, name=item[0]) for item in clients.items()]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(120)
                # A client may keep an idle connection open; stopping the relay then closes it (the
                # tests allow a torn-down connection's last bytes to be missing from the wire).
                relay.drain(timeout=20)
            relay.stop()
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"pcap": pcap, "relay_dir": relay_dir, "port": relay.port, "consumed": results,
            "packets": dump.captured}


if __name__ == "__main__":  # python -m tests.pcap.recording OUT_DIR: the recipe of tests/data/pcap
    import sys

    from tests.pcap.workload import CLIENTS

    info = record(Path(sys.argv[1]), CLIENTS, count=int(os.environ.get("COUNT", "40")))
    print(info)
