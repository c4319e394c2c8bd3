"""Where a profiled proxy's samples went: py-spy raw stacks summed by function and by part of kinspect.

    python benchmarks/profile_summary.py PROFILE.txt [PROFILE.txt ...] [--top N]

Reads `py-spy record --format raw` files (one collapsed stack and its sample count a line)
and prints, per file: the share of samples in each part of kinspect, the functions where
samples ended (self) and the functions on the stack (inclusive), as % of all samples.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# Part of the proxy a sample belongs to, by the first rule matching any frame of its stack
# (outermost rules first: a metrics call made from the relay counts as metrics).
PARTS = [
    ("capture (rows, Parquet writer thread)", re.compile(r"kinspect/capture/|pyarrow/|CaptureWriter")),
    ("metrics (observer + prometheus_client)", re.compile(r"kinspect/observers/metrics|prometheus_client/")),
    ("other observers (logs, debug)", re.compile(r"kinspect/observers/|kinspect/logs|logging/")),
    ("rewrite", re.compile(r"kinspect/proxy/rewrite")),
    ("framing + scan (session, protocol)", re.compile(r"kinspect/session/|kinspect/protocol/")),
    ("relay Python (forwarding, dispatch)", re.compile(r"kinspect/proxy/")),
]
LOOP_PART = "event loop + socket I/O (uvloop, send/recv syscalls)"
# Leaves that are a syscall or the event loop's C code: the relay's transport.write() is a
# send() on the socket; Runner.run as a leaf is uvloop's C loop (epoll, recv, callbacks).
IO_LEAF = re.compile(r"^(Relay\._write|Runner\.run|_Side\.data_received) |\((libc|libuv|libpthread)[^)]*\)$|"
                     r"^(write|read|epoll_\w+|sendmsg|recvmsg|__libc_\w+|send|recv)\b|\[transport\.write\]$")
RELAY_SOURCE = Path(__file__).resolve().parents[1] / "kinspect" / "proxy" / "relay.py"


def _write_lines(source: Path = RELAY_SOURCE) -> set[int]:
    """Lines of relay.py that call a transport's write(): a sample there is in the send() syscall."""
    try:
        lines = source.read_text("utf-8").splitlines()
    except OSError:
        return set()
    return {n for n, line in enumerate(lines, 1) if re.search(r"\.write\(", line) and "def " not in line}


def _function(frame: str) -> str:
    return re.sub(r":\d+\)$", ")", frame.strip())


def read_stacks(path: Path, writes: set[int] | None = None) -> list[tuple[list[str], int]]:
    """(frames, samples) of each stack; `writes`: relay.py's lines that write (default: read from the tree)."""
    stacks = []
    writes = _write_lines() if writes is None else writes
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        raw = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        frames = [_function(f) for f in raw]
        if frames:
            # A relay method that writes inline (no Relay._write frame): its write lines are the syscall.
            leaf = re.search(r"kinspect/proxy/relay\.py:(\d+)\)$", raw[-1])
            if leaf and int(leaf.group(1)) in writes:
                frames[-1] += " [transport.write]"
            stacks.append((frames, int(count)))
    return stacks


def summarize(path: Path, writes: set[int] | None = None) -> dict:
    stacks = read_stacks(path, writes)
    total = sum(n for _, n in stacks)
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    parts: collections.Counter = collections.Counter()
    for frames, n in stacks:
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
        joined = ";".join(frames)
        for name, pattern in PARTS:
            if pattern.search(joined):
                # Relay Python whose leaf is a write or the loop itself is socket I/O, not Python work.
                if name.startswith("relay") and IO_LEAF.search(frames[-1]):
                    parts[LOOP_PART] += n
                else:
                    parts[name] += n
                break
        else:
            parts[LOOP_PART if IO_LEAF.search(frames[-1]) or len(frames) <= 6 else "other"] += n
    pct = (lambda c: [(k, 100.0 * v / total) for k, v in c.most_common()]) if total else (lambda c: [])
    python = total - parts[LOOP_PART]
    python_parts = [(k, 100.0 * v / python) for k, v in parts.most_common() if k != LOOP_PART] if python else []
    return {"file": str(path), "samples": total, "parts": pct(parts), "python_samples": python,
            "python_parts": python_parts, "self": pct(own), "inclusive": pct(inclusive)}


def render(summary: dict, top: int = 15) -> str:
    out = [f"{summary['file']}: {summary['samples']} samples"]
    out.append("  by part of the proxy (py-spy counts a thread waiting for a core as busy: the I/O share is")
    out.append("  overstated on a loaded machine; see docs/performance.md):")
    out += [f"    {p:5.1f}%  {k}" for k, p in summary["parts"]]
    out.append(f"  the {summary['python_samples']} samples in Python code, by part:")
    out += [f"    {p:5.1f}%  {k}" for k, p in summary["python_parts"]]
    out.append(f"  top {top} functions by own samples:")
    out += [f"    {p:5.1f}%  {k}" for k, p in summary["self"][:top]]
    out.append(f"  top {top} functions by inclusive samples (below the event loop):")
    out += [f"    {p:5.1f}%  {k}" for k, p in summary["inclusive"] if p < 99.0][:top]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    for path in args.files:
        if not path.is_file():
            print(f"no such profile: {path}", file=sys.stderr)
            return 2
        print(render(summarize(path), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
