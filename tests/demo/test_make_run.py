"""`make run` (kinspect demo) from a clean clone, as a new user runs it; and the demo's pieces on their own.

The main test copies the working tree (the files `git ls-files -co --exclude-standard`
lists: uncommitted work included, no .venv or build artifacts) into a fresh directory,
runs `make run` there (a fresh venv inside the clone), reads the summary, checks its
figures against the workload and against /metrics, then sends SIGINT to the process
group as a terminal's Ctrl-C does and checks that nothing it started is left.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.demo.runner import RUNNING, DemoError, choose_ports, prepare_workdir, release_workdir
from kinspect.demo.summary import END_MARKER, SummaryObserver, percentile, render_summary
from kinspect.demo.workload import CODECS, RECORDS_PER_CODEC
from kinspect.session import ConnectionInfo, Session
from tests.support.proxy_harness import api_versions, poll_until, produce
from tests.support.tansu import free_port
from tests.support.paths import ROOT

REPO = ROOT
SUMMARY_DEADLINE = 120.0  # seconds from `make run` to the end of the summary, fresh venv included
STOP_DEADLINE = 30.0
ANALYZE_DEADLINE = 420.0  # `make analyze`: the pipeline extra's install (pyspark) and the Spark job


# ----------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has finished running


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def processes_inside(directory: Path) -> list[tuple[int, str]]:
    """Live processes whose working directory or executable lies under directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        for link in ("cwd", "exe"):
            try:
                target = os.readlink(entry / link)
            except OSError:
                continue
            if target == str(directory) or target.startswith(f"{directory}/"):
                found.append((int(entry.name), target))
                break
    return found


def clean_env() -> dict[str, str]:
    """The environment of a user who has not activated any virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return env


def clean_clone(target: Path) -> Path:
    """The working tree's files as git lists them (tracked and untracked, not ignored) in a new repository."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)
    subprocess.run(["git", "init", "-q"], cwd=target, check=True)
    return target


class Output:
    """The lines a process prints, read with a deadline (non-blocking reads of its stdout)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        os.set_blocking(proc.stdout.fileno(), False)
        self.text = ""

    def until(self, marker: str, deadline: float) -> str:
        while marker not in self.text:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} before the deadline; output so far:\n{self.text[-6000:]}")
            self._read()
            if marker not in self.text and self.proc.poll() is not None:
                self._read()
                if marker not in self.text:
                    raise AssertionError(f"exited with {self.proc.returncode} before {marker!r}:\n{self.text[-6000:]}")
            time.sleep(0.05)
        return self.text

    def _read(self) -> None:
        try:
            data = self.proc.stdout.read()
        except BlockingIOError:
            data = None
        if data:
            self.text += data.decode(errors="replace")


def parse_summary(text: str) -> dict:
    """The figures a test checks, read from the printed summary."""
    summary = text[text.index("== kinspect demo: what kinspect saw =="):text.index(END_MARKER)]
    out = {"table": {}}
    m = re.search(r"produced (\d+) records \(([^)]*)\), consumed (\d+) in group", summary)
    assert m, summary
    out["produced"], out["consumed"] = int(m.group(1)), int(m.group(3))
    out["produced_by_codec"] = {c: int(n) for c, n in (part.split() for part in m.group(2).split(", "))}
    m = re.search(r"records in Produce requests: ([\d,]+)(?: \(([^)]*)\))?", summary)
    assert m, summary
    out["seen_records"] = int(m.group(1).replace(",", ""))
    parts = [p.split() for p in (m.group(2) or "").split(", ") if p]
    out["seen_by_codec"] = {c: int(n.replace(",", "")) for c, n in parts}
    for line in summary.splitlines():
        row = re.match(r"(\w+) v(\d+)\s+([\d,]+)\s+([\d,]+)\s+(\S+)\s+(\S+)$", line)
        if row:
            sizes = [[int(v.replace(",", "")) for v in cell.split("/")] if cell != "-" else None
                     for cell in row.group(5, 6)]
            out["table"][(row.group(1), int(row.group(2)))] = (
                int(row.group(3).replace(",", "")), int(row.group(4).replace(",", "")), *sizes)
    out["metrics"] = re.search(r"metrics\s+(http://127\.0\.0\.1:\d+/metrics)", summary).group(1)
    out["bootstrap"] = re.search(r"bootstrap\s+(127\.0\.0\.1:\d+)", summary).group(1)
    out["debug_log"] = Path(re.search(r"debug log\s+(\S+)", summary).group(1))
    out["captures"] = Path(re.search(r"captures\s+(\S+)", summary).group(1))
    out["tagged"] = summary[summary.index("tagged fields seen:"):summary.index("where things are:")]
    return out


# ----------------------------------------------------------------------------- make run


@pytest.mark.integration
@pytest.mark.timeout(SUMMARY_DEADLINE + STOP_DEADLINE + ANALYZE_DEADLINE + 60)
def test_make_run_from_a_clean_clone(tmp_path: Path):
    clone = clean_clone(tmp_path / "kinspect")
    assert not (clone / ".venv").exists() and not list(clone.glob("kinspect/protocol/codec/*.so"))
    started = time.monotonic()
    proc = subprocess.Popen(["make", "run"], cwd=clone, env=clean_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    pgid = proc.pid
    tansu_pid = None
    try:
        out = Output(proc)
        text = out.until(END_MARKER, started + SUMMARY_DEADLINE)
        elapsed = time.monotonic() - started
        print(f"\nmake run: summary after {elapsed:.1f} s (fresh venv and install included)")
        tansu_pid = int(re.search(r"broker: tansu pid (\d+)", text).group(1))
        assert alive(tansu_pid)
        assert (clone / ".venv" / "bin" / "kinspect").is_file()  # the clone's own fresh venv ran it
        # The install is quiet: one line saying what it does, not setuptools' editable-install notice.
        assert "make run: installing kinspect" in text and "Editable installation" not in text
        summary = parse_summary(text)

        # The workload's own account and kinspect's agree.
        expected = RECORDS_PER_CODEC * len(CODECS)
        assert summary["produced"] == summary["consumed"] == expected
        assert summary["produced_by_codec"] == {c: RECORDS_PER_CODEC for c in CODECS}
        assert summary["seen_records"] == expected
        assert summary["seen_by_codec"] == {c: RECORDS_PER_CODEC for c in CODECS}
        table = summary["table"]
        apis = {name for name, _ in table}
        assert {"ApiVersions", "Metadata", "CreateTopics", "Produce", "Fetch", "FindCoordinator", "JoinGroup",
                "SyncGroup", "OffsetCommit", "LeaveGroup"} <= apis, apis
        produce_requests = sum(row[0] for (name, _), row in table.items() if name == "Produce")
        assert produce_requests >= len(CODECS)  # one producer per codec
        for (name, version), (requests, responses, req, resp) in table.items():
            assert requests >= responses >= 1, (name, version)
            assert req[0] <= req[1] <= req[2] <= req[3] and resp[0] <= resp[1] <= resp[2] <= resp[3], (name, version)
        fetch_max = max(row[3][3] for (name, _), row in table.items() if name == "Fetch")
        assert fetch_max > 1000  # the records came back through kinspect
        assert "ApiVersions v3  response body" in summary["tagged"] and "SupportedFeatures" in summary["tagged"]

        # /metrics, at the printed address, counts the same traffic.
        with urllib.request.urlopen(summary["metrics"], timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        produced = {s.labels["compression"]: s.value for s in families["kinspect_produced_records"].samples
                    if s.name == "kinspect_produced_records_total"}
        assert produced == {c: RECORDS_PER_CODEC for c in CODECS}
        requests = sum(s.value for s in families["kinspect_requests"].samples
                       if s.name == "kinspect_requests_total" and s.labels["api"] == "Produce")
        assert requests == produce_requests
        # The debug log has one kafka.request line per request.
        lines = summary["debug_log"].read_text().splitlines()
        assert sum('"event": "kafka.request"' in line for line in lines) == sum(r[0] for r in table.values())
        assert str(summary["debug_log"]).startswith(str(clone / ".kinspect-demo"))
        # A finished capture file shows up while the demo keeps running.
        captures = summary["captures"]
        assert captures == clone / ".kinspect-demo" / "captures"
        poll_until(lambda: list(captures.glob("*.parquet")), timeout=20, interval=0.2)

        # Ctrl-C: SIGINT to the whole foreground process group.
        os.killpg(pgid, signal.SIGINT)
        proc.wait(timeout=STOP_DEADLINE)
        text = out.until("kinspect demo: stopped", time.monotonic() + 5)
        print(text[text.index(END_MARKER):])
        assert re.search(rf"stopped \(tansu pid {tansu_pid} exited with status 0\)", text)
        poll_until(lambda: not alive(tansu_pid) and not group_members(pgid), timeout=10)
        assert processes_inside(clone) == []
        # Ctrl-C finished the capture: every exchange is a row, no half-written file is left.
        import pyarrow.parquet as pq

        closed = re.search(r"proxy closed after ([\d,]+) requests in total \(([\d,]+) unanswered", text)
        total, unanswered = (int(g.replace(",", "")) for g in closed.groups())
        assert total >= sum(row[0] for row in table.values())
        # A request cut by its client's close (a consumer's pending Fetch) has no response, so no row.
        assert unanswered <= 3, unanswered
        rows = sum(pq.read_table(f).num_rows for f in captures.glob("*.parquet"))
        assert rows == total - unanswered and not list(captures.glob("*.tmp"))
        assert f"captures: {rows:,} rows in" in text
        # Nothing shows where the developer's checkout is: paths are the clone's.
        assert "/work/" not in text.replace(str(clone), "CLONE") or str(clone).startswith("/work/")

        # The documented next step, as the summary names it: make analyze, in the same folder.
        assert re.search(r"^  next step  make analyze  \(the Spark report on these captures", text, re.M)
        analyze = subprocess.run(["make", "analyze"], cwd=clone, env=clean_env(), stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=ANALYZE_DEADLINE)
        assert analyze.returncode == 0, analyze.stdout[-3000:] + analyze.stderr[-3000:]
        report = clone / ".kinspect-demo" / "report"
        assert (report / "report.html").stat().st_size > 1000
        assert (report / "tables" / "api_sizes.csv").is_file()
        assert "kinspect analyze: done" in analyze.stderr
        assert "Editable installation" not in analyze.stdout + analyze.stderr  # a quiet install is quiet
    finally:
        if group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
        if tansu_pid is not None and alive(tansu_pid):
            os.kill(tansu_pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=10)


# ----------------------------------------------------------------------------- stopping, every way


def start_demo(workdir: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kinspect.cli.main", "demo", "--workdir", str(workdir), *flags],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGINT during the workload"])
def test_the_demo_stops_and_leaves_nothing(tmp_path: Path, how: str):
    """SIGKILL: Tansu's death signal kills it. SIGTERM, or Ctrl-C mid-workload: an orderly stop, exit 0."""
    workload = how.endswith("workload")
    proc = start_demo(tmp_path / "work", *(() if workload else ("--no-workload",)))
    tansu_pid = None
    try:
        out = Output(proc)
        text = out.until("running the sample workload" if workload else RUNNING, time.monotonic() + 30)
        tansu_pid = int(re.search(r"broker: tansu pid (\d+)", text).group(1))
        assert alive(tansu_pid) and _stat(tansu_pid)[1] != proc.pid  # its own process group: Ctrl-C misses it
        if how == "SIGKILL":
            assert "workload: none (--no-workload)" in text
            proc.kill()
            proc.wait(timeout=10)
        else:
            os.killpg(proc.pid, signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
            assert proc.wait(timeout=30) == 0
            text = out.until("kinspect demo: stopped", time.monotonic() + 5)
            assert re.search(rf"stopped \(tansu pid {tansu_pid} exited with status 0\)", text)
            assert "proxy closed after" in text
            if workload:
                assert "stopping the workload" in text and END_MARKER not in text
        poll_until(lambda: not alive(tansu_pid), timeout=10)
        # The capture's writer process finishes its file once its input ends with the demo, then exits.
        poll_until(lambda: group_members(proc.pid) == [], timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if tansu_pid is not None and alive(tansu_pid):
            os.kill(tansu_pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- the pieces


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert [percentile([7], p) for p in (50, 99)] == [7, 7]
    assert [percentile([1, 2, 3], p) for p in (50, 90)] == [2, 3]
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_of_a_session(codec):
    """Frames through a real Session: counts, size percentiles, tagged fields and records in the printed summary."""
    observer = SummaryObserver()
    session = Session(codec, ConnectionInfo(1, "127.0.0.1:5000", "127.0.0.1:9092"))
    api_response = codec.encode_response(18, 3, {"CorrelationId": 0}, {
        "ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 0, "MaxVersion": 11}], "ThrottleTimeMs": 0,
        "SupportedFeatures": [], "FinalizedFeaturesEpoch": 7, "FinalizedFeatures": [], "ZkMigrationReady": False})
    produce_response = codec.encode_response(0, 9, {"CorrelationId": 0}, {"ThrottleTimeMs": 0, "Responses": [{
        "Name": "t", "PartitionResponses": [{"Index": 0, "ErrorCode": 0, "BaseOffset": 0, "LogAppendTimeMs": -1,
                                             "LogStartOffset": 0, "RecordErrors": [], "ErrorMessage": None}]}]})
    request_sizes = []
    for cid in range(3):
        frame = api_versions(codec, cid)
        request_sizes.append(len(frame) - 4)
        events = session.client_data(frame, float(cid)).events
        response = cid.to_bytes(4, "big") + api_response[4:]
        events += session.broker_data(len(response).to_bytes(4, "big") + response, cid + 0.5).events
        for event in events:
            observer.on_event(event)
    sizes = []
    for cid, n in ((10, 5), (11, 40)):
        frame = produce(codec, cid, "t", [b"v%d" % i for i in range(n)])
        sizes.append(len(frame) - 4)
        response = cid.to_bytes(4, "big") + produce_response[4:]
        for event in (session.client_data(frame, 1.0).events
                      + session.broker_data(len(response).to_bytes(4, "big") + response, 1.5).events):
            observer.on_event(event)

    text = render_summary(observer, ["workload: synthetic"], [("metrics", "http://127.0.0.1:1/metrics")])
    lines = text.splitlines()
    assert lines[0].startswith("== ") and lines[1] == "workload: synthetic" and lines[-1] == END_MARKER
    assert "kinspect saw 1 connections, 5 requests, 5 responses, 0 problems" in text
    assert "records in Produce requests: 45 (none 45)" in text
    api_row = next(line for line in lines if line.startswith("ApiVersions v3 "))
    size = request_sizes[0]
    assert api_row.split()[2:] == ["3", "3", f"{size}/{size}/{size}/{size}", "/".join([f"{len(api_response)}"] * 4)]
    produce_row = next(line for line in lines if line.startswith("Produce v9 "))
    small, large = sorted(sizes)
    assert produce_row.split()[2:] == ["2", "2", f"{small}/{large}/{large}/{large}",
                                        "/".join([f"{len(produce_response)}"] * 4)]
    tagged = text[text.index("tagged fields seen:"):text.index("where things are:")]
    for tag, name in ((0, "SupportedFeatures"), (1, "FinalizedFeaturesEpoch")):
        assert re.search(rf"ApiVersions v3\s+response body\s+{tag}\s+{name}\s+3\n", tagged), tagged
    assert "Produce" not in tagged
    assert re.search(r"metrics\s+http://127.0.0.1:1/metrics", text)


def test_empty_summary_says_so():
    text = render_summary(SummaryObserver(), [], [])
    assert "kinspect saw 0 connections, 0 requests" in text and "  (none)" in text


def test_workdir_is_emptied_only_when_the_demo_made_it(tmp_path: Path):
    work = prepare_workdir(tmp_path / "work")
    (work / "captures").mkdir()
    (work / "captures" / "old.parquet").write_bytes(b"x")
    (work / "kinspect.log").write_text("old")
    assert prepare_workdir(work) == work
    assert sorted(p.name for p in work.iterdir()) == [".kinspect-demo-workdir", ".kinspect-demo.lock"]
    release_workdir(work)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DemoError, match=r"mine is not empty and was not made by kinspect demo"):
        prepare_workdir(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_a_second_demo_in_the_same_workdir_is_refused(tmp_path: Path):
    """A running demo holds a lock in its workdir: another one there stops before emptying it."""
    import fcntl

    from kinspect.demo.runner import WORKDIR_LOCK

    work = prepare_workdir(tmp_path / "work")
    (work / "captures").mkdir()
    try:
        # Another process's lock (flock is per open file: a second open of the file stands for it).
        release_workdir(work)
        with open(work / WORKDIR_LOCK, "a+") as other:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            other.truncate(0)
            other.write("pid 4242\n")
            other.flush()
            with pytest.raises(DemoError, match=r"work is in use by a running kinspect demo \(pid 4242\); stop it, "
                                                r"or give this one another --workdir"):
                prepare_workdir(work)
            assert (work / "captures").is_dir()  # nothing was emptied
        assert prepare_workdir(work) == work  # free again once the other one has gone
        assert not (work / "captures").exists()
    finally:
        release_workdir(work)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_second_demo_process_is_refused(tmp_path: Path):
    work = tmp_path / "work"
    first = start_demo(work, "--no-workload")
    try:
        out = Output(first)
        out.until(RUNNING, time.monotonic() + 30)
        second = subprocess.run([sys.executable, "-m", "kinspect.cli.main", "demo", "--workdir", str(work),
                                 "--no-workload"], capture_output=True, text=True, timeout=30)
        assert second.returncode == 2 and second.stdout == ""
        assert second.stderr.splitlines() == [
            f"kinspect demo: cannot start: workdir {work} is in use by a running kinspect demo (pid {first.pid}); "
            "stop it, or give this one another --workdir"]
        assert (work / "kinspect.log").is_file() and first.poll() is None  # the first one is untouched
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=30)


def test_fixed_ports_must_be_free():
    import socket

    def four_free() -> int:  # a base whose four ports are all free (other tests run beside this one)
        import random

        for _ in range(200):
            # Below the ephemeral range (32768+), where busy machines' outgoing connections churn.
            base = random.randrange(20000, 32000)
            try:
                choose_ports(base)
                return base
            except DemoError:
                continue
        raise AssertionError("no four free ports in a row")

    base = four_free()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        with pytest.raises(DemoError, match=rf"port {base + 2} \(the node listener\) on 127.0.0.1 is not free"):
            choose_ports(base)
    with pytest.raises(DemoError, match="outside 1-65535"):
        choose_ports(65534)
    ports = choose_ports(None)
    assert ports.bootstrap == ports.metrics == 0 and ports.node != ports.broker
