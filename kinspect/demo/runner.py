"""The demo's orchestration: Tansu, kinspect in rewrite mode in front of it, the workload, the summary, a clean stop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from kinspect.app import App, build_app, install_event_loop
from kinspect.config import Config, load_config
from kinspect.demo.broker import BrokerError, TansuProcess, broker_nodes
from kinspect.demo.summary import SummaryObserver, render_summary
from kinspect.demo.workload import WorkloadCancelled, WorkloadResult, run_workload
from kinspect.logs import configure_logging, reset_logging

HOST = "127.0.0.1"  # the demo listens on loopback only
WORKDIR_MARK = ".kinspect-demo-workdir"  # only a directory holding it (or an empty one) is ever wiped
WORKDIR_LOCK = ".kinspect-demo.lock"  # held by the running demo: a second one in the same folder is refused
SHUTDOWN_GRACE = 2.0  # seconds in-flight requests get at Ctrl-C
CAPTURE_FILE_SECONDS = 5.0  # a capture file is finished this long after its first row, so one is soon there to read
WORKLOAD_STOP_WAIT = 10.0  # seconds a cancelled workload gets to notice before the proxy closes under it
RUNNING = "kinspect is running; press Ctrl-C to stop"

log = logging.getLogger("kinspect.demo")


class DemoError(RuntimeError):
    """The demo cannot start; the message says why and names the thing."""


def say(text: str) -> None:
    print(text, flush=True)  # flushed: a pipe (make, a test) must see each line as it happens


# ----------------------------------------------------------------------------- ports and workdir


@dataclass
class DemoPorts:
    """0 means: let the OS pick when binding (kinspect's own listeners only)."""

    bootstrap: int  # kinspect's bootstrap listener: clients connect here
    metrics: int  # /metrics, /healthz, /readyz
    node: int  # kinspect's listener for the broker node (where rewritten Metadata points)
    broker: int  # Tansu's own listener (clients never see it)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _check_free(port: int, what: str) -> None:
    if not 0 < port < 65536:
        raise DemoError(f"--port-base gives port {port} for {what}, outside 1-65535")
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise DemoError(f"port {port} ({what}) on {HOST} is not free: {exc.strerror or exc}") from None


def choose_ports(port_base: int | None) -> DemoPorts:
    """Free random ports by default; with a base P: P bootstrap, P+1 metrics, P+2 broker node, P+3 Tansu."""
    if port_base is None:
        node = _free_port()
        broker = _free_port()
        while broker == node:
            broker = _free_port()
        return DemoPorts(bootstrap=0, metrics=0, node=node, broker=broker)
    ports = DemoPorts(port_base, port_base + 1, port_base + 2, port_base + 3)
    for f in dataclasses.fields(ports):
        _check_free(getattr(ports, f.name), f"the {f.name} listener")
    return ports


def prepare_workdir(path: Path) -> Path:
    """Lock the workdir for this run and empty it (creating it); refuse a non-empty directory the demo did not make.

    The lock (flock on WORKDIR_LOCK, held until release_workdir or the process ends) stops a
    second demo from emptying the folder of one that is running and writing into its captures.
    """
    path = path.resolve()
    if path.exists():
        if not path.is_dir():
            raise DemoError(f"workdir {path} exists and is not a directory")
        entries = [e for e in path.iterdir() if e.name != WORKDIR_LOCK]
        if entries and not (path / WORKDIR_MARK).is_file():
            raise DemoError(f"workdir {path} is not empty and was not made by kinspect demo; "
                            f"choose another --workdir or remove it")
    path.mkdir(parents=True, exist_ok=True)
    _lock_workdir(path)
    import shutil

    for entry in path.iterdir():
        if entry.name == WORKDIR_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (path / WORKDIR_MARK).write_text("made by `kinspect demo`; wiped at each run\n")
    return path


_LOCKS: dict[Path, object] = {}  # workdir -> its open lock file, for as long as this process runs the demo


def _lock_workdir(path: Path) -> None:
    if path in _LOCKS:
        return
    import fcntl

    handle = open(path / WORKDIR_LOCK, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DemoError(f"workdir {path} is in use by a running kinspect demo ({holder}); "
                        f"stop it, or give this one another --workdir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    _LOCKS[path] = handle


def release_workdir(path: Path) -> None:
    """Let another demo use the workdir (the lock also ends with the process)."""
    handle = _LOCKS.pop(path.resolve(), None)
    if handle is not None:
        handle.close()


# ----------------------------------------------------------------------------- config


def demo_config(ports: DemoPorts, nodes: dict[int, tuple[str, int]], workdir: Path) -> Config:
    """Rewrite mode in front of Tansu, metrics, the debug log of every request, and Parquet capture."""
    node_ports = {str(node_id): ports.node + i for i, node_id in enumerate(sorted(nodes))}
    overrides = {
        "proxy.mode": "rewrite",
        "proxy.listen": f"{HOST}:{ports.bootstrap}",
        "proxy.bootstrap_servers": [f"{HOST}:{ports.broker}"],
        "proxy.node_ports": node_ports,
        "proxy.shutdown_grace": SHUTDOWN_GRACE,
        "metrics.enabled": True,
        "metrics.listen": f"{HOST}:{ports.metrics}",
        "metrics.topic_bytes": True,
        "log.format": "json",
        "log.level": "INFO",
        "log.debug_requests": True,
        "capture.enabled": True,
        "capture.directory": str(workdir / "captures"),
        "capture.max_file_seconds": CAPTURE_FILE_SECONDS,
    }
    return load_config(None, overrides)


# ----------------------------------------------------------------------------- running


@dataclass
class DemoOptions:
    workdir: Path
    workload: bool = True
    port_base: int | None = None


def run_demo(options: DemoOptions) -> int:
    """Run the demo until SIGINT/SIGTERM; 0 after a clean stop, 1 if the workload failed, 2 if it cannot start."""
    # Until the event loop takes them over, SIGTERM interrupts like Ctrl-C: startup unwinds through finally.
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    tansu = None
    log_file = None
    app = None
    try:
        workdir = prepare_workdir(options.workdir)
        ports = choose_ports(options.port_base)
        say(f"kinspect demo: workdir {workdir} (emptied)")
        log_path = workdir / "kinspect.log"
        log_file = open(log_path, "w", encoding="utf-8")
        configure_logging("json", "INFO", stream=log_file)

        tansu = TansuProcess(HOST, ports.broker, workdir / "tansu.log")
        tansu.start()
        nodes = broker_nodes(HOST, ports.broker)
        say(f"kinspect demo: broker: tansu pid {tansu.pid} on {HOST}:{ports.broker} "
            f"(node {', '.join(map(str, sorted(nodes)))}; log {tansu.log_path})")

        config = demo_config(ports, nodes, workdir)
        summary = SummaryObserver()
        app = build_app(config, extra_observers=[summary])
        install_event_loop()
        demo = _Demo(options, app, summary, tansu, workdir, log_path)
        return asyncio.run(demo.run())
    except (DemoError, BrokerError, OSError, ValueError) as exc:
        print(f"kinspect demo: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        say("kinspect demo: interrupted while starting")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if app is not None:
            app.close_capture()  # a no-op after a clean stop; otherwise writes what was queued
        status = tansu.stop() if tansu is not None else None
        if tansu is not None:
            say(f"kinspect demo: stopped (tansu pid {tansu.pid} exited with status {status})")
        if log_file is not None:
            reset_logging()
            log_file.close()
        release_workdir(options.workdir)


class _Demo:
    """The part that runs on the event loop: listeners, workload, summary, and the stop."""

    def __init__(self, options, app: App, summary, tansu, workdir, log_path) -> None:
        self.options, self.app, self.config, self.server = options, app, app.config, app.server
        self.summary, self.capture, self.tansu = summary, app.capture, tansu
        self.workdir, self.log_path = workdir, log_path
        self.stop = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        status = 0
        try:
            await self.app.start()
            say(f"kinspect demo: kinspect on {self.bootstrap} in rewrite mode "
                f"(broker nodes at {', '.join(f'{HOST}:{p}' for p in self.config.proxy.node_ports.values())}), "
                f"metrics on {self.metrics_url}")
            lines: list[str] = []
            if self.options.workload:
                say("kinspect demo: running the sample workload (confluent-kafka) through kinspect...")
                result, failure = await self._workload()
                if self.stop.is_set():
                    return await self._shutdown(0)
                if failure is not None:
                    status = 1
                    lines.append(f"workload FAILED: {failure}")
                if result is not None:
                    lines += result.lines()
                await self._settle()
            else:
                lines.append("workload: none (--no-workload)")
            say(render_summary(self.summary, lines, self.locations()))
            say(f"{RUNNING} (bootstrap: {self.bootstrap})")
            await self.stop.wait()
            return await self._shutdown(status)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.server.bootstrap_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.app.metrics_port}/metrics"

    def locations(self) -> list[tuple[str, str]]:
        captures = (f"{self.capture.writer.directory} (Parquet, one row per exchange; a file is finished "
                    f"{CAPTURE_FILE_SECONDS:.0f} s after its first row, and at Ctrl-C)")
        return [
            ("bootstrap", f"{self.bootstrap}  (point your own clients here)"),
            ("metrics", self.metrics_url),
            ("debug log", f"{self.log_path} (JSON lines; kafka.request: every decoded request)"),
            ("captures", captures),
            ("broker", f"tansu pid {self.tansu.pid} on {HOST}:{self.tansu.port} (log {self.tansu.log_path})"),
            ("next step", self.next_step()),
        ]

    def next_step(self) -> str:
        """How to analyze these captures: `make analyze` in a checkout (docs/analyze.md)."""
        default = Path.cwd() / ".kinspect-demo"
        make = "make analyze" if self.workdir == default.resolve() else f"make analyze DEMO_WORKDIR={self.workdir}"
        return f"{make}  (the Spark report on these captures, written to {self.workdir / 'report'}/report.html)"

    async def _workload(self) -> tuple[WorkloadResult | None, str | None]:
        """Run the blocking client in a daemon thread; a stop request cancels it."""
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        done: asyncio.Future = loop.create_future()

        def work() -> None:
            try:
                outcome = (run_workload(self.bootstrap, cancel), None)
            except WorkloadCancelled:
                outcome = (None, "cancelled")
            except Exception as exc:  # noqa: BLE001 (reported in the summary, the demo keeps serving)
                log.exception("workload failed")
                outcome = (None, f"{type(exc).__name__}: {exc}")
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(outcome))

        threading.Thread(target=work, name="kinspect-demo-workload", daemon=True).start()
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([done, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not done.done():
            say("kinspect demo: stopping the workload...")
            cancel.set()
            await asyncio.wait([done], timeout=WORKLOAD_STOP_WAIT)
            return None, "cancelled"
        return done.result()

    async def _settle(self) -> None:
        """Let the last responses reach the observers before the summary is drawn."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0
        while self.server.stats().inflight and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)

    async def _shutdown(self, status: int) -> int:
        say("kinspect demo: stopping...")
        await self.app.stop(grace=SHUTDOWN_GRACE)
        writer = self.capture.writer
        # A request still in flight when its connection closed is no exchange: it has no capture row.
        unanswered = self.summary.problems["unanswered"]
        say(f"kinspect demo: proxy closed after {self.summary.total_requests:,} requests in total "
            f"({unanswered:,} unanswered when their connection closed); "
            f"captures: {writer.rows_written:,} rows in {writer.files_written} file(s) in {writer.directory}")
        return status
