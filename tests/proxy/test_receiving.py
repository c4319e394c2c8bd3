"""The relay's receiving end (kinspect.proxy.receiving): the C Receiver against its Python reference,
and reads through a buffered protocol on both event loops, whole and in order."""

from __future__ import annotations

import asyncio
import random
import socket
import threading

import pytest
import uvloop

from kinspect.proxy.receiving import READ_BUFFER_BYTES, Receiver, read_buffer, read_slab, receiver
from kinspect.proxy.relay import _Side
from tests.support.native import bytes_grown, native_module

_receive, _MISSING = native_module("kinspect.proxy._receive")


@pytest.fixture
def native():
    if _receive is None:
        pytest.fail(_MISSING)
    return _receive.Receiver


def _buffer_of(kind):
    return read_slab(_receive) if kind is not Receiver else read_buffer()


def _reads(kind, held: bool = False) -> tuple[list, list]:
    """What a Receiver of `kind` hands on for reads of random sizes written into its buffer (held: while the
    writer's view of it is held, as the event loop holds it through buffer_updated)."""
    handed: list = []
    reads = kind(handed.append, _buffer_of(kind))
    rng = random.Random(7)
    written = []
    for n in [0, 1, 4095, READ_BUFFER_BYTES, 17, 262_145] + [rng.randrange(1, 70_000) for _ in range(50)]:
        buffer = memoryview(reads.get_buffer(-1))
        data = rng.randbytes(n)
        buffer[:n] = data
        if not held:
            buffer.release()
        reads.buffer_updated(n)
        buffer.release()
        if n:
            written.append(data)
    return handed, written


@pytest.mark.parametrize("held", [False, True], ids=["released", "held"])
def test_the_c_receiver_hands_on_what_the_python_one_does(native, held):
    handed, written = _reads(native, held)
    assert handed == written and all(type(data) is bytes for data in handed)
    assert _reads(Receiver, held) == (handed, written)
    assert receiver(print).get_buffer(0) is read_slab(_receive) and type(receiver(print)) is native
    assert type(receiver(print, native=False)) is Receiver


def test_a_long_read_is_handed_on_as_the_bytes_it_landed_in(native):
    """A read of COPY_BELOW bytes or more is the slab's spare itself, cut to its length, and the next read lands
    in a new spare: what was handed on never changes. A shorter read is copied, and the spare kept; so is a read
    while another view of the slab is held, which could still write into it. (The spare is named by its id: a
    reference held here would make it shared, and copied.)"""
    handed: list = []
    slab = _receive.Slab(1 << 16)
    reads = native(handed.append, slab)

    def read(data: bytes, other_view: bool = False) -> int:
        """Read `data` as the event loop does (its view held through buffer_updated); the spare's id."""
        view = memoryview(reads.get_buffer(-1))
        view[:len(data)] = data
        spare = id(slab.spare)
        other = memoryview(slab) if other_view else None
        reads.buffer_updated(len(data))
        view.release()
        if other is not None:
            other.release()
        return spare

    spare = read(b"a" * 100)
    assert handed[-1] == b"a" * 100 and id(handed[-1]) != spare and id(slab.spare) == spare
    spare = read(b"b" * _receive.COPY_BELOW)
    assert id(handed[-1]) == spare and handed[-1] == b"b" * _receive.COPY_BELOW and slab.spare is None
    read(b"c" * 60_000)
    assert handed[-2] == b"b" * _receive.COPY_BELOW and handed[-1] == b"c" * 60_000  # a new spare, the first kept
    spare = read(b"d" * 50_000, other_view=True)
    assert handed[-1] == b"d" * 50_000 and id(handed[-1]) != spare and id(slab.spare) == spare
    assert slab.exports == 0 and [len(h) for h in handed] == [100, _receive.COPY_BELOW, 60_000, 50_000]


@pytest.mark.parametrize("kind", ["c", "python"])
def test_a_read_larger_than_the_buffer_or_negative_is_refused(native, kind):
    made = native if kind == "c" else Receiver
    reads = made(lambda data: pytest.fail("nothing was read"), _buffer_of(made))
    for n in (READ_BUFFER_BYTES + 1, -1):
        with pytest.raises(ValueError, match="bytes read into a buffer of"):
            reads.buffer_updated(n)


def test_a_callback_that_raises_reaches_the_loop(native):
    """uvloop closes the transport on an exception from buffer_updated, as from data_received."""
    def boom(data):
        raise RuntimeError("observer bug")

    with pytest.raises(RuntimeError, match="observer bug"):
        native(boom, read_slab(_receive)).buffer_updated(3)
    with pytest.raises(RuntimeError, match="observer bug"):
        native(boom, read_slab(_receive)).buffer_updated(50_000)


def test_the_c_receiver_does_not_leak(native):
    # Each round ends with a long read, which takes the spare: none is left over for tracemalloc to count.
    reads = native(lambda data: None, read_slab(_receive))
    assert bytes_grown(lambda: [reads.buffer_updated(n) for _ in range(1000) for n in (100, 50_000)]) < 4096


def test_each_thread_reads_into_its_own_buffer():
    """One event loop a thread: two proxies in two threads never read into one buffer."""
    other = []
    thread = threading.Thread(target=lambda: other.append(read_buffer()))
    thread.start()
    thread.join()
    assert other[0] is not read_buffer() and len(other[0]) == len(read_buffer()) == READ_BUFFER_BYTES


class _Collect:
    """A relay's stand-in for _Side: its reader of client bytes only collects them."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.ended = asyncio.Event()

    def client_read(self, data: bytes) -> None:
        self.data.append(data)

    broker_read = client_read

    def side_made(self, side) -> None:
        pass

    def eof(self, side) -> bool:
        self.ended.set()
        return True

    def lost(self, side, exc) -> None:
        pass


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_side_reads_a_stream_whole_and_in_order_on_both_loops(loop_kind):
    """Relay's _Side is a buffered protocol on uvloop and on asyncio's own loop alike (uvloop's is
    what the proxy runs; asyncio's where uvloop is not installed)."""
    payload = random.Random(3).randbytes(3 * READ_BUFFER_BYTES + 12_345)

    async def main() -> list[bytes]:
        relay = _Collect()
        side = _Side(relay, "client")
        server = await asyncio.get_running_loop().create_server(lambda: side, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def send() -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
                sock.recv(1)  # until the server closes

        sender = asyncio.get_running_loop().run_in_executor(None, send)
        await asyncio.wait_for(relay.ended.wait(), 30)
        side.transport.close()
        await sender
        server.close()
        return relay.data

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        data = loop.run_until_complete(main())
    finally:
        loop.close()
    assert b"".join(data) == payload and all(type(d) is bytes and 0 < len(d) <= READ_BUFFER_BYTES for d in data)


def test_a_relay_side_reads_through_the_c_receiver(native):
    """No Python method of _Side runs per read: its get_buffer and buffer_updated are the C Receiver's."""
    relay = _Collect()
    side = _Side(relay, "client")
    assert isinstance(side, asyncio.BufferedProtocol) and not isinstance(side, asyncio.Protocol)
    assert type(side.get_buffer.__self__) is native and side.buffer_updated.__self__ is side.get_buffer.__self__
    memoryview(side.get_buffer(-1))[:5] = b"hello"
    side.buffer_updated(5)
    assert relay.data == [b"hello"]
