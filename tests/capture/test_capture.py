"""The capture: Parquet files from real traffic through kinspect, rotation, drops, flushing, metrics and the docs.

The writer is fed real exchanges: recorded conversations replayed through a Session, and
confluent-kafka producing (with known secret keys, values and headers), consuming and
administering a Tansu broker through the proxy.
"""

from __future__ import annotations

import base64
import collections
import gc
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from kinspect.capture.facts import FactsTaker
from kinspect.capture.metrics import METRIC_NAMES, CaptureCollector
from kinspect.capture.observer import CaptureObserver
from kinspect.capture.batch import BatchBuilder
from kinspect.capture.schema import (
    COLUMNS,
    METADATA_VERSION_KEY,
    SCHEMA_VERSION,
    STRUCTS,
    arrow_schema,
)
from kinspect.capture import writer as writer_module
from kinspect.capture.writer import SWITCH_INTERVAL, CaptureWriter
from kinspect import app
from kinspect.cli import proxy_command
from kinspect.cli.main import build_parser
from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.session import ConnectionInfo, Exchange, Problem, Session
from tests.support.proxy_harness import (
    ProxyHarness,
    api_versions,
    poll_until,
    recv_frame,
    request_frame,
)
from tests.support.tansu import TansuBroker, free_port
from tests.support.paths import ROOT

TRAFFIC = ROOT / "tests" / "data" / "traffic"
TIMEOUT = 20.0
FILE_NAME = re.compile(r"^capture-\d{8}T\d{6}Z-\d{6}\.parquet$")


# ----------------------------------------------------------------------------- helpers


def recorded_facts(codec: Codec, limit: int | None = None) -> list[tuple]:
    """(facts, bytes held) of the recorded exchanges, as the capture observer offers them."""
    take = FactsTaker(codec).take
    return [take(x) for x in recorded_exchanges(codec, limit)]


def recorded_exchanges(codec: Codec, limit: int | None = None) -> list[Exchange]:
    """Exchanges of the recorded real conversations, replayed through fresh sessions."""
    out = []
    for n, requests in enumerate(sorted(TRAFFIC.glob("*/*.requests.bin"))):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        session = Session(codec, ConnectionInfo(n, "127.0.0.1:4000", "127.0.0.1:9092"))
        events = session.client_data(requests.read_bytes(), 10.0).events + session.broker_data(responses.read_bytes(), 10.5).events
        out += [e for e in events if type(e) is Exchange]
    return out[:limit]


def read_rows(paths) -> pa.Table:
    tables = [pq.read_table(p) for p in paths]
    for t in tables:
        assert t.schema.equals(arrow_schema(), check_metadata=False)
        assert t.schema.metadata[METADATA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    return pa.concat_tables(tables) if tables else arrow_schema().empty_table()


def writer(codec: Codec, directory: Path, **kw) -> CaptureWriter:
    return CaptureWriter(directory, BatchBuilder(0.0), **kw)


def more_files_than(w: CaptureWriter, n: int):
    return lambda: len(w.files) > n


class Gate:
    """A batch builder that waits at a gate before building: a writer thread slowed at will."""

    def __init__(self, inner: BatchBuilder) -> None:
        self.inner = inner
        self.open = threading.Event()
        self.waiting = threading.Event()

    def build(self, facts):
        self.waiting.set()
        assert self.open.wait(30)
        return self.inner.build(facts)


# ----------------------------------------------------------------------------- the docs


def _readme_schema_table() -> str:
    text = (ROOT / "docs" / "capture.md").read_text()  # the README's reference moved to docs/
    start = text.index("## Capture schema")
    end = text.find("\n## ", start)
    return text[start:end if end != -1 else len(text)]


def test_the_readme_schema_table_lists_every_column_and_struct_member():
    table = _readme_schema_table()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_.]+)` \| `([^`]+)` \|", table, re.MULTILINE)}
    for name, kind, _ in COLUMNS:
        assert rows.get(name) == kind, name
    for struct, members in STRUCTS.items():
        for name, kind, _ in members:
            assert rows.get(f"{struct}.{name}") == kind, f"{struct}.{name}"
    assert len(rows) == len(COLUMNS) + sum(len(m) for m in STRUCTS.values())
    assert f"version {SCHEMA_VERSION}" in table


# ----------------------------------------------------------------------------- the writer


def test_close_flushes_every_row_into_one_file(codec: Codec, tmp_path: Path):
    exchanges = recorded_exchanges(codec)
    w = writer(codec, tmp_path).start()
    # The event loop waits at most this long for the GIL while the writer thread works.
    assert sys.getswitchinterval() <= SWITCH_INTERVAL
    assert all(w.offer(*f) for f in recorded_facts(codec))
    poll_until(lambda: w.queue_depth == 0)
    assert list(tmp_path.glob("*.parquet")) == []  # the rows wait for their row group or the file's end
    w.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == [w.files[0].name] and FILE_NAME.match(files[0].name)
    table = read_rows(files)
    assert table.num_rows == len(exchanges) == w.rows_written and w.files_written == 1
    assert table.column("correlation_id").to_pylist() == [x.request.correlation_id for x in exchanges]
    assert w.rows_dropped == w.row_errors == w.write_errors == 0


def test_an_idle_writer_thread_sleeps_until_an_exchange_is_queued(codec: Codec, tmp_path: Path, monkeypatch):
    """No polling while the queue is empty: the thread waits IDLE_WAIT (here a minute), and the first exchange
    queued, or close, wakes it at once."""
    monkeypatch.setattr(writer_module, "IDLE_WAIT", 60.0)
    w = writer(codec, tmp_path)
    calls, returns = [], []
    real_wait = w._wake.wait

    def wait(timeout=None):
        calls.append(timeout)
        woke = real_wait(timeout)
        returns.append((woke, time.monotonic()))
        return woke

    w._wake.wait = wait
    w.start()
    poll_until(lambda: calls)
    assert calls == [60.0] and returns == []  # asleep on the empty queue
    offered_at = time.monotonic()
    assert w.offer(*recorded_facts(codec, 1)[0])
    poll_until(lambda: returns, timeout=10)
    assert returns[0][0] is True and returns[0][1] - offered_at < 10  # woken by the exchange, not the timeout
    poll_until(lambda: len(calls) >= 2)
    assert 0 < calls[1] <= writer_module.BATCH_SECONDS  # one exchange: a part batch, taken once it is that old
    poll_until(lambda: w.queue_depth == 0, timeout=10)  # taken once it waited BATCH_SECONDS
    poll_until(lambda: len(calls) >= 3 and len(returns) == len(calls) - 1)
    assert calls[-1] == 60.0  # the queue empty again: asleep
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 10 and w.rows_written == 1


def test_a_full_batch_wakes_the_writer_thread_before_its_time(codec: Codec, tmp_path: Path, monkeypatch):
    """A part batch waits BATCH_SECONDS (here a minute) asleep; the exchange that makes it a full batch, or half the
    queue's bound by rows or by bytes, wakes the thread to take it at once."""
    monkeypatch.setattr(writer_module, "BATCH_SECONDS", 60.0)
    monkeypatch.setattr(writer_module, "IDLE_WAIT", 60.0)
    facts = recorded_facts(codec)
    three = sum(nbytes for _, nbytes in facts[:3])  # half the byte bound is reached by the third exchange
    for rows, queue_rows, queue_bytes in ((writer_module.BATCH_ROWS, 100_000, 1 << 30), (10, 20, 1 << 30),
                                          (3, 100_000, 2 * three)):
        w = writer(codec, tmp_path / str(rows), queue_rows=queue_rows, queue_bytes=queue_bytes).start()
        offered = 0
        while offered < rows - 1:
            assert w.offer(*facts[offered % len(facts)])
            offered += 1
        poll_until(lambda: w._waiting_since is not None)  # the part batch seen, and waiting
        assert w.queue_depth == rows - 1
        assert w.offer(*facts[offered % len(facts)])
        poll_until(lambda: w.queue_depth == 0, timeout=10)  # taken long before its minute
        w.close()
        assert w.rows_written == rows


def test_files_rotate_by_size_and_every_file_is_whole(codec: Codec, tmp_path: Path):
    exchanges = recorded_exchanges(codec)
    w = writer(codec, tmp_path, row_group_rows=25, max_file_bytes=20_000).start()
    for f in recorded_facts(codec):
        w.offer(*f)
    w.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 3 and all(FILE_NAME.match(f.name) for f in files), [f.name for f in files]
    assert files == sorted(w.files) and w.files_written == len(files)
    table = read_rows(files)
    assert table.num_rows == len(exchanges) == w.rows_written
    assert sorted(table.column("correlation_id").to_pylist()) == sorted(x.request.correlation_id for x in exchanges)
    # every finished file but the last reached the size limit
    assert all(f.stat().st_size >= 20_000 for f in files[:-1])


def test_files_rotate_by_age_and_only_finished_files_have_the_final_name(codec: Codec, tmp_path: Path):
    facts = recorded_facts(codec, 60)
    w = writer(codec, tmp_path, max_file_seconds=0.3).start()
    for part in (facts[:20], facts[20:40], facts[40:]):
        for f in part:
            w.offer(*f)
        poll_until(lambda: w.queue_depth == 0)
        # while rows wait for their file to end, only a .tmp (or nothing) is there
        assert not [p for p in tmp_path.glob("*.parquet") if p not in w.files]
        poll_until(more_files_than(w, len(w.files)), timeout=10)
    w.close()
    assert w.files_written >= 3 and not list(tmp_path.glob("*.tmp"))
    assert read_rows(w.files).num_rows == 60


def test_a_full_queue_drops_and_counts_and_never_blocks(codec: Codec, tmp_path: Path):
    exchanges = recorded_facts(codec, 50)
    gate = Gate(BatchBuilder(0.0))
    w = CaptureWriter(tmp_path, gate, queue_rows=5).start()
    w.offer(*exchanges[0])
    assert gate.waiting.wait(10)  # the thread holds one exchange, blocked
    accepted = [w.offer(*f) for f in exchanges[1:]]  # would hang here if offer could block
    assert accepted == [True] * 5 + [False] * 44
    assert w.rows_dropped == 44 and w.queue_depth == 5
    registry = CollectorRegistry()
    registry.register(CaptureCollector(w))
    assert registry.get_sample_value("kinspect_capture_dropped_rows_total", {"reason": "queue_full"}) == 44
    assert registry.get_sample_value("kinspect_capture_queue_rows") == 5
    # Accepted rows show at once; written rows only once their file is finished (issue 17 item 12).
    assert registry.get_sample_value("kinspect_capture_rows_accepted_total") == 6
    assert registry.get_sample_value("kinspect_capture_rows_total") == 0
    gate.open.set()
    w.close()
    assert w.rows_written + w.rows_dropped == len(exchanges)
    assert read_rows(w.files).num_rows == w.rows_written == 6
    assert registry.get_sample_value("kinspect_capture_rows_total") == 6
    assert registry.get_sample_value("kinspect_capture_rows_accepted_total") == 6
    assert registry.get_sample_value("kinspect_capture_files_total") == 1
    assert {m.name for m in registry.collect()} == {n.removesuffix("_total") for n in METRIC_NAMES}


def test_the_queue_is_bounded_by_the_bytes_of_the_facts_it_holds(codec: Codec, tmp_path: Path):
    # Codecs of their own, each taking the same exchanges in the same order: what a taker holds depends on where
    # its codec counts (Codec.count_now), which the module's shared codec learnt from the tests before.
    fresh = Codec(codec.registry)
    exchanges = recorded_exchanges(fresh, 50)
    observer = CaptureObserver(tmp_path, fresh, queue_rows=1000, queue_bytes=16384)
    gate = Gate(observer.writer.builder)
    observer.writer.builder = gate
    observer.start()
    observer.on_event(exchanges[0])
    assert gate.waiting.wait(10)  # the thread holds one exchange, blocked
    sizes = [held for _, held in recorded_facts(Codec(codec.registry), 50)[1:]]
    assert len(set(sizes)) > 3  # the estimate follows what each exchange's facts hold
    for x in exchanges[1:]:
        observer.on_event(x)
    w = observer.writer
    # Accepted in order until the next one would pass 16384 bytes, then only ones that fit.
    held, expected = 0, 0
    for size in sizes:
        if held + size <= 16384:
            held += size
            expected += 1
    assert w.queue_depth == expected and w.queued_bytes == held <= 16384
    assert w.rows_dropped == len(sizes) - expected > 0
    registry = CollectorRegistry()
    registry.register(CaptureCollector(w))
    assert registry.get_sample_value("kinspect_capture_queue_bytes") == held
    gate.open.set()
    observer.close()
    assert w.queued_bytes == 0 and w.rows_written == expected + 1


def test_a_row_that_cannot_be_built_is_counted_and_the_thread_goes_on(codec: Codec, tmp_path: Path, caplog):
    exchanges = recorded_facts(codec, 10)
    inner = BatchBuilder(0.0)
    bad = {id(exchanges[3][0]), id(exchanges[7][0])}

    class Flaky:
        def build(self, facts):
            if any(id(f) in bad for f in facts):
                raise RuntimeError("a bug in row building")
            return inner.build(facts)

    w = CaptureWriter(tmp_path, Flaky()).start()
    for f in exchanges:
        w.offer(*f)
    w.close()
    assert (w.rows_written, w.row_errors) == (8, 2)
    assert sum("cannot build a row" in r.message for r in caplog.records) == 1  # logged once
    assert read_rows(w.files).num_rows == 8


def test_bad_limits_are_named(codec: Codec, tmp_path: Path):
    with pytest.raises(ValueError, match="capture.queue_rows must be positive"):
        writer(codec, tmp_path, queue_rows=0)


# ----------------------------------------------------------------------------- configuration and the command


def test_config_and_flags_enable_the_capture(tmp_path: Path, codec: Codec):
    path = tmp_path / "k.toml"
    path.write_text('[capture]\nenabled = true\ndirectory = "caps"\nqueue_rows = 7\nmax_file_seconds = 2\n')
    config = load_config(path)
    assert config.capture.directory == str(tmp_path / "caps") and config.capture.queue_rows == 7
    assert config.capture.max_file_seconds == 2.0

    args = build_parser().parse_args(["proxy", "--capture-dir", str(tmp_path / "flag")])
    config = load_config(None, proxy_command.overrides_from(args))
    assert config.capture.enabled and config.capture.directory == str(tmp_path / "flag")
    observers, metrics = app.build_observers(config, codec)
    capture = next(o for o in observers if isinstance(o, CaptureObserver))
    assert capture is not None and capture.writer.directory == tmp_path / "flag"
    assert metrics.registry.get_sample_value("kinspect_capture_rows_total") == 0
    assert not [o for o in app.build_observers(load_config(None), codec)[0] if isinstance(o, CaptureObserver)]


# ----------------------------------------------------------------------------- real traffic through the proxy


SECRETS = [b"k3y-Zq81-secret", b"v4lue-Wm27-secret", b"h34der-Xp55-secret", b"s4sl-Pw93-secret"]


def _secret_forms(secret: bytes) -> list[bytes]:
    return [secret, secret.hex().encode(), secret.hex().upper().encode(), base64.b64encode(secret),
            base64.b64encode(secret).rstrip(b"=")[:-2]]


def _string_values(table: pa.Table) -> list[str]:
    """Every string in the table, nested struct members included."""
    out = []

    def walk(value):
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for row in table.to_pylist():
        walk(row)
    return out


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_real_client_traffic_is_captured_without_secrets(codec: Codec, tmp_path: Path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, records = "capture.topic", 30
    listen_port = free_port()
    capture = CaptureObserver(tmp_path, codec, row_group_rows=40)
    capture.writer.compression = None  # plain pages, so that a secret would show in the file's bytes
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}, codec=codec, observers=(capture,))
        capture.start()
        proxy.start()
        try:
            base = {"bootstrap.servers": f"127.0.0.1:{listen_port}", "client.id": "capture-test"}
            admin = AdminClient(dict(base))
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(TIMEOUT)
            producer = Producer({**base, "compression.type": "none", "linger.ms": 5, "acks": "all"})
            delivered = []
            for i in range(records):
                producer.produce(topic, key=SECRETS[0] + b"%d" % i, value=SECRETS[1] + b"%d" % i,
                                 headers=[("h", SECRETS[2])], on_delivery=lambda err, msg: delivered.append(err))
            assert producer.flush(TIMEOUT) == 0 and delivered == [None] * records
            consumer = Consumer({**base, "group.id": "capture.group", "enable.auto.commit": False,
                                 "session.timeout.ms": 6000})
            try:
                consumer.assign([TopicPartition(topic, 0, 0)])
                got = []
                deadline = time.monotonic() + TIMEOUT
                while len(got) < records and time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        got.append(msg.value())
                assert got == [SECRETS[1] + b"%d" % i for i in range(records)]
            finally:
                consumer.close()
            # A SASL exchange carrying a password, on a raw connection (Tansu answers it without SASL configured).
            with socket.create_connection(("127.0.0.1", listen_port), timeout=TIMEOUT) as sock:
                sock.sendall(api_versions(codec, 1))
                recv_frame(sock)
                sock.sendall(request_frame(codec, 17, 1, 2, {"Mechanism": "PLAIN"}))
                recv_frame(sock)
                sock.sendall(request_frame(codec, 36, 2, 3, {"AuthBytes": b"\x00user\x00" + SECRETS[3]}))
                sock.settimeout(5)
                try:
                    recv_frame(sock)
                except (EOFError, OSError):
                    pass  # a broker may close the connection instead
            del admin, producer, consumer
            gc.collect()
            proxy.wait_idle()
        finally:
            proxy.stop()
            capture.close()

    exchanges = proxy.events_of(Exchange)
    table = read_rows(sorted(tmp_path.glob("*.parquet")))
    assert not list(tmp_path.glob("*.tmp"))
    assert table.num_rows == len(exchanges) == capture.writer.rows_written > 10
    assert capture.writer.rows_dropped == capture.writer.row_errors == 0
    rows = table.to_pylist()
    seen = collections.Counter((x.request.connection.id, x.request.correlation_id, x.request.api_key) for x in exchanges)
    assert collections.Counter((r["connection_id"], r["correlation_id"], r["api_key"]) for r in rows) == seen
    names = {r["api_name"] for r in rows}
    assert {"ApiVersions", "Metadata", "CreateTopics", "Produce", "Fetch", "SaslAuthenticate"} <= names
    assert sum(r["record_count"] for r in rows if r["api_key"] == 0) == records
    fetched = sum(r["record_count"] for r in rows if r["api_key"] == 1)
    assert fetched >= records
    produce = [r for r in rows if r["api_key"] == 0]
    assert all(r["client_id"] == "capture-test" and r["latency_us"] > 0 for r in produce)
    assert {"topic": topic, "partitions": 1} in produce[0]["topic_partitions"]
    assert all(r["request_decode_error"] is None for r in rows)
    assert not [p for p in proxy.events_of(Problem) if p.kind not in ("unanswered",)]

    # No secret, in any form, in any file's bytes or any string of the table.
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.parquet"))
    assert b"capture-test" in raw and topic.encode() in raw  # (the check can see strings the rows hold)
    strings = "\n".join(_string_values(table)).encode()
    for secret in SECRETS:
        for form in _secret_forms(secret):
            assert form not in raw, form
            assert form not in strings, form


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("writer_process", [True, False], ids=["writer-process", "writer-thread"])
def test_the_proxy_command_captures_and_flushes_on_sigterm(tmp_path: Path, codec: Codec, writer_process: bool):
    from confluent_kafka.admin import AdminClient

    import pandas  # noqa: F401 (installed here: only the command's bar keeps it out of the proxy)

    listen_port, metrics_port = free_port(), free_port()
    config = tmp_path / "kinspect.toml"
    config.write_text(f"[capture]\nwriter_process = {str(writer_process).lower()}\n")
    with TansuBroker(advertised_port=listen_port) as tansu:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kinspect.cli.main", "proxy", "--config", config, "--listen",
             f"127.0.0.1:{listen_port}", "--upstream", tansu.bootstrap, "--metrics-listen",
             f"127.0.0.1:{metrics_port}", "--capture-dir", "caps"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path,
        )
        try:
            assert b"proxy listening" in proc.stdout.readline()
            # Warmed up: its pyarrow (in the writer thread's process, else in the writer process alone) has made its
            # first arrays, and pyarrow would have imported pandas then.
            loaded = Path(f"/proc/{proc.pid}/maps").read_text()
            assert ("/pyarrow/" in loaded) is not writer_process and "/pandas/" not in loaded
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{listen_port}", "client.id": "cli-capture"})
            assert admin.list_topics(timeout=TIMEOUT).brokers
            del admin
            gc.collect()
            import urllib.request

            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
            assert "kinspect_capture_queue_rows" in text and "kinspect_capture_rows_total" in text
            assert "kinspect_capture_rows_accepted_total" in text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    files = sorted((tmp_path / "caps").glob("*.parquet"))
    assert len(files) == 1 and not list((tmp_path / "caps").glob("*.tmp"))
    rows = read_rows(files).to_pylist()
    assert {"ApiVersions", "Metadata"} <= {r["api_name"] for r in rows}
    assert {r["client_id"] for r in rows} == {"cli-capture"}


# ----------------------------------------------------------------------------- facts, not frames


def test_the_queue_holds_facts_never_a_frame_or_a_codec(codec: Codec, tmp_path: Path):
    """What crosses to the writer thread: no codec, no event, no scan result, nothing the GC tracks for long, and no
    bytes of a frame but the immutable frames whose integer fields the writer counts (codegen.COUNT_LATER)."""
    from array import array

    from kinspect.protocol.codec.codegen import COUNTER_TYPECODE

    from kinspect.capture.count_later import LaterCounter
    from kinspect.capture.facts import FIELDS
    from kinspect.protocol.codec.scan_result import ScanResult
    from kinspect.session.events import Request, Response

    exchanges = recorded_exchanges(codec)
    observer = CaptureObserver(tmp_path, codec)  # not started: the queue keeps what the loop offered
    for x in exchanges:
        observer.on_event(x)
    queued = list(observer.writer._queue)
    assert len(queued) == len(exchanges) == observer.writer.rows_accepted
    frames = {id(x.request.frame) for x in exchanges} | {id(x.response.frame) for x in exchanges if x.response}
    seen = {"scans": 0, "counters": 0, "later": 0}

    def walk(value, depth=0):
        assert depth < 12
        assert not isinstance(value, (bytearray, memoryview, Codec, Request, Response, Exchange, ScanResult,
                                      list, set)), type(value)
        assert id(value) not in frames
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(value, tuple):
            for v in value:
                walk(v, depth + 1)

    sides = (FIELDS.index("request_side"), FIELDS.index("response_side"))
    for facts in queued:
        assert len(facts) == len(FIELDS)
        for i, value in enumerate(facts):
            if i not in sides:
                assert not isinstance(value, bytes)
                walk(value)
        for side in (facts[i] for i in sides):
            if type(side) is tuple:  # a SCAN; its only bytes: integer counters, or a whole frame to count them from
                seen["scans"] += 1
                for j, value in enumerate(side):
                    if j != 4:
                        assert not isinstance(value, bytes)
                        walk(value)
                if type(side[4]) is bytes:  # counted on the loop: a frame in pieces, or its api's counted now
                    assert id(side[4]) not in frames
                    seen["counters"] += len(array(COUNTER_TYPECODE, side[4]))
                elif side[4] is not None:  # the event's own frame, and where its body starts
                    frame, pos = side[4]
                    assert type(frame) is bytes and id(frame) in frames and type(pos) is int and 0 < pos <= len(frame)
                    seen["later"] += 1
    assert seen["scans"] > len(exchanges) and seen["later"] > 200
    counted = LaterCounter(codec.registry).count(queued)
    for facts in counted:
        for side in (facts[i] for i in sides):
            if type(side) is tuple and side[4] is not None:
                assert type(side[4]) is bytes
                seen["counters"] += len(array(COUNTER_TYPECODE, side[4]))
    assert seen["counters"] > 10_000
    # Once the collector has seen them, the facts are untracked (record-batch summaries included):
    # they are never promoted to the old generation while they wait.
    for _ in range(5):  # a tuple is untracked once its members are (up to 5 levels deep); a pass may reach an outer one first
        gc.collect()
    assert sum(1 for f in queued if any(type(f[i]) is tuple and f[i][7] for i in sides)) > 10  # some carry records
    assert not [f for f in queued if gc.is_tracked(f)]
    # and the rows they make are those of the same exchanges
    observer.close()
    table = read_rows(observer.writer.files)
    assert table.column("correlation_id").to_pylist() == [x.request.correlation_id for x in exchanges]


def test_facts_that_cannot_be_taken_are_counted_and_never_raise_into_the_loop(codec: Codec, tmp_path: Path, caplog):
    import dataclasses

    class Broken:
        """A codec whose scans fail in a way no decode error explains (a bug)."""

        registry = codec.registry

        def scan_request(self, frame, header):
            raise RuntimeError("a bug in scanning")

    exchanges = recorded_exchanges(codec, 6)
    bad = dataclasses.replace(exchanges[2], request=dataclasses.replace(exchanges[2].request, codec=Broken(),
                                                                        _scanned=None))
    observer = CaptureObserver(tmp_path, codec)
    registry = CollectorRegistry()
    registry.register(CaptureCollector(observer.writer))
    for x in exchanges[:2] + [bad, bad] + exchanges[3:]:
        observer.on_event(x)  # would raise here if a failure could reach the event loop
    assert registry.get_sample_value("kinspect_capture_dropped_rows_total", {"reason": "row_error"}) == 2
    assert registry.get_sample_value("kinspect_capture_rows_accepted_total") == 5
    assert sum("cannot take an exchange's facts" in r.message for r in caplog.records) == 1  # logged once
    observer.close()
    assert read_rows(observer.writer.files).num_rows == 5
