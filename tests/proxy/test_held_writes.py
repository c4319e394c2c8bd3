"""A response held for rewriting goes to the client in one transport call (its new size prefix and pieces together),
and the byte-exact check of the rewrite tests tells a stream cut short at a connection's end from a changed one."""

from __future__ import annotations

import struct

import pytest

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.proxy.relay import Relay
from kinspect.session import ConnectionInfo, Session
from tests.support.proxy_harness import check_cut_short, frames_of, metadata
from tests.support.relay_stubs import RecordingTransport

BROKER = {"NodeId": 1, "Host": "broker-1.internal", "Port": 9092, "Rack": None}


class CallRecordingTransport(RecordingTransport):
    """A transport stub that also keeps each call: ("write", bytes) or ("writelines", [bytes, ...])."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def write(self, data) -> None:
        self.calls.append(("write", bytes(data)))
        super().write(data)

    def writelines(self, chunks) -> None:
        chunks = [bytes(c) for c in chunks]
        self.calls.append(("writelines", chunks))
        self.sent.extend(chunks)


async def test_a_rewritten_response_goes_out_in_one_call(codec):
    config = load_config(None, {
        "proxy.mode": "rewrite", "proxy.bootstrap_servers": ["127.0.0.1:1"], "proxy.advertised_host": "127.0.0.9",
        "proxy.node_ports": {"1": 29001}})
    server = build_app(config).server
    session = Session(server.codec, ConnectionInfo(1, "c:1", "b:1"), server.session_config, server.plan)
    relay = Relay(server, session, server.dispatcher, [])
    relay.client.transport, relay.broker.transport = CallRecordingTransport(), RecordingTransport()
    relay._early = None
    relay.client.data_received(metadata(codec, 7))
    body = {"ThrottleTimeMs": 0, "Brokers": [BROKER], "ClusterId": "c", "ControllerId": 1, "Topics": []}
    frame = codec.encode_response(3, 12, {"CorrelationId": 7}, body)
    stream = struct.pack(">i", len(frame)) + frame
    for at in range(0, len(stream), 9):  # in reads of 9 bytes: held until whole
        relay.broker.data_received(stream[at:at + 9])
    calls = relay.client.transport.calls
    assert [kind for kind, _ in calls] == ["writelines"]
    sent = b"".join(calls[0][1])
    assert struct.unpack_from(">i", sent)[0] == len(sent) - 4
    brokers = codec.decode_response(sent[4:], 3, 12).body["Brokers"]
    assert [(b["NodeId"], b["Host"], b["Port"]) for b in brokers] == [(1, "127.0.0.9", 29001)]
    relay.close()


def _frame(correlation_id: int, payload: bytes) -> bytes:
    return struct.pack(">i", correlation_id) + payload


PRODUCE_V9 = (0, 9)
METADATA_V12 = (3, 12)


def _stream(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(f)) + f for f in frames)


@pytest.mark.parametrize("delivered", [
    "all", "all but the last", "a start of the last", "the size of the last only", "a start of the broker's unfinished",
])
def test_a_stream_cut_short_passes(delivered):
    frames = [_frame(1, b"a" * 20), _frame(2, b"b" * 30)]
    asked = {1: PRODUCE_V9, 2: PRODUCE_V9}
    sent_stream, unfinished = _stream(frames), struct.pack(">i", 50) + struct.pack(">i", 3) + b"c" * 10
    client_stream = {
        "all": sent_stream,
        "all but the last": _stream(frames[:1]),
        "a start of the last": sent_stream[:-5],
        "the size of the last only": _stream(frames[:1]) + sent_stream[len(_stream(frames[:1])):][:4],
        "a start of the broker's unfinished": sent_stream + unfinished[:7],
    }[delivered]
    sent, sent_rest = frames_of(sent_stream + unfinished)
    got, got_rest = frames_of(client_stream)
    check_cut_short(sent, sent_rest, got, got_rest, asked)


@pytest.mark.parametrize("delivered, why", [
    ("other bytes after the first", "different trailing bytes"),
    ("a frame more than the broker sent", "response frames from the broker"),
    ("another unfinished frame", "different trailing bytes"),
    ("a cut held response of another correlation id", "another correlation id"),
])
def test_a_changed_stream_fails(delivered, why):
    frames = [_frame(1, b"a" * 20), _frame(2, b"b" * 30)]
    asked = {1: PRODUCE_V9, 2: PRODUCE_V9, 3: METADATA_V12}
    sent_stream = _stream(frames)
    if delivered == "a cut held response of another correlation id":
        sent_stream = _stream(frames + [_frame(3, b"m" * 40)])
    first = _stream(frames[:1])
    client_stream = {
        "other bytes after the first": first + sent_stream[len(first):][:10].replace(b"b", b"x"),
        "a frame more than the broker sent": _stream(frames + [_frame(3, b"d")]),
        "another unfinished frame": sent_stream + struct.pack(">i", 50) + b"zz",
        "a cut held response of another correlation id": _stream(frames) + struct.pack(">i", 45) + struct.pack(">i", 4),
    }[delivered]
    sent, sent_rest = frames_of(sent_stream)
    got, got_rest = frames_of(client_stream)
    with pytest.raises(AssertionError, match=why):
        check_cut_short(sent, sent_rest, got, got_rest, asked)
