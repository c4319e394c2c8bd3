"""Keeps glibc's malloc from handing each large read fresh pages: the proxy's own allocator settings.

Every read the event loop makes becomes a bytes object of up to 1 MiB, and a frame kept
whole for inspection is one bytes object of up to inspect.inspect_max_bytes (1 MiB). With
glibc's defaults such blocks are mapped for each allocation and unmapped when freed (or
trimmed off the heap's top), so every read page-faults its memory in again: about 130 minor
faults per MB relayed, which made kinspect's kernel time per MB produced 1.7x what the same
bytes cost it without them (`bench_proxy.py --no-small`). Serving blocks under 32 MiB (the most glibc's own adaptive
threshold ever reaches) from the heap, and keeping up to 32 MiB of freed heap for the next
reads rather than returning it at once, takes those faults away. The cost: after a burst of
large frames the process may keep up to that much memory it no longer uses.

The settings are glibc's own (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD). A process
started with MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES in its
environment keeps what the operator chose; other C libraries (musl) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap: reads (1 MiB at most) and whole frames up to 32 MiB (a
# Fetch response held for the rewrite is often several MiB: at 4 MiB here, rewrite mode's CPU per
# MB consumed rose from 0.61 to 1.09 ms, each such frame mapped and faulted in afresh).
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the heap's top kept for the next reads rather than returned at once.
TRIM_THRESHOLD = 32 * 1024 * 1024
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_read_buffers(environ=os.environ) -> str:
    """Set the proxy's malloc thresholds where kinspect may; a line saying what was done, for the log."""
    chosen = [name for name in OPERATOR_SETTINGS if name in environ]
    if chosen:
        return f"malloc settings left as the environment sets them ({', '.join(chosen)})"
    if platform.libc_ver()[0] != "glibc":
        return "malloc settings left alone (not glibc)"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "malloc settings left alone (mallopt not found)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "malloc settings left alone (mallopt refused them)"
    return (f"malloc: blocks under {MMAP_THRESHOLD >> 20} MiB from the heap, up to {TRIM_THRESHOLD >> 20} MiB "
            "of freed heap kept for the next reads")
