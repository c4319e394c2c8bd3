"""The C reader's writes straight to a uvloop socket (kinspect/proxy/_forward.c's write_to), on loopback sockets.

A relay's broker side is connected to a plain socket the test reads. Its transport is wrapped so that the
test sees every call of its `write`: a small read is sent to the socket by the C reader itself while
uvloop holds nothing unsent, and goes to `write` once the socket is full (the rest of a read it did not
take, then every read until uvloop's buffer has drained). Every byte must arrive, once and in order.
Then which transports are written to directly at all (plain uvloop TCP only: not TLS, not asyncio's),
and the end of writing after an EOF.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
import ssl
import struct
import threading

import pytest
import uvloop

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.proxy.relay import Relay, direct_fd
from kinspect.session import ConnectionInfo, Session
from tests.support.certs import make_certs
from tests.support.native import native_module

_forward, _MISSING = native_module("kinspect.proxy._forward")


@pytest.fixture(autouse=True)
def built():
    if _forward is None:
        pytest.fail(_MISSING)


def _run(coro_fn):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


async def _until(condition, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class _Watched:
    """A transport's stand-in that counts `write` calls and hands everything to the real transport."""

    def __init__(self, real) -> None:
        self.real = real
        self.writes = 0

    def write(self, data) -> None:
        self.writes += 1
        self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


class _ClientStandIn:
    """The client side's transport: only paused and resumed (by the broker side's write buffer)."""

    def __init__(self) -> None:
        self.paused = self.resumed = 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1

    def close(self) -> None:
        pass


def _frames(rng: random.Random, total: int, most: int) -> list[bytes]:
    """Size-prefixed frames of random bytes, `total` bytes in all."""
    out, made = [], 0
    while made < total:
        body = rng.randbytes(rng.randint(8, most))
        out.append(struct.pack(">i", len(body)) + body)
        made += len(out[-1])
    return out


async def _relay_to_socket():
    """A relay whose broker side is a uvloop TCP transport connected to a socket the test holds."""
    app = build_app(load_config(None, {"proxy.upstream": "127.0.0.1:1"}))
    server = app.server
    relay = Relay(server, Session(server.codec, ConnectionInfo(1, "c:1", "b:1"), server.session_config, server.plan),
                  server.dispatcher, [])
    listener = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: relay.broker, *listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    relay.client.transport = _ClientStandIn()
    relay._early = None  # the broker connection is up
    relay.session.client_framed = False  # the bytes are not Kafka's: forwarded, not inspected
    return app, relay, peer


def test_reads_reach_the_socket_whole_and_in_order_whether_or_not_it_is_full():
    rng = random.Random(39)

    async def main():
        app, relay, peer = await _relay_to_socket()
        assert relay.broker.fd == relay.broker.transport.get_extra_info("socket").fileno()
        watched = relay.broker.transport = _Watched(relay.broker.transport)
        sent, got = hashlib.sha256(), hashlib.sha256()

        # The socket takes every small read at once: the C reader sends each itself.
        small = _frames(rng, 200_000, 300)
        for frame in small:
            relay.client.data_received(frame)
            sent.update(frame)
        peer.setblocking(False)
        received = 0
        while received < sum(map(len, small)):
            chunk = peer.recv(1 << 20)
            got.update(chunk)
            received += len(chunk)
        assert watched.writes == 0, "small reads into an empty socket went through the transport's write"

        # Nobody reads: the socket fills, the rest of a read goes to uvloop, and so do the reads after it,
        # until its buffer has drained; the broker side's buffer pauses the client past its high mark.
        full = _frames(rng, 8 << 20, 60_000)
        for frame in full:
            relay.client.data_received(frame)
            sent.update(frame)
        assert watched.writes > 0, "a full socket's reads were not handed to the transport"
        assert relay.client.transport.paused > 0
        # The socket has room again, but uvloop still holds bytes (the loop has not run): a read now must
        # queue behind them, not overtake them.
        peer.setblocking(True)
        _read_into(peer, got, 1 << 20)
        received += 1 << 20
        late = _frames(rng, 5_000, 300)
        for frame in late:
            relay.client.data_received(frame)
            sent.update(frame)
        expected = sum(map(len, small)) + sum(map(len, full)) + sum(map(len, late))
        reader = threading.Thread(target=lambda: _read_into(peer, got, expected - received))
        reader.start()
        await _until(lambda: not reader.is_alive() and relay.broker.transport.get_write_buffer_size() == 0,
                     "the peer to read every byte")
        reader.join()
        assert got.hexdigest() == sent.hexdigest(), "bytes were lost, repeated or reordered"

        # Drained: small reads are sent directly again.
        writes = watched.writes
        again = _frames(rng, 20_000, 300)
        for frame in again:
            relay.client.data_received(frame)
        tail = b""
        peer.settimeout(10)
        while len(tail) < sum(map(len, again)):
            tail += peer.recv(1 << 20)
        assert tail == b"".join(again)
        assert watched.writes == writes
        relay.close()
        peer.close()

    _run(main)


def _read_into(sock: socket.socket, digest, want: int) -> None:
    while want > 0:
        chunk = sock.recv(min(want, 1 << 20))
        if not chunk:
            raise AssertionError("the relay's socket closed early")
        digest.update(chunk)
        want -= len(chunk)


def test_writes_after_an_eof_go_to_the_transport():
    async def main():
        app, relay, peer = await _relay_to_socket()
        relay.eof(relay.client)  # the client's EOF is passed on to the broker
        assert relay.broker.fd == -1
        peer.setblocking(False)

        def ended() -> bool:
            try:
                return peer.recv(10) == b""
            except BlockingIOError:
                return False

        await _until(ended, "the broker side to see the EOF")
        with pytest.raises(RuntimeError, match="write_eof"):  # a write after it fails as uvloop's does
            relay.client.data_received(b"late")
        relay.close()
        peer.close()

    _run(main)


def test_only_plain_uvloop_tcp_transports_are_written_to_directly(tmp_path):
    certs = make_certs(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(certs["cert"], certs["key"])
    client_tls = ssl.create_default_context(cafile=certs["ca"])

    async def transports(tls: bool):
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()

        class Accept(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(transport)

        srv = await loop.create_server(Accept, "127.0.0.1", 0, ssl=server_tls if tls else None)
        port = srv.sockets[0].getsockname()[1]
        client, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port,
                                                 ssl=client_tls if tls else None,
                                                 server_hostname="localhost" if tls else None)
        theirs = await accepted
        return srv, client, theirs

    async def on_uvloop():
        srv, client, theirs = await transports(tls=False)
        assert direct_fd(client) == client.get_extra_info("socket").fileno() >= 0
        assert direct_fd(theirs) == theirs.get_extra_info("socket").fileno() >= 0
        client.close(), theirs.close(), srv.close()
        srv, client, theirs = await transports(tls=True)
        assert direct_fd(client) == -1 and direct_fd(theirs) == -1, "a TLS transport's socket carries TLS records"
        client.close(), theirs.close(), srv.close()

    async def on_asyncio():
        srv, client, theirs = await transports(tls=False)
        assert direct_fd(client) == -1 and direct_fd(theirs) == -1
        client.close(), theirs.close(), srv.close()

    _run(on_uvloop)
    asyncio.run(on_asyncio())
    assert direct_fd(_ClientStandIn()) == -1
