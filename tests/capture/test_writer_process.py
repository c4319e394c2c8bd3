"""The capture writer's own process: the same files as the writer thread, its counters back, and no row unaccounted.

Each test starts a real writer process (python -m kinspect.capture.writer_process) and
reads the Parquet files it wrote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.facts import share_alike_sides
from kinspect.capture.facts_wire import encode_python
from kinspect.capture.metrics import CaptureCollector
from kinspect.capture.observer import CaptureObserver
from kinspect.capture import writer_process
from kinspect.capture.warm_up import warm_facts
from kinspect.capture.writer import CaptureWriter
from kinspect.capture.writer_priority import NICENESS, LiftWhenBehind, may_leave_idle_class, resolve
from kinspect.capture.writer_process import WriterProcess
from kinspect.config import CaptureConfig, ConfigError, load_config
from kinspect.protocol.codec import Codec
from tests.capture.test_capture import FILE_NAME, read_rows, recorded_exchanges, recorded_facts
from tests.support.paths import ROOT
from tests.support.proxy_harness import poll_until
from tests.support.snippet import run_snippet
from tests.support.spinning import spinning_on

pytestmark = pytest.mark.integration  # every test starts a writer process


def _written(codec: Codec, directory, process: bool, **kw):
    observer = CaptureObserver(directory, codec, wall_offset=0.0, process=process, **kw).start()
    for exchange in recorded_exchanges(codec):
        observer.on_event(exchange)
    observer.close()
    return observer.writer


def test_the_writer_process_writes_what_the_writer_thread_writes(codec: Codec, tmp_path):
    thread = _written(codec, tmp_path / "thread", False)
    process = _written(codec, tmp_path / "process", True, row_group_rows=40, max_file_bytes=30_000)
    assert isinstance(process._out, WriterProcess) and process._out.exit_codes == [0]
    assert process.rows_written == thread.rows_written == process.rows_accepted > 100
    assert process.row_errors == process.write_errors == process.rows_dropped == 0
    files = sorted((tmp_path / "process").iterdir())
    assert files == sorted(process.files) and len(files) == process.files_written >= 2  # rotated by size
    assert all(FILE_NAME.match(f.name) for f in files)
    assert read_rows(process.files).equals(read_rows(thread.files))
    assert max(pq.ParquetFile(f).metadata.row_group(0).num_rows for f in files) == 40


def test_the_writer_process_rotates_files_by_age_while_idle(codec: Codec, tmp_path):
    # Warmed up as the proxy's is: the first batch need not pay pyarrow's first use at the process's lowered
    # priority, which beside a full suite's load on two cores took it more than 20 s.
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), max_file_seconds=0.3, process=True,
                      warm_facts=warm_facts(codec)).start()
    for facts, held in recorded_facts(codec, 30):
        w.offer(facts, held)
    poll_until(lambda: w.files_written == 1, timeout=20)  # no more rows came: the file ended by its age
    assert w.rows_written == 30 and not list(tmp_path.glob("*.tmp"))
    w.close()
    assert w.files_written == 1 and read_rows(w.files).num_rows == 30


def test_the_writer_process_never_imports_pandas(codec: Codec, tmp_path):
    """pyarrow would import it at its first array() (about 0.5 s of CPU, 37 MB): where it is installed, the
    process bars it."""
    import pandas  # noqa: F401 (installed here: only the bar keeps it out)

    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True, warm_facts=warm_facts(codec)).start()
    try:
        for facts, held in recorded_facts(codec, 30):
            w.offer(facts, held)
        poll_until(lambda: w.queue_depth == 0 and w._out._taken == 30, 30)  # built: every array() it makes, made
        loaded = Path(f"/proc/{w._out.proc.pid}/maps").read_text()
        assert "/pyarrow/" in loaded and "/pandas/" not in loaded
    finally:
        w.close()
    assert w.rows_written == 30 and w.row_errors == 0


def test_a_writer_process_that_dies_loses_rows_that_are_counted(codec: Codec, tmp_path, caplog):
    facts = recorded_facts(codec, 60)
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True).start()
    for f in facts[:30]:
        assert w.offer(*f)
    poll_until(lambda: w.queue_depth == 0)
    os.kill(w._out.proc.pid, signal.SIGKILL)
    w._out.proc.wait(10)
    with caplog.at_level(logging.ERROR, logger="kinspect.capture"):
        for f in facts[30:]:
            assert w.offer(*f)  # the event loop's side never fails or waits
        w.close()
    # Killed before it wrote a file: its 30 rows are lost; so are the next 30, offered within
    # RESTART_SECONDS of its start (no crash loop).
    assert w.rows_accepted == 60 and w.rows_written == 0 and w.write_errors == 60
    assert "the writer process" in caplog.text and w._out.exit_codes == [-signal.SIGKILL]
    assert not list(tmp_path.glob("*.parquet"))


def test_a_writer_process_that_dies_is_replaced(codec: Codec, tmp_path):
    facts = recorded_facts(codec, 60)
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True).start()
    w._out.RESTART_SECONDS = 0.0
    for f in facts[:30]:
        w.offer(*f)
    poll_until(lambda: w.queue_depth == 0)
    os.kill(w._out.proc.pid, signal.SIGKILL)
    w._out.proc.wait(10)
    for f in facts[30:]:
        w.offer(*f)
    w.close()
    assert w._out.restarts == 1 and w._out.exit_codes == [-signal.SIGKILL, 0]
    assert w.rows_written == 30 and w.write_errors == 30 and w.files_written == 1
    assert read_rows(w.files).column("correlation_id").to_pylist() == [f[0][11] for f in facts[30:]]


def thread_ids(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def niceness(tid: int) -> int:
    # /proc/<tid>/stat's 19th field (after the command name, which may hold spaces)
    return int(Path(f"/proc/{tid}/stat").read_text().rpartition(")")[2].split()[16])


def lift_to_normal_priority(pid: int) -> bool:
    """Puts every thread of process pid back in the normal class at this process's niceness; False where the
    kernel refuses it (leaving the idle class or lowering a niceness needs CAP_SYS_NICE or RLIMIT_NICE)."""
    try:
        for tid in thread_ids(pid):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, niceness(os.getpid()))
    except PermissionError:
        return False
    return True


def scheduling(pid: int) -> set[tuple[int, int]]:
    """(class, niceness) of each thread of process pid."""
    return {(os.sched_getscheduler(t), niceness(t)) for t in thread_ids(pid)}


def nicer_than_this() -> int:
    return min(19, niceness(os.getpid()) + NICENESS)


@pytest.mark.parametrize("priority", ["low", "idle"])
def test_the_writer_process_yields_to_the_forwarding(codec: Codec, tmp_path, priority, monkeypatch):
    """Once ready, every thread of the process is NICENESS nicer than the proxy ("low"), or in the idle scheduling
    class too and napping between short slices of its work ("idle"; capture.pacing),
    a voluntary switch each. Here "idle" as where the process may not leave the class (so that the test's own lift
    below stays): it is put in the class once and for all."""
    monkeypatch.setattr(writer_process, "resolve", lambda priority: (priority, False))
    # row groups of a batch each: rows_written says when a batch is built and written
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True, writer_priority=priority, row_group_rows=512).start()
    pid = w._out.proc.pid

    def voluntary_switches() -> int:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)$", status, re.M).group(1))

    with contextlib.ExitStack() as cleanup:
        cleanup.callback(w.close)
        # lowered before its ready report
        assert scheduling(pid) == {(os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER, nicer_than_this())}
        # What is left to see is the pacing, which the setting decides, not the class: back at the test's own
        # priority where allowed, the work is not starved by the other tests' load (a full run took the idle
        # process 53 s for what takes it 1.5 s alone).
        lift_to_normal_priority(pid)  # where refused, the idle class waits for the cores the other tests keep busy
        facts = recorded_facts(codec, 256)
        before, started = voluntary_switches(), time.monotonic()
        for written in (512, 1024):  # two batches, 10-20 ms of building; one at a time, as it keeps up
            for f in facts + facts:
                w.offer(*f)
            poll_until(lambda: w.rows_written >= written, 60)
        # less one for each wake-up to look at its file's age, every TICK_SECONDS (under a full run's load this
        # takes seconds)
        switches = voluntary_switches() - before - (time.monotonic() - started) / writer_process.TICK_SECONDS
    assert w.write_errors == 0 and w.rows_written == 1024 and w._out.lifts == 0
    naps = w._out.naps  # as the process reported them at its end
    # Paced, a nap every slice of 0.2 ms in which it ran half a slice or more, each a voluntary switch the kernel
    # counted. Unpaced, none, and a switch for each read and report
    # (a read that finds a batch half written waits again): -4 to +5, 27 and 32 once each in a full run's load.
    if priority == "idle":
        assert naps > 20 and switches > naps / 2, (naps, switches)
    else:
        assert naps == 0 and switches < 50, (naps, switches)


def test_auto_is_idle_where_the_writer_may_leave_the_idle_class_again_else_low(tmp_path):
    """The default: where the process may leave the idle class again (CAP_SYS_NICE, or RLIMIT_NICE), "idle", in the
    normal class between batches; elsewhere "low", never a writer the idle class can starve."""
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True).start()
    try:
        assert w.writer_priority == "auto"
        liftable = may_leave_idle_class()
        assert w._out.liftable is liftable
        assert w._out.settings["priority"] == ("idle" if liftable else "low")
        assert scheduling(w._out.proc.pid) == {(os.SCHED_OTHER, nicer_than_this())}
    finally:
        w.close()


def test_where_the_idle_class_cannot_be_left_auto_is_low_and_idle_stays_idle(monkeypatch):
    real = os.sched_setscheduler

    def refused(tid, policy, param):
        if policy != os.SCHED_IDLE:
            raise PermissionError(1, "Operation not permitted")
        real(tid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    assert not may_leave_idle_class()
    assert resolve("auto") == ("low", False)
    assert resolve("idle") == ("idle", False)
    assert resolve("low") == ("low", False)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the probe left the calling thread as it was


def test_the_proxy_lifts_an_idle_writer_each_time_its_pipe_holds_a_batch(caplog):
    """LiftWhenBehind on a real pipe: every thread of the process lifted at each send that finds the pipe holding
    bytes (the process may have gone back to the idle class since: GiveWay), counted once a spell behind."""
    lifted = []
    read_end, write_end = os.pipe()
    stand_in = subprocess.Popen([sys.executable, "-c", "import threading, time; threading.Thread(target=time.sleep, "
                                 "args=(60,)).start(); time.sleep(60)"])  # a process of two threads
    try:
        poll_until(lambda: len(thread_ids(stand_in.pid)) == 2)
        lift = LiftWhenBehind(write_end, stand_in.pid, lift=lifted.append)
        threads = sorted(thread_ids(stand_in.pid))
        lift.judge()  # empty: it keeps up
        assert lifted == [] and lift.lifts == 0
        os.write(write_end, b"a batch")
        with caplog.at_level(logging.INFO, "kinspect.capture"):
            lift.judge()
            lift.judge()
        assert sorted(lifted) == sorted(threads * 2) and lift.lifts == 1
        assert [r.getMessage() for r in caplog.records] == [
            "capture: the writer process fell behind; out of the idle class until it catches up (logged once)"]
        os.read(read_end, 100)
        lift.judge()
        os.write(write_end, b"a batch")
        lift.judge()
        assert lift.lifts == 2 and len(lifted) == 3 * len(threads)
        lift.finishing()  # for its last batch and file, not counted as falling behind
        assert len(lifted) == 4 * len(threads) and lift.lifts == 2
    finally:
        stand_in.kill()
        stand_in.wait()
        os.close(read_end)
        os.close(write_end)


def test_a_lift_refused_leaves_the_writer_as_it_was(caplog):
    read_end, write_end = os.pipe()
    try:
        def refused(tid):
            raise PermissionError(1, "Operation not permitted")

        lift = LiftWhenBehind(write_end, os.getpid(), lift=refused)
        os.write(write_end, b"a batch")
        with caplog.at_level(logging.WARNING, "kinspect.capture"):
            lift.judge()
        assert lift.lifts == 0
        assert [r.getMessage() for r in caplog.records] == [
            "capture: could not move the writer process out of the idle class ([Errno 1] Operation not permitted)"]
    finally:
        os.close(read_end)
        os.close(write_end)


def test_giving_way_puts_every_thread_in_the_idle_class_while_inside():
    """In the idle class inside GiveWay, back in the normal class outside; where leaving the class is refused, it
    stays there and says so once. In a process of its own: a refusal leaves its threads in the idle class."""
    code = ("import logging, os, sys\n"
            "logging.basicConfig(level=logging.WARNING, format='%(message)s', stream=sys.stdout)\n"
            "from kinspect.capture import writer_priority\n"
            "give_way = writer_priority.GiveWay()\n"
            "with give_way:\n"
            "    inside = os.sched_getscheduler(0)\n"
            "after = os.sched_getscheduler(0)\n"
            "def refused(tid): raise PermissionError(1, 'Operation not permitted')\n"
            "writer_priority.set_normal = refused\n"
            "for _ in range(2):\n"
            "    with give_way: pass\n"
            "print(inside, after, os.sched_getscheduler(0), give_way.refused)\n")
    *logged, states = run_snippet(code).splitlines()
    after = os.SCHED_OTHER if may_leave_idle_class() else os.SCHED_IDLE
    assert states == f"{os.SCHED_IDLE} {after} {os.SCHED_IDLE} True"
    # once, whether the test's stand-in refused it or the kernel did
    assert logged == ["capture writer: staying in the idle class; leaving it was refused ([Errno 1] Operation not "
                      "permitted)"]


def test_an_idle_writer_on_a_busy_core_is_lifted_when_behind(codec: Codec, tmp_path):
    """On a core two busy processes keep busy, an idle-class writer gets almost nothing (weight 3 against their 1024
    each: four batches, about 0.06 s of its CPU, would take it most of a minute). Where it may leave the class, the
    proxy lifts it as it falls behind (its pipe holds a batch as the next goes, or it has held one for a second),
    and it writes them in seconds; it waits for input in the normal class, and works on a batch that finds it
    keeping up in the idle class. Where it may not, "idle" stays in the idle class throughout, and is never
    lifted."""
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True, writer_priority="idle", row_group_rows=512).start()
    pid, facts = w._out.proc.pid, recorded_facts(codec, 256)
    idle, normal = (os.SCHED_IDLE, nicer_than_this()), (os.SCHED_OTHER, nicer_than_this())
    if not w._out.liftable:
        assert scheduling(pid) == {idle}
        w.close()
        assert w._out.lifts == 0 and w._out.exit_codes == [0]
        return
    try:
        assert scheduling(pid) == {normal}  # waiting for input
        # A first batch costs the process about a second of CPU (it compiles the scans of the apis it meets): paid
        # before the cores are made busy.
        for f in facts + facts:
            w.offer(*f)
        poll_until(lambda: w.rows_written >= 512, 60)
        cpu = min(os.sched_getaffinity(0))
        for tid in thread_ids(pid):
            os.sched_setaffinity(tid, {cpu})
        with spinning_on(cpu, 2):
            for _ in range(8):  # four batches at once
                for f in facts:
                    w.offer(*f)
            poll_until(lambda: w.rows_written >= 2560, 60)
            assert w._out.lifts >= 1
            registry = CollectorRegistry()
            registry.register(CaptureCollector(w))
            assert registry.get_sample_value("kinspect_capture_writer_behind_total") == w._out.lifts
        poll_until(lambda: scheduling(pid) == {normal})  # waiting for input again
        with spinning_on(cpu, 2):
            for f in facts + facts:  # a batch that finds it keeping up: in the idle class, on a busy core
                w.offer(*f)
            poll_until(lambda: scheduling(pid) == {idle})
            w.close()  # lifted (overdue, or to finish), so that its last batch and file get a core
    finally:
        w.close()
    assert w.rows_written == 3072 and w.write_errors == 0 and w._out.exit_codes == [0]


def test_a_writer_process_refused_the_idle_class_runs_nicer(tmp_path):
    code = ("import os\n"
            "def refused(*args): raise PermissionError('no')\n"
            "os.sched_setscheduler = refused\n"
            "from kinspect.capture.writer_priority import NICENESS, lower_priority\n"
            "before = os.nice(0)\n"
            "print(lower_priority('idle'), os.nice(0) - before, NICENESS)\n")
    got, raised, niceness = run_snippet(code).rsplit(" ", 2)
    assert got == f"nice +{NICENESS}" and int(raised) == min(int(niceness), 19 - os.nice(0))


def test_a_terminal_interrupt_does_not_stop_the_writer_process(codec: Codec, tmp_path):
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True).start()
    facts = recorded_facts(codec, 40)
    for f in facts[:20]:
        w.offer(*f)
    poll_until(lambda: w.queue_depth == 0)
    os.kill(w._out.proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    for f in facts[20:]:
        w.offer(*f)
    w.close()
    assert w._out.exit_codes == [0] and w.rows_written == 40 and w.write_errors == 0


@pytest.mark.parametrize("value, expected", [(None, True), (False, False)])
def test_the_config_chooses_the_writer_process(tmp_path, value, expected):
    config = CaptureConfig(enabled=True, directory=str(tmp_path))
    if value is not None:
        config.writer_process = value
    assert CaptureObserver.from_config(config).writer.process is expected


def test_the_config_chooses_the_writer_process_s_priority(tmp_path):
    from kinspect.capture.writer import PRIORITIES
    from kinspect.config import _CHOICES

    assert _CHOICES[("capture", "writer_priority")] == PRIORITIES  # the config's copy (it imports no other layer)
    assert CaptureObserver.from_config(CaptureConfig(directory=str(tmp_path))).writer.writer_priority == "auto"
    config = load_config(None, {"capture.writer_priority": "idle", "capture.directory": str(tmp_path)})
    assert CaptureObserver.from_config(config.capture).writer.writer_priority == "idle"
    with pytest.raises(ConfigError, match="^capture.writer_priority must be one of auto, low, idle, not 'lowest'$"):
        load_config(None, {"capture.writer_priority": "lowest"})
    with pytest.raises(ValueError, match="capture.writer_priority must be one of auto, low, idle"):
        CaptureWriter(tmp_path, BatchBuilder(0.0), process=True, writer_priority="nice")


def test_a_proxy_whose_rows_the_writer_process_builds_never_loads_pyarrow(tmp_path):
    """pyarrow is about 40 MB of the proxy's memory: with the writer process, only that process loads it."""
    script = (
        "import sys\n"
        "from kinspect.capture.observer import CaptureObserver\n"
        "from kinspect.protocol.codec import Codec\n"
        f"o = CaptureObserver({str(tmp_path)!r}, Codec(), process=True).start()\n"
        "o.close()\n"
        "print(o.writer.files_written, o.writer._out.exit_codes, any(m.startswith('pyarrow') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "[0]", "False"]


def test_a_batch_crosses_the_pipe_pickled_a_slice_at_a_time(codec: Codec):
    import threading

    from kinspect.capture import writer_priority, writer_process

    facts = [f for f, _ in recorded_facts(codec)] * 3
    rows = 2 * writer_process.PICKLE_ROWS + 2  # two whole slices and a part
    pieces = writer_process.pickled_slices(facts[:rows])
    assert len(pieces) == 3  # each pickle.dumps holds the GIL for a slice only
    read_fd, write_fd = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.extend(
        writer_process.read_message(read_fd) for _ in range(3)))
    reader.start()  # the pipe holds 64 KiB: the writes below wait for this reader
    try:
        writer_process.write_pieces(write_fd, pieces)
        writer_process.write_pieces(write_fd, writer_process.pickled_slices(facts))
        writer_process.write_pieces(write_fd, writer_process.pickled_slices([]))
        reader.join(30)
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert [writer_process.read_batch(message) for message in got] == [facts[:rows], facts, []]
    assert len(got[1]) > 64 * 1024  # more than the pipe holds at once


def test_the_writer_process_starts_without_threads_that_burn_cpu(codec: Codec, tmp_path, monkeypatch):
    """Only its main thread works: numpy's OpenBLAS would start a thread a core that spins as it is imported."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True, warm_facts=warm_facts(codec)).start()
    try:
        pid = w._out.proc.pid  # ready: numpy and pyarrow imported, one batch built
        cpu = {}
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                cpu[int(task)] = int(f.read().split()[0]) / 1e6
        main = cpu.pop(pid)
        assert main > 50, "the writer process did not import and build before it said it was ready"
        assert sum(cpu.values()) < 20, f"threads besides the main one used {cpu} ms of CPU"
    finally:
        w.close()


def test_the_writer_process_runs_this_kinspect_whatever_the_current_directory(codec: Codec, tmp_path, monkeypatch):
    """`python -m` puts the current directory first on sys.path: a proxy started beside another kinspect
    (a source checkout of another version) must still build its rows with its own code."""
    other = tmp_path / "elsewhere" / "kinspect"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise ImportError('the kinspect of the current directory')\n")
    monkeypatch.chdir(other.parent)
    w = CaptureWriter(tmp_path / "captures", BatchBuilder(0.0), process=True).start()
    for facts, held in recorded_facts(codec, 30):
        w.offer(facts, held)
    w.close()
    assert w._out.exit_codes == [0] and w.rows_written == 30 and w.write_errors == 0
    assert read_rows(w.files).num_rows == 30


def test_the_writer_process_collector_leaves_a_batch_alone(codec: Codec):
    """A batch's facts, unpickled and built, set off young collections that walk them again and again; in
    the writer process (settle_collector) none runs for a batch, and what was imported is never walked."""
    import gc

    from kinspect.capture import writer_priority, writer_process

    facts = [f for f, _ in recorded_facts(codec)]
    payload = encode_python(share_alike_sides((facts * 4)[:512]))  # as the writer thread sends it
    builder = BatchBuilder(0.0)
    builder.build(facts[:8])
    collections: list[int] = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    def one_batch() -> list[int]:
        collections.clear()
        gc.callbacks.append(count)
        try:
            builder.build(writer_process.read_batch(payload))
        finally:
            gc.callbacks.remove(count)
        return list(collections)

    threshold = gc.get_threshold()
    try:
        assert one_batch()  # CPython's defaults: a young collection every 700 new objects, a few a batch
        writer_process.settle_collector()
        assert gc.get_freeze_count() > 10_000  # the modules and their objects: out of every collection
        assert one_batch() == []
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_a_batch_goes_to_the_writer_process_in_one_write(codec: Codec, tmp_path):
    """The pipe holds a whole batch (PIPE_BYTES) where the system allows it, so that the thread and the
    process do not take turns at 64 KB a time."""
    import fcntl

    from kinspect.capture.writer_process import PIPE_BYTES

    with open("/proc/sys/fs/pipe-max-size") as f:
        allowed = int(f.read())
    w = CaptureWriter(tmp_path, BatchBuilder(0.0), process=True).start()
    try:
        size = fcntl.fcntl(w._out.proc.stdin.fileno(), fcntl.F_GETPIPE_SZ)
        assert size == PIPE_BYTES if (allowed >= PIPE_BYTES or os.geteuid() == 0) else size == 64 * 1024
        for facts, held in recorded_facts(codec, 30):
            w.offer(facts, held)
    finally:
        w.close()
    assert w.rows_written == 30
