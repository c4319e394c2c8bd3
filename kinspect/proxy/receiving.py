"""The relay's receiving end: every read goes into one buffer of a megabyte, and on as bytes.

uvloop reads a plain protocol's bytes 256 KiB at a time. A bulk producer's 1 MB Produce
request then takes four reads, and each read costs the proxy a system call, a wake-up and
the session's work. A buffered protocol chooses its own buffer. Reading into one of
READ_BUFFER_BYTES cost the bulk producer 5 to 10% less proxy CPU per MB (two live runs of
interleaved repetitions and bench_proxy.py against the tree before; docs/performance.md). The buffer is shared by every connection of a
thread. A read is copied out into bytes before the next one can land in it, as uvloop's own
buffer is, so it costs one megabyte per event-loop thread, not per connection.

`receiver(callback)` is the C Receiver (kinspect/proxy/_receive.c) where it is built; the
class below is its reference (tests/proxy/test_receiving.py gives both the same reads).
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


_NATIVE: list = []  # the C Receiver class, or None, once looked for


def receiver(callback, native: bool = True):
    """A Receiver handing this thread's reads to `callback`: the C one where built (`native`), else Python."""
    if not _NATIVE:
        module = optional_extension("kinspect.proxy._receive")
        _NATIVE.append(None if module is None else module.Receiver)
    kind = _NATIVE[0] if native and _NATIVE[0] is not None else Receiver
    return kind(callback, read_buffer())
