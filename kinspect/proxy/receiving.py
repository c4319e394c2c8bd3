"""The relay's receiving end: every read goes into one buffer of a megabyte, and on as bytes.

uvloop reads a plain protocol's bytes 256 KiB at a time. A bulk producer's 1 MB Produce
request then takes four reads, and each read costs the proxy a system call, a wake-up and
the session's work. A buffered protocol chooses its own buffer. Reading into one of
READ_BUFFER_BYTES cost the bulk producer 5 to 10% less proxy CPU per MB (two live runs of
interleaved repetitions and bench_proxy.py against the tree before; docs/performance.md). The
buffer is shared by every connection of a thread, so it costs one megabyte per event-loop
thread, not per connection.

`receiver(callback)` is the C Receiver (kinspect/proxy/_receive.c) where it is built: the
thread's reads land in a bytes object (its Slab), and a long read is handed on as that very
object, not copied. The class below is its reference, which copies each read out of a shared
buffer (tests/proxy/test_receiving.py gives both the same reads).
"""

from __future__ import annotations

import threading

from kinspect.protocol.codec.wire_program import optional_extension

READ_BUFFER_BYTES = 1 << 20

_local = threading.local()


def read_buffer() -> memoryview:
    """This thread's read buffer (one event loop runs in one thread: no two reads share it at once)."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = memoryview(bytearray(READ_BUFFER_BYTES))
    return buffer


def read_slab(module):
    """This thread's Slab of the C receiver `module` (kinspect.proxy._receive), as read_buffer is the reference's."""
    slab = getattr(_local, "slab", None)
    if slab is None:
        slab = _local.slab = module.Slab(READ_BUFFER_BYTES)
    return slab


class Receiver:
    """A buffered protocol's get_buffer and buffer_updated: each read handed to `callback` as bytes."""

    __slots__ = ("callback", "buffer")

    def __init__(self, callback, buffer) -> None:
        self.callback = callback
        self.buffer = buffer

    def get_buffer(self, sizehint: int):
        return self.buffer

    def buffer_updated(self, n: int) -> None:
        if not 0 <= n <= len(self.buffer):
            raise ValueError(f"Receiver: {n} bytes read into a buffer of {len(self.buffer)}")
        if n:
            self.callback(bytes(self.buffer[:n]))


_NATIVE: list = []  # the C module kinspect.proxy._receive, or None, once looked for


def receiver(callback, native: bool = True):
    """A Receiver handing this thread's reads to `callback`: the C one where built (`native`), else Python."""
    if not _NATIVE:
        module = optional_extension("kinspect.proxy._receive")
        _NATIVE.append(module)
    module = _NATIVE[0]
    if native and module is not None:
        return module.Receiver(callback, read_slab(module))
    return Receiver(callback, read_buffer())
