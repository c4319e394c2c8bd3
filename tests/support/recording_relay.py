"""A TCP relay that forwards bytes unchanged and records each connection's two directions to files."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

__all__ = ["RecordingRelay"]

_CHUNK = 65536


class _Connection:
    """One accepted client connection and the upstream connection paired with it."""

    def __init__(self, number: int, out_dir: Path):
        self.number = number
        self.out_dir = out_dir
        self._files: dict[str, BinaryIO] = {}
        self.bytes = {"requests": 0, "responses": 0}
        self.writers: list[asyncio.StreamWriter] = []

    def record(self, direction: str, data: bytes) -> None:
        f = self._files.get(direction)
        if f is None:
            # Files are created lazily, so a connection that carried no bytes leaves none.
            f = open(self.out_dir / f"{self.number:03d}.{direction}.bin", "wb")
            self._files[direction] = f
        f.write(data)
        self.bytes[direction] += len(data)

    def close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class RecordingRelay:
    """Listen on 127.0.0.1 on a free port and relay every connection to ``upstream``.

    For the N-th accepted connection (0-based, accept order) the bytes sent by the
    client are appended to ``out_dir/NNN.requests.bin`` and the bytes sent by the
    upstream to ``out_dir/NNN.responses.bin``, exactly as they crossed the sockets.
    ``upstream_port`` may be changed after ``start()`` (before clients connect), e.g.
    to start the relay first and let a broker advertise the relay's port.
    The relay runs its own asyncio loop in a background thread, so blocking clients
    can be driven from the calling thread::

        with RecordingRelay("127.0.0.1", broker.port, out_dir) as relay:
            ...  # clients connect to 127.0.0.1:relay.port
    """

    host = "127.0.0.1"

    def __init__(self, upstream_host: str, upstream_port: int, out_dir: str | Path, port: int = 0):
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.out_dir = Path(out_dir)
        self.port = port
        self.connections: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """``host:port`` that clients should connect to."""
        return f"{self.host}:{self.port}"

    # -- lifecycle (called from the owning thread) ---------------------------------------

    def start(self) -> "RecordingRelay":
        """Start listening; returns once the listening socket is bound (``.port`` is set)."""
        if self._thread is not None:
            raise RuntimeError("relay already started")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="recording-relay", daemon=True
        )
        self._thread.start()
        try:
            self._submit(self._start_server()).result(timeout=10)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection, flush and close all files."""
        if self._thread is None:
            return
        try:
            self._submit(self._stop_server()).result(timeout=10)
        finally:
            self._shutdown_loop()
            for conn in self.connections:
                conn.close_files()

    def __enter__(self) -> "RecordingRelay":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until no connection is being relayed; return False on timeout."""
        if self._loop is None:
            return True
        try:
            self._submit(self._wait_idle()).result(timeout=timeout)
            return True
        except concurrent.futures.TimeoutError:
            return False

    def _submit(self, coro):  # type: ignore[no-untyped-def]
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
        self._loop = None
        self._thread = None

    # -- inside the relay's event loop ----------------------------------------------------

    async def _start_server(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop_server(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in self.connections:
            for writer in conn.writers:
                writer.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _wait_idle(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = _Connection(len(self.connections), self.out_dir)
        self.connections.append(conn)
        conn.writers.append(client_writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port
                )
            except OSError:
                client_writer.close()
                return
            conn.writers.append(up_writer)
            await asyncio.gather(
                self._pump(client_reader, up_writer, conn, "requests"),
                self._pump(up_reader, client_writer, conn, "responses"),
            )
        finally:
            for writer in conn.writers:
                writer.close()
            conn.close_files()
            self._tasks.discard(task)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Connection, direction: str
    ) -> None:
        """Copy ``reader`` to ``writer`` until EOF, recording the bytes; half-close at EOF."""
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                conn.record(direction, data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            # A reset on either side ends the whole relayed connection.
            for other in conn.writers:
                other.close()
            return
        try:
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            pass
