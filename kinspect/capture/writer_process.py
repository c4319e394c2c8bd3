"""The capture writer's own process, both ends of its pipe: facts in, Parquet files out, its counters back.

Rows are built and written in a process of their own so that building them never holds
the proxy's GIL: the proxy's writer thread only encodes each batch of facts, with the GIL
released (capture.facts_wire), and writes it to the pipe. Built in a thread of the proxy,
the same rows cost the event loop a GIL hand-over at each wake-up, and their building twice
to three times what it costs alone.

Messages both ways are a 4-byte big-endian length and a payload. In (the process's stdin):
the settings (a pickle), then one batch of EXCHANGE tuples per message: encoded
(facts_wire.MAGIC first), or where the encoder declines it or is not built, the pickles of
its slices of at most PICKLE_ROWS one after another (`send_batch`, `read_batch`); the end of
the input means finish. Out (its stdout, pickles): after each batch, each file and at the end,
the counters (rows_written, row_errors, write_errors, files_written, the rows it has taken in, its pacer's naps)
with the files finished since the last report; the first report, all zeros, says it is ready (pyarrow imported and
warmed up), and the proxy serves only then. Before that report it lowers its priority (capture.writer_priority,
"auto" decided by the proxy): with "idle" it works on a batch in the idle class, in short slices with naps
between (capture.pacing), never holding a core for long; where it may leave the
class, it does between batches and while behind, and the proxy lifts it out when it falls behind mid-batch
(capture.writer_priority). It ignores SIGINT (a terminal's Ctrl-C reaches the whole
process group; the proxy decides when the capture ends) and finishes its file when its input ends,
whether the proxy closed it or died.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import gc
import io
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from kinspect.capture.barred_imports import bar_pandas
from kinspect.capture.facts import share_alike_sides
from kinspect.capture.facts_wire import MAGIC, decode, write_batch
from kinspect.capture.pacing import Pacer
from kinspect.capture.writer import BATCH_ROWS
from kinspect.capture.writer_priority import IDLE, GiveWay, LiftWhenBehind, lower_priority, resolve, waiting_bytes

log = logging.getLogger("kinspect.capture")

_LENGTH = struct.Struct(">I")
_IOV_MAX = 1024  # buffers one writev takes (Linux's IOV_MAX)
TICK_SECONDS = 0.5  # how often an idle writer process looks at its open file's age
# Exchanges pickled at a time, where a batch cannot be encoded off the GIL (facts_wire). pickle.dumps holds
# the GIL for its whole call, whatever the switch interval: a 512-row batch of the recorded traffic took
# 1.5 ms (about 1 KB and 3 µs a row on this 2-core machine), an event loop stall at every batch, where a
# slice of 64 takes 0.14 ms.
PICKLE_ROWS = 64
# An idle writer process that may leave the idle class is lifted out of it once it has held a batch this long
# without writing it: starved mid-batch on cores other work keeps busy (writer_priority.LiftWhenBehind). Beside
# eight connections' round trips a batch takes it 10-50 ms.
OVERDUE_SECONDS = 1.0
# The pipe to the process holds this much (Linux's default is 64 KB): the writer thread's write of a batch and
# the process's read each wake the other once a batch, where they took turns sixteen times (/tmp script: 16
# context switches a batch -> 1).
PIPE_BYTES = 1 << 20
# Objects made between two young collections of the process's garbage collector (CPython's default 700).
# A batch decodes into about 30 tuples a row and keeps them until its rows are built: collections every 700
# walked them again and again as they were promoted, and pyarrow's and numpy's thousands of objects at
# each full one (0.5-5 µs a row live, 3 µs a row of the recorded traffic in-process). The rows' objects
# form no cycles and die with their batch, so a collection seldom finds anything.
GC_YOUNG_OBJECTS = 100_000
# Exchanges built into one record batch: a full batch of the writer thread's is built as it comes,
# part batches wait until they make one. A build costs about 0.6 ms whatever its size, then about
# 7 µs a row from 512 rows on, and a quiet proxy, or a bulk load of a few large exchanges a second,
# sends a part batch every BATCH_SECONDS. More would not lower the cost a row, and unbuilt facts
# live longer for the collector to walk (1,024 cost 10-20% more a row in full batches).
BUILD_ROWS = BATCH_ROWS


def write_message(fd: int, payload: bytes) -> None:
    write_pieces(fd, [payload])


def write_pieces(fd: int, pieces: list[bytes]) -> None:
    """One message whose payload is `pieces` one after another, written without joining them."""
    views = [memoryview(_LENGTH.pack(sum(map(len, pieces))))] + [memoryview(p) for p in pieces if p]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def send_batch(fd: int, facts: list) -> None:
    """A batch as one message, alike sides shared first (so that the payload holds each once): encoded with
    the GIL released (facts_wire), else pickled a slice at a time (`pickled_slices`)."""
    facts = share_alike_sides(facts)
    if not write_batch(fd, facts):
        write_pieces(fd, pickled_slices(facts))


def pickled_slices(facts: list) -> list[bytes]:
    """A batch's payload pickled: its slices of PICKLE_ROWS pickled one at a time (the event loop gets the GIL
    between them), for `read_batch` to join again."""
    return [pickle.dumps(facts[i:i + PICKLE_ROWS], protocol=5) for i in range(0, len(facts), PICKLE_ROWS)]


def read_batch(payload: bytes) -> list:
    """A batch's exchanges from its payload: encoded (facts_wire), or the pickles of its slices (`pickled_slices`)."""
    if payload[:4] == MAGIC:
        return decode(payload)
    stream, facts = io.BytesIO(payload), []
    while stream.tell() < len(payload):
        facts += pickle.load(stream)
    return facts


def read_message(fd: int) -> bytes | None:
    """The next message; None at the end of the input (a message cut short counts as the end)."""
    head = _read_exact(fd, 4)
    return None if head is None else _read_exact(fd, _LENGTH.unpack(head)[0])


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class WriterProcess:
    """The proxy's end: starts the process, sends it batches, keeps the counters it reports.

    Its counters are read like a ParquetSink's, summed over every process it started. A
    process that dies is replaced at the next batch (at most once per RESTART_SECONDS; the
    batches in between are lost); the rows a dead process never accounted for, and those
    lost meanwhile, are counted in write_errors.
    """

    RESTART_SECONDS = 10.0

    def __init__(self, settings: dict) -> None:
        # "auto" decided here, once: the process gets "low" or "idle" (writer_priority.resolve)
        priority, self.liftable = resolve(settings.get("priority", "low"))
        self.settings = {**settings, "priority": priority, "liftable": self.liftable}
        self._lifters: list[LiftWhenBehind] = []  # one for each idle process that may be lifted
        self.files: list[Path] = []
        self.exit_codes: list[int] = []  # of every process that ended, in order
        self.restarts = 0
        self._ended = [0, 0, 0, 0, 0]  # rows_written, row_errors, write_errors, files_written, naps of ended processes
        self._now = [0, 0, 0, 0, 0]  # the same, as the running process last reported them
        self._sent = 0  # rows handed to the running process
        self._lost = 0  # rows no process took (none was running) or accounted for (it died)
        self._started_at = 0.0
        self._finished = False
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._lift: LiftWhenBehind | None = None  # the running process's, where it may be lifted
        self._sends: collections.deque = collections.deque()
        self._taken = 0  # rows of the batches the running process has taken in, as it last reported

    rows_written = property(lambda self: self._ended[0] + self._now[0])
    row_errors = property(lambda self: self._ended[1] + self._now[1])
    write_errors = property(lambda self: self._ended[2] + self._now[2] + self._lost)
    files_written = property(lambda self: self._ended[3] + self._now[3])
    naps = property(lambda self: self._ended[4] + self._now[4])  # its pacer's (capture.pacing), as last reported
    lifts = property(lambda self: sum(lifter.lifts for lifter in self._lifters))  # times a process fell behind

    @classmethod
    def start(cls, **settings) -> WriterProcess:
        """Start the process (this Python, kinspect importable as here); returns once it is ready."""
        self = cls(settings)
        self._spawn()
        return self

    def _spawn(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        # numpy's OpenBLAS starts a thread a core as it is imported, which spins ~0.1 s of CPU while the proxy
        # starts; the rows never use BLAS. (A setting of the user's own is kept.)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self._started_at = time.monotonic()
        # -P: `-m` would put the current directory first on sys.path, and a proxy started in a directory holding
        # another `kinspect` (a source checkout) would build its rows with that one's code, not its own.
        proc = subprocess.Popen([sys.executable, "-P", "-m", "kinspect.capture.writer_process"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.proc, self._sent, self._now, self._taken = proc, 0, [0, 0, 0, 0, 0], 0
        try:  # a batch (about 1 MB of the recorded traffic) in one write, not sixteen 64 KB hand-overs
            fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # above this machine's fs.pipe-max-size, or the user's pipe pages used up: as it was
            pass
        write_message(proc.stdin.fileno(), pickle.dumps(self.settings, protocol=5))
        # Its first report says it is ready (pyarrow imported and warmed up): a proxy serves only then,
        # so that this start-up cost is never paid while clients wait.
        first = read_message(proc.stdout.fileno())
        if first is not None:
            self._take_report(first)
        self._lift = None
        if self.liftable:  # (so "idle")
            self._lift = LiftWhenBehind(proc.stdin.fileno(), proc.pid)
            self._lifters.append(self._lift)
        self._sends = collections.deque()  # (rows sent up to and with a batch, when it went) not yet taken in
        self._reader = threading.Thread(target=self._read_reports, args=(proc, self._lift),
                                        name="kinspect-capture-reports", daemon=True)
        self._reader.start()

    def add(self, facts: list) -> None:
        """Send a batch (blocks while the pipe is full: the writer thread waits, never the event loop).

        A batch that finds the process dead goes to the one that replaces it, if one may start now.
        """
        for _ in range(2):
            if self.proc is None and time.monotonic() - self._started_at >= self.RESTART_SECONDS:
                self.restarts += 1
                log.warning("capture: starting writer process number %d", self.restarts + 1)
                self._spawn()
            if self.proc is None:
                break
            if self._lift is not None:
                self._lift.judge()
                self._sends.append((self._sent + len(facts), time.monotonic()))
            try:
                send_batch(self.proc.stdin.fileno(), facts)
                self._sent += len(facts)
                return
            except OSError:
                self._ended_process(f"the writer process (pid {self.proc.pid}) takes no more rows")
        self._lost += len(facts)

    def _ended_process(self, why: str) -> None:
        """The running process is gone: its counts become the ended ones', what it never accounted for is lost."""
        proc = self.proc
        try:
            proc.stdin.close()
        except OSError:
            pass
        self.exit_codes.append(proc.wait())
        self._reader.join()  # its last reports, up to the end of its output
        if proc.returncode != 0:
            log.error("capture: %s (exit code %s); rows it held are counted as write errors", why, proc.returncode)
        unaccounted = self._sent - self._now[0] - self._now[1] - self._now[2]
        self._lost += max(0, unaccounted)
        self._ended = [e + n for e, n in zip(self._ended, self._now)]
        self.proc, self._sent, self._now = None, 0, [0, 0, 0, 0, 0]

    def tick(self) -> None:
        """The process keeps its own files' age."""

    def finish(self, timeout: float | None = 60.0) -> None:
        """End its input, and wait for it to write what it holds and exit."""
        if self._finished or self.proc is None:
            self._finished = True
            return
        self._finished = True
        if self._lift is not None:  # its last batches and file, written at a priority that gets them a core
            self._lift.finishing()
        if self.lifts:
            log.info("capture: the writer process fell behind %d times (out of the idle class until it caught up)",
                     self.lifts)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("capture: the writer process did not finish within %s s; stopping it", timeout)
            self.proc.kill()
        self._ended_process("the writer process ended")

    def _read_reports(self, proc: subprocess.Popen, lift: LiftWhenBehind | None) -> None:
        fd = proc.stdout.fileno()
        lifted = None  # the batch last found overdue: lifted (and counted) once, however long it then takes
        while True:
            if lift is not None and not select.select([fd], [], [], OVERDUE_SECONDS / 2)[0]:
                overdue = self._overdue_batch() if proc is self.proc else None
                if overdue is not None and overdue != lifted:
                    lift.overdue()
                    lifted = overdue
                continue
            message = read_message(fd)
            if message is None:
                return
            if proc is self.proc:
                self._take_report(message)

    def _overdue_batch(self) -> int | None:
        """The batch (rows sent up to and with it) sent OVERDUE_SECONDS ago or more that the process has not yet taken
        in, if there is one."""
        while self._sends and self._sends[0][0] <= self._taken:
            self._sends.popleft()
        if self._sends and time.monotonic() - self._sends[0][1] >= OVERDUE_SECONDS:
            return self._sends[0][0]
        return None

    def _take_report(self, message: bytes) -> None:
        rows_written, row_errors, write_errors, files_written, self._taken, naps, new_files = pickle.loads(message)
        self.files += [Path(f) for f in new_files]
        self._now = [rows_written, row_errors, write_errors, files_written, naps]


# ---------------------------------------------------------------------- the process itself


def _report(fd: int, sink, taken: int, naps: int, last: tuple | None, reported_files: int) -> tuple[tuple, int]:
    counts = (sink.rows_written, sink.row_errors, sink.write_errors, sink.files_written, taken, naps)
    if counts != last or len(sink.files) != reported_files:
        write_message(fd, pickle.dumps((*counts, [str(f) for f in sink.files[reported_files:]]), protocol=5))
    return counts, len(sink.files)


def settle_collector() -> None:
    """Keep what is imported and warmed up out of every collection, and collect the young only every
    GC_YOUNG_OBJECTS new objects (the process's own batches are freed by their reference counts)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_OBJECTS)


def main() -> int:
    bar_pandas()  # before pyarrow's first use
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Reports go to the stdout we were given; anything else printed goes to stderr with the logs.
    fd_in, fd_out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="kinspect capture writer: %(message)s")
    from kinspect.capture.batch import BatchBuilder
    from kinspect.capture.sink import ParquetSink
    from kinspect.capture.warm_up import write_one

    message = read_message(fd_in)
    if message is None:
        return 0
    settings = pickle.loads(message)
    layers = settings.get("spec_layers")  # the proxy's own specs, where they are not the built-in ones alone
    registry = None
    if layers is not None:
        from kinspect.protocol.specs.registry import SpecRegistry

        registry = SpecRegistry(layers)
    builder = BatchBuilder(settings["wall_offset"], registry, versions=settings["versions"])
    if settings.get("warm_facts") is not None:
        try:  # pyarrow's first use, paid before the first batch (capture.warm_up)
            write_one(settings["warm_facts"], BatchBuilder(0.0, registry, versions=settings["versions"]),
                      settings["compression"])
        except Exception:  # noqa: BLE001 (the first batch pays it instead)
            log.warning("warming up failed", exc_info=True)
    sink = ParquetSink(settings["directory"], builder, max_file_bytes=settings["max_file_bytes"],
                       max_file_seconds=settings["max_file_seconds"], row_group_rows=settings["row_group_rows"],
                       compression=settings["compression"], build_rows=BUILD_ROWS)
    last, reported_files = None, 0
    settle_collector()
    # Lowered before it says it is ready: from then on the proxy may lift it (writer_priority.LiftWhenBehind).
    liftable = settings.get("liftable", False)
    idle = lower_priority(settings.get("priority", "low"), liftable) == IDLE
    # idle: in the idle class (where it may leave it) and paced (capture.pacing) while it works on a batch; never
    # while it waits for input, nor while its input holds more: it is behind and catches up at full speed.
    unpaced = contextlib.nullcontext()
    give_way = GiveWay() if idle and liftable else unpaced
    # (where it may leave the class, the pacer naps only inside it: lifted by the proxy, it catches up unpaced)
    pacer = Pacer(idle_only=liftable) if idle else None
    paced = pacer if idle else unpaced
    write_message(fd_out, pickle.dumps((0, 0, 0, 0, 0, 0, []), protocol=5))  # ready
    taken = 0  # rows of the batches it has taken in
    while True:
        ready, _, _ = select.select([fd_in], [], [], TICK_SECONDS)
        message = read_message(fd_in) if ready else b""
        if message is None:
            break
        yielding = idle and bool(message) and not waiting_bytes(fd_in)
        with give_way if yielding else unpaced, paced if yielding else unpaced:
            if message:
                batch = read_batch(message)
                sink.add(batch)
                taken += len(batch)
            sink.tick()
            # (the naps of the batch in hand are counted as its pacer ends: reported with the next)
            last, reported_files = _report(fd_out, sink, taken, pacer.naps if pacer else 0, last, reported_files)
    with unpaced if liftable else paced:  # where it may, the proxy has lifted it to finish
        sink.finish()
    _report(fd_out, sink, taken, pacer.naps if pacer else 0, last, reported_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
