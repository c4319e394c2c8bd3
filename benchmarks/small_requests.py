"""Small-request load: raw-socket clients sending Kafka frames built with kinspect's own codec.

The frames are encoded once per workload and only their correlation id is patched per
request, so the clients cost little and the same bytes go out on every path: what differs
between paths is the proxy. One thread drives every connection through a selector; each
connection keeps `in_flight` requests outstanding (1 = one at a time, 32 = pipelined) and
checks that responses come back in order. `run_paced` sends one at a time at a fixed rate instead:
the same offered load on every path, for latency that is not the closed loop's throughput in disguise.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import time

from kinspect.protocol.codec import Codec
from kinspect.protocol.records import crc32c_py

HOST = "127.0.0.1"
CLIENT_ID = "bench-small"
RECORD_SIZE = 100
FETCH_PARTITION_MAX_BYTES = 1024
FETCH_RECORDS = 5  # records in the fetched topic: Tansu answers with all of them (it ignores the max bytes)
FETCH_MAX_WAIT_MS = 100  # Tansu answers MaxWaitMs=0 with no partitions at all; with records waiting it answers at once


class LoadError(RuntimeError):
    pass


def _varint(value: int) -> bytes:
    """Zig-zag varint, as in record fields."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def record_batch(value: bytes, timestamp_ms: int) -> bytes:
    """A RecordBatch v2 holding one record with a null key and `value`, no compression."""
    body = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(len(value)) + value + _varint(0)
    record = _varint(len(body)) + body
    # attributes .. records: what the CRC-32C covers
    after_crc = struct.pack(">hiqqqhii", 0, 0, timestamp_ms, timestamp_ms, -1, -1, -1, 1) + record
    crc = crc32c_py(after_crc)
    partition_leader_epoch_onwards = struct.pack(">ibI", -1, 2, crc) + after_crc
    return struct.pack(">qi", 0, len(partition_leader_epoch_onwards)) + partition_leader_epoch_onwards


class Workload:
    """One request template: encoded once, correlation id patched per request."""

    def __init__(self, name: str, codec: Codec, api_key: int, version: int, body: dict) -> None:
        self.name = name
        self.api_key = api_key
        self.version = version
        frame = codec.encode_request(
            {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": 0, "ClientId": CLIENT_ID},
            body,
        )
        self.template = len(frame).to_bytes(4, "big") + frame
        self.codec = codec

    def frames(self, first_id: int, count: int) -> list[bytes]:
        head, tail = self.template[:8], self.template[12:]
        return [head + (first_id + i).to_bytes(4, "big") + tail for i in range(count)]

    def check_response(self, payload: bytes) -> None:
        """Decode one response (size prefix excluded) and fail on any error code in it."""
        decoded = self.codec.decode_response(payload, self.api_key, self.version)
        errors = sorted(set(_error_codes(decoded.body)) - {0})
        if errors:
            raise LoadError(f"{self.name}: the broker answered with error code(s) {errors}")
        if self.api_key == 1:  # a fetch must bring records back, or it measures empty answers
            records = sum(len(p.get("Records") or b"") for t in decoded.body.get("Responses", [])
                          for p in t.get("Partitions", []))
            if not records:
                raise LoadError(f"{self.name}: the fetch response holds no records")


def _error_codes(value):
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "ErrorCode" and isinstance(item, int):
                yield item
            else:
                yield from _error_codes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _error_codes(item)


def _produce(name: str, codec: Codec, topic: str, now_ms: int) -> Workload:
    # acks=1 and linger.ms=0 as a client sends them: one 100-byte record per request
    return Workload(name, codec, 0, 9,
                    {"TransactionalId": None, "Acks": 1, "TimeoutMs": 30000,
                     "TopicData": [{"Name": topic, "PartitionData": [
                         {"Index": 0, "Records": record_batch(b"v" * RECORD_SIZE, now_ms)}]}]})


def workloads(codec: Codec, topic: str, fetch_topic: str) -> dict[str, Workload]:
    """The four small-request workloads (1-partition topics), and `prefill`: what fills `fetch_topic` first.

    Fetch reads `fetch_topic`, which holds FETCH_RECORDS records of RECORD_SIZE bytes
    (run `prefill` once, FETCH_RECORDS requests, before the fetch phases): a small batch
    set per response, the same size on every path and repetition.
    """
    now_ms = int(time.time() * 1000)
    return {
        "apiversions": Workload("apiversions", codec, 18, 3,
                                {"ClientSoftwareName": "bench", "ClientSoftwareVersion": "1"}),
        "metadata": Workload("metadata", codec, 3, 12,
                             {"Topics": [{"TopicId": b"\x00" * 16, "Name": topic}], "AllowAutoTopicCreation": False,
                              "IncludeTopicAuthorizedOperations": False}),
        "produce": _produce("produce", codec, topic, now_ms),
        "prefill": _produce("prefill", codec, fetch_topic, now_ms),
        # a consumer re-reading a partition of a few small batches
        "fetch": Workload("fetch", codec, 1, 12,
                          {"ReplicaId": -1, "MaxWaitMs": FETCH_MAX_WAIT_MS, "MinBytes": 1, "MaxBytes": 64 * 1024,
                           "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1,
                           "Topics": [{"Topic": fetch_topic, "Partitions": [
                               {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 0, "LastFetchedEpoch": -1,
                                "LogStartOffset": -1, "PartitionMaxBytes": FETCH_PARTITION_MAX_BYTES}]}],
                           "ForgottenTopicsData": [], "RackId": ""}),
    }


class _Conn:
    __slots__ = ("sock", "frames", "next_send", "done", "buf", "sent_at", "first_payload", "due")

    def __init__(self, sock: socket.socket, frames: list[bytes]) -> None:
        self.sock = sock
        self.frames = frames
        self.next_send = 0
        self.done = 0
        self.buf = bytearray()
        self.sent_at: list[int] = [0] * len(frames)
        self.first_payload: bytes | None = None
        self.due = 0  # paced loads: when this connection's next request is due (perf_counter_ns)


@contextlib.contextmanager
def _connected(host: str, port: int, workload: Workload, connections: int, per_connection: int):
    """(selector, connections), each with its share of the frames; every socket closed on the way out."""
    sel = selectors.DefaultSelector()
    conns: list[_Conn] = []
    try:
        for c in range(connections):
            sock = socket.create_connection((host, port), timeout=10)
            conns.append(_Conn(sock, workload.frames(c * per_connection, per_connection)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sel.register(sock, selectors.EVENT_READ, conns[-1])
        yield sel, conns
    finally:
        for conn in conns:
            conn.sock.close()
        sel.close()


def _result(workload: Workload, conns: list[_Conn], elapsed: float, latencies: list[float], measured) -> dict:
    """What a load returns, once its first response decoded without an error."""
    workload.check_response(conns[0].first_payload)
    return {"seconds": elapsed, "requests": sum(len(c.frames) for c in conns), "latencies_ms": latencies,
            "meter": measured}


def _take_responses(conn: _Conn, workload: Workload, now: int, latencies: list[float]) -> int:
    """Read what `conn` has received; record each whole response's round trip. Returns how many were whole."""
    data = conn.sock.recv(1 << 20)
    if not data:
        raise LoadError(f"{workload.name}: connection closed by the peer")
    buf = conn.buf
    buf += data
    pos = 0
    answered = 0
    while len(buf) - pos >= 4:
        size = int.from_bytes(buf[pos:pos + 4], "big")
        if len(buf) - pos - 4 < size:
            break
        cid = int.from_bytes(buf[pos + 4:pos + 8], "big")
        index = conn.done
        expected = int.from_bytes(conn.frames[index][8:12], "big")
        if cid != expected:
            raise LoadError(f"{workload.name}: correlation id {cid}, expected {expected}")
        if conn.first_payload is None:
            conn.first_payload = bytes(buf[pos + 4:pos + 4 + size])
        latencies.append((now - conn.sent_at[index]) / 1e6)
        conn.done += 1
        answered += 1
        pos += 4 + size
    del buf[:pos]
    return answered


def run_load(port: int, workload: Workload, connections: int, per_connection: int, in_flight: int,
             meter=None, timeout_s: float = 120.0, host: str = HOST) -> dict:
    """Send `per_connection` requests on each of `connections` connections, `in_flight` at a time.

    Returns the wall time, the request count, every request's round-trip time (ms, from the
    write of its frame to the arrival of its whole response) and, given a `meter` (start()/stop()),
    what it measured between the first request and the last response (connection set-up excluded).
    """
    clock = time.perf_counter_ns
    latencies: list[float] = []
    with _connected(host, port, workload, connections, per_connection) as (sel, conns):
        if meter is not None:
            meter.start()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        for conn in conns:
            _send(conn, min(in_flight, per_connection), clock)
        pending = connections
        while pending:
            events = sel.select(timeout=1.0)
            if not events and time.monotonic() > deadline:
                raise LoadError(f"{workload.name}: {sum(c.done for c in conns)} of "
                                f"{connections * per_connection} responses in {timeout_s:.0f} s")
            for key, _ in events:
                conn: _Conn = key.data
                answered = _take_responses(conn, workload, clock(), latencies)
                if answered:
                    _send(conn, min(answered, per_connection - conn.next_send), clock)
                if conn.done == per_connection:
                    sel.unregister(conn.sock)
                    pending -= 1
        elapsed = time.perf_counter() - t0
        measured = meter.stop() if meter is not None else None
    return _result(workload, conns, elapsed, latencies, measured)


def run_paced(port: int, workload: Workload, connections: int, per_connection: int, rate: float,
              meter=None, timeout_s: float = 120.0, host: str = HOST) -> dict:
    """Send `per_connection` requests on each of `connections` connections, one at a time, at `rate` requests a
    second in all: an open load, the same offered rate on every path, well below what the machine can carry.

    A connection's requests fall due every `connections / rate` seconds (the connections staggered evenly). A
    request is written when it falls due, or at once when the response before it comes back after that: then
    its round trip counts from when it was due (the wait the path's slowness caused), not from the write
    (what `run_load`'s closed loop measures, where a slower path also lowers the rate). Returns what `run_load`
    does, and `late`: how many requests were written after they fell due because the one before was still out.
    """
    clock = time.perf_counter_ns
    latencies: list[float] = []
    interval = int(1e9 * connections / rate)
    late = 0
    with _connected(host, port, workload, connections, per_connection) as (sel, conns):
        if meter is not None:
            meter.start()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        start = clock()
        for c, conn in enumerate(conns):
            conn.due = start + c * interval // connections
        waiting = list(conns)  # connections with no request out and requests left to send
        pending = connections
        while pending:
            now = clock()
            for conn in [c for c in waiting if c.due <= now]:
                waiting.remove(conn)
                _send(conn, 1, clock)
                conn.due += interval
            wake = min((c.due for c in waiting), default=None)
            events = sel.select(timeout=1.0 if wake is None else max(0.0, (wake - clock()) / 1e9))
            if not events and wake is None and time.monotonic() > deadline:
                raise LoadError(f"{workload.name}: {sum(c.done for c in conns)} of "
                                f"{connections * per_connection} responses in {timeout_s:.0f} s")
            for key, _ in events:
                conn: _Conn = key.data
                now = clock()
                if not _take_responses(conn, workload, now, latencies):
                    continue
                if conn.done == per_connection:
                    sel.unregister(conn.sock)
                    pending -= 1
                elif conn.due <= now:
                    # Late: the path held the previous response past this one's due time. Send now, and count
                    # this round trip from when it fell due.
                    late += 1
                    due = conn.due
                    _send(conn, 1, clock)
                    conn.sent_at[conn.next_send - 1] = due
                    conn.due += interval
                else:
                    waiting.append(conn)
        elapsed = time.perf_counter() - t0
        measured = meter.stop() if meter is not None else None
    return dict(_result(workload, conns, elapsed, latencies, measured), late=late)


def _send(conn: _Conn, count: int, clock) -> None:
    if count <= 0:
        return
    start = conn.next_send
    chunk = conn.frames[start:start + count]
    now = clock()
    for i in range(start, start + count):
        conn.sent_at[i] = now
    conn.next_send += count
    conn.sock.sendall(b"".join(chunk))
