"""Inspection a moment after forwarding: the reads of every connection, inspected in batches, in order.

Why batches: the relay forwards each read at once; inspecting it at once too means running
the session and the observers cold, because between two reads the kernel and the other
processes on the machine (the broker, the clients) have evicted the caches. Measured
in-process with the caches flushed between reads, a small Produce exchange costs 2.7x its
warm cost (docs/performance.md); in a batch, every read after the first finds the code and
the shared tables warm. So reads are queued as they are forwarded and inspected together:
after `delay` seconds, or at once when `max_reads` or `max_bytes` are queued. The queue keeps
the order of reads across connections, so each session sees its bytes in order, with the
times they were read. Rewrite mode does not queue: a response is changed before it is sent.

A batch is inspected by kinspect.proxy._batch where it is built (the loop below, Relay.inspect and
Dispatcher.dispatch in one C call, which the server hands the queue: kinspect.proxy.relay.native_inspect_reads);
the Python loop is the reference, used with KINSPECT_PURE_PYTHON=1 or without inspect_reads.
"""

from __future__ import annotations

import asyncio
import math
import time

# A batch holds up the loop while it is inspected (about 3 us a small read with metrics on, cold start
# included): 32 reads keep that near 0.1 ms, which is what the slowest round trips may gain (64 added
# 0.15 ms to a lone connection's p99 on 2026-11-26; 32 against 16 showed no difference in ten paired
# rounds of a lone connection). They share the cold start among twice as many reads as 16: 4% less CPU
# a small request one at a time, over 40 paired rounds of benchmarks/bench_ab.py (docs/performance.md).
DEFAULT_MAX_READS = 32
# Reads held (not copied) before they are inspected. A bulk read (up to a megabyte,
# kinspect.proxy.receiving) is inspected at once: its cost is per byte, which a batch does not lower, and holding many
# would only grow the memory in use.
DEFAULT_MAX_BYTES = 256 * 1024


class InspectionQueue:
    """Reads forwarded but not yet inspected: (relay, from_client, data, time read), oldest first."""

    __slots__ = ("delay", "max_reads", "max_bytes", "cpu_seconds", "_reads", "_bytes", "_handle", "_flushed_at",
                 "_inspect_reads")

    def __init__(self, delay: float, max_reads: int = DEFAULT_MAX_READS, max_bytes: int = DEFAULT_MAX_BYTES,
                 inspect_reads=None) -> None:
        """inspect_reads: what inspects a batch in one call (kinspect.proxy.relay.native_inspect_reads(), the C
        batch, where built); None: flush's Python loop, the reference."""
        self.delay = delay
        self.max_reads = max_reads
        self.max_bytes = max_bytes
        # CPU time of the thread that inspected the batches (kinspect_inspection_cpu_seconds_total): what
        # inspection costs, apart from forwarding. Two clock reads a batch, about 0.3 us each.
        self.cpu_seconds = 0.0
        self._reads: list = []
        self._bytes = 0
        self._handle: asyncio.TimerHandle | None = None  # the pending flush, on the running loop
        self._flushed_at = -math.inf  # time.monotonic() at the last flush: no read queued now came before it
        self._inspect_reads = inspect_reads

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, relay, from_client: bool, data, now: float) -> None:
        reads = self._reads
        reads.append((relay, from_client, data, now))
        self._bytes += len(data)
        if len(reads) >= self.max_reads or self._bytes >= self.max_bytes:
            self.flush()
        elif self._handle is None:
            self._start_timer()

    def _start_timer(self) -> None:
        """The batch's first read: it is inspected `delay` seconds from now at the latest (kinspect/proxy/_forward.c
        adds reads as `add` does, and calls this)."""
        self._handle = asyncio.get_running_loop().call_later(self.delay, self._due)

    def _due(self) -> None:
        """The timer. One started for an earlier batch, which was flushed since because it was full, finds
        reads that have waited less than `delay`: if they have waited less than half of it, it waits on for
        the rest. Flushing them now would be a cold start shared by a few reads; with 8 connections of one
        request at a time and batches of 16, a third of the batches were such flushes of 1 to 15 reads
        (counted in a copy of the proxy). No read waits longer than `delay` either way."""
        self._handle = None
        if self._reads:
            waited = time.monotonic() - self._flushed_at  # the oldest read waited this long at most
            if waited < self.delay / 2:
                self._handle = asyncio.get_running_loop().call_later(self.delay - waited, self._due)
                return
        self.flush()

    def flush(self) -> None:
        """Inspect every queued read now (before a connection's end, a scrape, a shutdown's count).

        A pending timer is left to fire (`_due` then sees whether what was queued since has waited long
        enough): cancelling it and starting another each batch costs more."""
        if not self._reads:
            return
        inspect_reads = self._inspect_reads
        self._flushed_at = time.monotonic()
        started = time.thread_time()
        while self._reads:  # reads an inspection queues meanwhile (none today) are inspected too
            reads, self._reads, self._bytes = self._reads, [], 0
            if inspect_reads is not None:
                inspect_reads(reads)
            else:
                for relay, from_client, data, now in reads:
                    relay.inspect(from_client, data, now)
        self.cpu_seconds += time.thread_time() - started
