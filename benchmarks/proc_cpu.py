"""What a process costs, read from /proc: CPU time, resident memory, open descriptors; CPU pinning."""

from __future__ import annotations

import os
import resource
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a whole process (every thread, live or exited), from /proc/<pid>/stat.

    Its resolution is one clock tick (10 ms): phases must use a second or more of CPU.
    """
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """The live processes started by pid, and by them (kinspect's capture writer process, say)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rpartition(")")[2].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    found, todo = [], list(children.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_cpu_seconds(pid: int | None) -> tuple[float, float] | None:
    """CPU seconds of a process, each process read once: (its own user + system, the tree's). The
    tree's counts it, every live descendant (a Spark JVM's Python workers are its descendants) and
    what their exited children left in their cutime/cstime."""
    if pid is None:
        return None
    own = total = 0.0
    for process in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{process}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            if process == pid:
                return None
            continue  # ended meanwhile
        if process == pid:
            own = (int(fields[11]) + int(fields[12])) / CLK_TCK
        total += sum(int(x) for x in fields[11:15]) / CLK_TCK
    return own, total


def user_system_seconds(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU time of a whole process and its live descendants, from /proc/<pid>/stat:
    Python and C code vs syscalls."""
    if pid is None:
        return None
    user = system = 0
    for process in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{process}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            user, system = user + int(fields[11]), system + int(fields[12])
        except (OSError, IndexError, ValueError):
            if process == pid:
                return None
    return user / CLK_TCK, system / CLK_TCK


def thread_seconds(pid: int, tid: int) -> float:
    """Time on a CPU of one thread of a process, in ns resolution (/proc/<pid>/task/<tid>/schedstat)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def run_seconds_split(pid: int | None) -> tuple[float, float] | None:
    """Time on a CPU of the live threads of the process, and of its descendants' (a kinspect capture's writer
    process), in ns resolution (/proc/<pid>/task/*/schedstat).

    A cross-check of cpu_seconds with finer resolution; it misses threads that exited.
    """
    if pid is None:
        return None
    own = others = 0
    for process in (pid, *descendants(pid)):
        total = 0
        try:
            for task in os.listdir(f"/proc/{process}/task"):
                try:
                    with open(f"/proc/{process}/task/{task}/schedstat") as f:
                        total += int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue  # the thread ended meanwhile
        except OSError:
            if process == pid:
                return None
        if process == pid:
            own = total
        else:
            others += total
    return own / 1e9, others / 1e9


def machine_seconds() -> tuple[float, float, float] | None:
    """The whole machine's CPU time so far, summed over its CPUs, from /proc/stat: (busy, idle, stolen).

    Busy is user, nice, system, irq and softirq time (every process and the kernel's network work);
    idle counts iowait; stolen is time the hypervisor gave another guest while this one wanted a CPU.
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return ((user + nice + system + irq + softirq) / CLK_TCK, (idle + iowait) / CLK_TCK, steal / CLK_TCK)


class CpuMeter:
    """CPU used by a process between start() and stop(), by both counters; the whole machine's CPU time
    in the same span (busy, idle, stolen: machine_seconds); and, given `inspection` (a callable returning
    the process's own count of CPU seconds spent inspecting, or None), that count's growth: the part of
    the CPU that was inspection rather than forwarding."""

    def __init__(self, pid: int | None, inspection=None) -> None:
        self.pid = pid
        self.inspection = inspection
        self.us0 = self.r0 = self.i0 = self.m0 = None

    def start(self) -> "CpuMeter":
        # The process's own count first: reading it (a scrape) costs the process CPU, outside the phase.
        self.i0 = self.inspection() if self.inspection is not None else None
        self.us0, self.r0 = user_system_seconds(self.pid), run_seconds_split(self.pid)
        self.m0 = machine_seconds()
        return self

    def stop(self) -> dict:
        m1 = machine_seconds()
        us1, r1 = user_system_seconds(self.pid), run_seconds_split(self.pid)
        i1 = self.inspection() if self.inspection is not None and self.i0 is not None else None
        if self.us0 is None or us1 is None:
            user = system = None
        else:
            user, system = us1[0] - self.us0[0], us1[1] - self.us0[1]
        return {
            "cpu_s": None if user is None else user + system, "user_s": user, "system_s": system,
            "run_s": None if self.r0 is None or r1 is None else sum(r1) - sum(self.r0),
            # of run_s, the descendants' (a kinspect capture's writer process)
            "descendants_run_s": None if self.r0 is None or r1 is None else r1[1] - self.r0[1],
            "inspection_s": None if i1 is None else i1 - self.i0,
            # the whole machine's (busy, idle, stolen) seconds over all its CPUs, or None
            "machine_s": None if self.m0 is None or m1 is None else tuple(b - a for a, b in zip(self.m0, m1)),
        }


def rss_kib(pid: int) -> int | None:
    """Resident set size (VmRSS) in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def loadavg() -> list[str]:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return []


def raise_nofile(wanted: int) -> tuple[int, str]:
    """Raise this process's RLIMIT_NOFILE (inherited by the processes it starts) towards `wanted`.

    The soft limit goes up to the hard limit; the hard limit itself only with the privilege
    to raise it (root). Returns the soft limit in force and a sentence saying what was done.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft, f"RLIMIT_NOFILE {soft} already allows {wanted}"
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted, f"RLIMIT_NOFILE raised from {soft}/{hard} to {wanted}/{wanted} (soft/hard)"
        except (ValueError, OSError):
            pass  # not privileged (no CAP_SYS_RESOURCE): the hard limit stays
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if new == soft:
        return soft, f"RLIMIT_NOFILE is {soft} (the hard limit, which cannot be raised here)"
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new, f"RLIMIT_NOFILE soft limit raised from {soft} to {new} (hard limit {hard}, which cannot be raised here)"


def pin_self(cpus: set[int]) -> None:
    """Pin this process's current thread, and so every thread and process it starts from now on."""
    os.sched_setaffinity(0, cpus)


def pin_command(cmd: list[str], cpus: set[int]) -> list[str]:
    """`cmd` run under taskset (which execs it: the pid stays the command's own)."""
    return ["taskset", "-c", ",".join(str(c) for c in sorted(cpus))] + cmd
