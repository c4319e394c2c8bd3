"""kinspect's proxy with a real broker (Tansu) and the three real clients.

Rewrite mode: Tansu advertises 127.0.0.2:P, where nothing listens, so a client that
ever connected to the broker's own advertisement would fail; the clients are given only
kinspect's bootstrap address (through a recording relay), and kinspect reaches Tansu
through a second recording relay. After each workload every connection is checked byte
for byte (tests/support/proxy_harness.py: check_byte_exact, check_event_log).

What Tansu 0.6.0 / the clients do not support (tests/data/traffic/README.md):
- aiokafka 0.14 only speaks InitProducerId v0, which Tansu answers with error -1, so the
  aiokafka test has no idempotent or transactional produce (its other steps all run);
- Tansu delivers aborted transactional records to read_committed consumers, so for the
  transactional topic the tests require the committed records and allow the aborted ones.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import signal
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.specs.api_keys import FETCH
from kinspect.session import Exchange, Problem, Request
from tests.support.proxy_harness import (
    CLIENT_HOST, TANSU_NODE_ID, UNUSABLE_HOST, ProxyHarness, RewriteRig, api_versions, check_byte_exact,
    check_event_log, fetch, poll_until, recv_frame, refuses, wait_closed,
)
from tests.support.tansu import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 6
T_CODECS, T_ACKS0, T_IDEM, T_TXN, T_DOOMED = "it.codecs", "it.acks0", "it.idempotent", "it.txn", "it.doomed"
GROUP, TXN_GROUP, TXN_ID = "it.group", "it.txn-group", "it.txn-producer"
TIMEOUT = 20.0


def value(tag: str, i: int) -> bytes:
    """Deterministic values of 5 bytes to 3 KiB, compressible."""
    size = (5, 90, 700, 3000, 1500, 40)[i % 6]
    return (f"{tag}#{i}:".encode() + b"kinspect relays kafka bytes unchanged. " * 80)[:size]


def values(tag: str, n: int) -> list[bytes]:
    return [value(tag, i) for i in range(n)]


class Expected:
    """What was produced (values per topic, in order), to compare with what is consumed."""

    def __init__(self) -> None:
        self.produced: dict[str, list[bytes]] = collections.defaultdict(list)
        self.aborted: dict[str, list[bytes]] = collections.defaultdict(list)

    def check_consumed(self, consumed: dict[str, list[bytes]]) -> None:
        for topic, want in self.produced.items():
            got = consumed.get(topic, [])
            if topic in self.aborted:
                # Tansu hands aborted transactional records to read_committed consumers too.
                assert [v for v in got if v not in self.aborted[topic]] == want, topic
                assert set(got) <= set(want) | set(self.aborted[topic]), topic
            else:
                assert got == want, topic

    def enough(self, consumed: dict[str, list[bytes]]) -> bool:
        return all(len(consumed.get(t, [])) >= len(v) for t, v in self.produced.items())


def verify_rig(rig: RewriteRig, codec: Codec, apis: set[str]) -> None:
    """After a workload: every connection byte-exact, the EventLog complete, the expected APIs seen."""
    rig.quiesce()
    report = check_byte_exact(rig, codec)
    stats = check_event_log(rig)
    # Clients used kinspect's node listener (learnt from rewritten responses), not only the bootstrap.
    assert rig.front_node.connections, "no client connected to the node address kinspect advertised"
    # kinspect accepted every client connection (front relays) and opened one broker connection for each.
    assert report.connections == len(rig.back.connections) > 0
    assert rig.proxy.server.connections_total == len(rig.front_boot.connections) + len(rig.front_node.connections)
    assert report.rewritten > 0 and report.address_responses >= report.rewritten
    assert stats["exchanges"] > 0
    seen = {codec.registry.api_name(k) for k, _ in report.apis}
    assert apis <= seen, apis - seen
    # Tansu offers Fetch up to v17; kinspect offered clients v15 at most (proxy.fetch_max_version), so that
    # no Fetch response carries KIP-951 NodeEndpoints and none is held whole: every client kept to it.
    assert report.capped > 0
    assert max((v for k, v in report.apis if k == FETCH), default=0) <= 15
    # kinspect's own listener for node 111 is where clients were sent, and Tansu's advertisement was never usable.
    assert TANSU_NODE_ID in rig.proxy.server.node_listeners
    assert refuses(UNUSABLE_HOST, rig.tansu.port)


@pytest.fixture
def rig(tmp_path):
    with RewriteRig(tmp_path) as r:
        yield r


@pytest.fixture
def cleanup():
    """Register closers of clients; they run at teardown (before the rig stops), also after a failure."""
    calls = []
    yield calls.append
    for close in reversed(calls):
        try:
            close()
        except Exception:  # already closed on the normal path
            pass


# ----------------------------------------------------------------------------- confluent-kafka


def test_confluent_kafka_through_kinspect(rig: RewriteRig, codec: Codec, cleanup):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    base = {"bootstrap.servers": rig.bootstrap, "client.id": "it-confluent"}
    expected = Expected()

    # admin: create, list, delete
    admin = AdminClient(dict(base))
    new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in (T_CODECS, T_ACKS0, T_IDEM, T_TXN)]
    new.append(NewTopic(T_DOOMED, num_partitions=3, replication_factor=1))
    for f in admin.create_topics(new, operation_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    md = admin.list_topics(timeout=TIMEOUT)
    assert {T_CODECS, T_ACKS0, T_IDEM, T_TXN, T_DOOMED} <= set(md.topics)
    assert len(md.topics[T_DOOMED].partitions) == 3
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {TANSU_NODE_ID: (CLIENT_HOST, rig.node_port)}
    for f in admin.delete_topics([T_DOOMED], operation_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    poll_until(lambda: T_DOOMED not in admin.list_topics(timeout=TIMEOUT).topics, timeout=TIMEOUT, interval=0.1)
    del admin

    def produce(conf: dict, topic: str, tag: str, n: int) -> None:
        producer = Producer({**base, "linger.ms": 10, **conf})
        cleanup(producer.close)
        errors = []
        for i, v in enumerate(values(tag, n)):
            producer.produce(topic, value=v, key=f"k{i}".encode(), headers=[("seq", str(i).encode())],
                             on_delivery=lambda err, msg: err and errors.append(err))
        assert producer.flush(TIMEOUT) == 0
        assert not errors, errors
        expected.produced[topic] += values(tag, n)
        producer.close()

    for compression in CODECS:
        produce({"compression.type": compression}, T_CODECS, compression, PER_CODEC)
    produce({"acks": 0}, T_ACKS0, "acks0", 3)
    produce({"enable.idempotence": True}, T_IDEM, "idem", 4)

    # transactional: commit 3 records with consumer offsets in the transaction, then abort 2
    producer = Producer({**base, "transactional.id": TXN_ID, "linger.ms": 10})
    cleanup(producer.close)
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    for v in values("txn-commit", 3):
        producer.produce(T_TXN, value=v)
    group_meta = Consumer({**base, "group.id": TXN_GROUP})
    cleanup(group_meta.close)
    producer.send_offsets_to_transaction([TopicPartition(T_CODECS, 0, PER_CODEC)],
                                         group_meta.consumer_group_metadata(), TIMEOUT)
    group_meta.close()
    producer.commit_transaction(TIMEOUT)
    expected.produced[T_TXN] += values("txn-commit", 3)
    producer.begin_transaction()
    for v in values("txn-abort", 2):
        producer.produce(T_TXN, value=v)
    producer.flush(TIMEOUT)
    producer.abort_transaction(TIMEOUT)
    expected.aborted[T_TXN] += values("txn-abort", 2)
    producer.close()
    del producer

    # consumer group: subscribe, consume everything, commit, read the commits back
    consumer = Consumer({**base, "group.id": GROUP, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "session.timeout.ms": 6000,
                         "heartbeat.interval.ms": 500})
    try:
        consumer.subscribe(sorted(expected.produced))
        consumed: dict[str, list[bytes]] = collections.defaultdict(list)
        deadline = time.monotonic() + 40
        while not expected.enough(consumed) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                consumed[msg.topic()].append(msg.value())
        for msg in consumer.consume(100, 0.5):  # late aborted records of the transactional topic, if any
            consumed[msg.topic()].append(msg.value())
        expected.check_consumed(consumed)
        committed = consumer.commit(asynchronous=False)
        assert all(tp.error is None for tp in committed)
        positions = {tp.topic: tp.offset for tp in consumer.position(consumer.assignment())}
        read_back = {tp.topic: tp.offset for tp in consumer.committed(
            [TopicPartition(t, 0) for t in expected.produced], timeout=TIMEOUT)}
        assert read_back == positions
        for topic in (T_CODECS, T_ACKS0, T_IDEM):
            assert read_back[topic] == len(expected.produced[topic]), topic
        assert read_back[T_TXN] >= 3
    finally:
        consumer.close()
    del consumer

    # the offsets committed inside the transaction
    txn_group = Consumer({**base, "group.id": TXN_GROUP})
    try:
        txn_offsets = [tp.offset for tp in txn_group.committed([TopicPartition(T_CODECS, 0)], timeout=TIMEOUT)]
    finally:
        txn_group.close()
    assert txn_offsets == [PER_CODEC]
    del txn_group
    gc.collect()

    verify_rig(rig, codec, {
        "Produce", "Fetch", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup", "OffsetCommit",
        "OffsetFetch", "CreateTopics", "DeleteTopics", "InitProducerId", "AddPartitionsToTxn",
        "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "ApiVersions",
    })
    acks0 = [e for e in rig.proxy.events_of(Exchange) if e.request.api_key == 0 and not e.request.expects_response]
    assert acks0 and all(e.response is None for e in acks0)


@pytest.mark.parametrize("cap", [15, 0])
def test_rewrite_mode_offers_fetch_up_to_its_cap(tmp_path: Path, codec: Codec, cleanup, cap):
    """librdkafka fetches at v16+ when the broker offers it (Tansu: v17): every Fetch response then
    is held whole for its NodeEndpoints. With proxy.fetch_max_version (15 by default) kinspect
    offers v15 at most, and librdkafka fetches at v15: nothing of the consume path is held."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with RewriteRig(tmp_path, overrides={"proxy.fetch_max_version": cap}) as rig:
        base = {"bootstrap.servers": rig.bootstrap, "client.id": f"it-cap-{cap}"}
        admin = AdminClient(dict(base))
        for f in admin.create_topics([NewTopic("it.cap", 1, 1)], operation_timeout=TIMEOUT).values():
            f.result(timeout=TIMEOUT)
        del admin
        producer = Producer({**base, "linger.ms": 5})
        cleanup(producer.close)
        errors = []
        for v in values("cap", 12):
            producer.produce("it.cap", value=v, on_delivery=lambda err, msg: err and errors.append(err))
        assert producer.flush(TIMEOUT) == 0 and not errors, errors
        producer.close()
        consumer = Consumer({**base, "group.id": f"it.cap-{cap}", "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000})
        cleanup(consumer.close)
        consumer.subscribe(["it.cap"])
        got, deadline = [], time.monotonic() + TIMEOUT
        while len(got) < 12 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message.value())
        consumer.close()
        assert got == values("cap", 12)
        rig.quiesce()
        report = check_byte_exact(rig, codec)
        fetched = {v for k, v in report.apis if k == FETCH}
        held = {v for v in fetched if rig.proxy.server.plan.transform.wants(FETCH, v)}
    if cap:
        assert report.capped > 0 and max(fetched) == cap and not held
    else:
        assert report.capped == 0 and min(fetched) >= 16 and held == fetched


# ----------------------------------------------------------------------------- kafka-python


def test_kafka_python_through_kinspect(rig: RewriteRig, codec: Codec, cleanup):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.structs import OffsetAndMetadata

    base = {"bootstrap_servers": rig.bootstrap, "client_id": "it-kafka-python"}
    expected = Expected()

    admin = KafkaAdminClient(**base)
    cleanup(admin.close)
    new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in (T_CODECS, T_ACKS0, T_IDEM, T_TXN)]
    new.append(NewTopic(T_DOOMED, num_partitions=3, replication_factor=1))
    admin.create_topics(new, timeout_ms=int(TIMEOUT * 1000))
    assert {T_CODECS, T_ACKS0, T_IDEM, T_TXN, T_DOOMED} <= set(admin.list_topics())
    described = {d["name"]: d for d in admin.describe_topics([T_DOOMED])}
    assert len(described[T_DOOMED]["partitions"]) == 3
    cluster = admin.describe_cluster()  # DescribeCluster: another response whose addresses kinspect rewrites
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [
        (TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]
    admin.delete_topics([T_DOOMED], timeout_ms=int(TIMEOUT * 1000))
    poll_until(lambda: T_DOOMED not in admin.list_topics(), timeout=TIMEOUT, interval=0.1)
    admin.close()

    def produce(conf: dict, topic: str, tag: str, n: int) -> None:
        producer = KafkaProducer(**base, linger_ms=10, **conf)
        cleanup(producer.close)
        futures = [producer.send(topic, value=v, key=f"k{i}".encode(), headers=[("seq", str(i).encode())])
                   for i, v in enumerate(values(tag, n))]
        producer.flush(timeout=TIMEOUT)
        for f in futures:
            f.get(timeout=TIMEOUT)
        producer.close(timeout=TIMEOUT)
        expected.produced[topic] += values(tag, n)

    for compression in CODECS:
        # kafka-python 3 is idempotent by default: these producers send InitProducerId too.
        produce({"compression_type": None if compression == "none" else compression}, T_CODECS, compression, PER_CODEC)
    produce({"acks": 0}, T_ACKS0, "acks0", 3)
    produce({"enable_idempotence": True, "acks": "all"}, T_IDEM, "idem", 4)

    producer = KafkaProducer(**base, linger_ms=10, transactional_id=TXN_ID)
    cleanup(producer.close)
    producer.init_transactions()
    producer.begin_transaction()
    for f in [producer.send(T_TXN, value=v) for v in values("txn-commit", 3)]:
        f.get(timeout=TIMEOUT)
    producer.send_offsets_to_transaction({TopicPartition(T_CODECS, 0): OffsetAndMetadata(PER_CODEC, "", -1)},
                                         TXN_GROUP)
    producer.commit_transaction()
    expected.produced[T_TXN] += values("txn-commit", 3)
    producer.begin_transaction()
    for f in [producer.send(T_TXN, value=v) for v in values("txn-abort", 2)]:
        f.get(timeout=TIMEOUT)
    producer.abort_transaction()
    expected.aborted[T_TXN] += values("txn-abort", 2)
    producer.close(timeout=TIMEOUT)

    consumer = KafkaConsumer(**base, group_id=GROUP, auto_offset_reset="earliest", enable_auto_commit=False,
                             isolation_level="read_committed", session_timeout_ms=6000, heartbeat_interval_ms=500)
    cleanup(consumer.close)
    consumer.subscribe(sorted(expected.produced))
    consumed: dict[str, list[bytes]] = collections.defaultdict(list)
    deadline = time.monotonic() + 40
    extra_until = None
    while time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=200).items():
            consumed[tp.topic] += [r.value for r in records]
        if extra_until is None and expected.enough(consumed):
            extra_until = time.monotonic() + 0.5  # late aborted records of the transactional topic, if any
        if extra_until is not None and time.monotonic() > extra_until:
            break
    expected.check_consumed(consumed)
    consumer.commit()
    positions = {tp.topic: consumer.position(tp) for tp in consumer.assignment()}
    read_back = {t: consumer.committed(TopicPartition(t, 0)) for t in expected.produced}
    assert read_back == positions
    for topic in (T_CODECS, T_ACKS0, T_IDEM):
        assert read_back[topic] == len(expected.produced[topic]), topic
    consumer.close()

    # Commits are visible to an admin client too (OffsetFetch on a fresh connection set).
    admin = KafkaAdminClient(**base)
    try:
        offsets = admin.list_group_offsets([GROUP, TXN_GROUP])
    finally:
        admin.close()
    assert {tp.topic: om.offset for tp, om in offsets[GROUP].items()} == read_back
    assert {tp.topic: om.offset for tp, om in offsets[TXN_GROUP].items()} == {T_CODECS: PER_CODEC}
    gc.collect()

    verify_rig(rig, codec, {
        "Produce", "Fetch", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup",
        "OffsetCommit", "OffsetFetch", "CreateTopics", "DeleteTopics", "InitProducerId", "AddPartitionsToTxn",
        "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "DescribeCluster", "ApiVersions",
    })


# ----------------------------------------------------------------------------- aiokafka


def test_aiokafka_through_kinspect(rig: RewriteRig, codec: Codec):
    # aiokafka 0.14 sends InitProducerId v0, which Tansu 0.6.0 answers with error -1
    # (tests/data/traffic/README.md), so no idempotent or transactional produce here.
    asyncio.run(_aiokafka_workload(rig))
    gc.collect()
    verify_rig(rig, codec, {
        "Produce", "Fetch", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup", "OffsetCommit",
        "OffsetFetch", "CreateTopics", "DeleteTopics", "ApiVersions",
    })


async def _aiokafka_workload(rig: RewriteRig) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    base = {"bootstrap_servers": rig.bootstrap, "client_id": "it-aiokafka"}
    expected = Expected()

    def wait(aw):
        return asyncio.wait_for(aw, TIMEOUT)

    admin = AIOKafkaAdminClient(**base)
    await wait(admin.start())
    try:
        new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in (T_CODECS, T_ACKS0)]
        new.append(NewTopic(T_DOOMED, num_partitions=3, replication_factor=1))
        await wait(admin.create_topics(new, timeout_ms=int(TIMEOUT * 1000)))
        assert {T_CODECS, T_ACKS0, T_DOOMED} <= set(await wait(admin.list_topics()))
        await wait(admin.delete_topics([T_DOOMED], timeout_ms=int(TIMEOUT * 1000)))
        for _ in range(100):
            if T_DOOMED not in await wait(admin.list_topics()):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("deleted topic still listed")
    finally:
        await wait(admin.close())

    async def produce(conf: dict, topic: str, tag: str, n: int) -> None:
        producer = AIOKafkaProducer(**base, linger_ms=10, **conf)
        await wait(producer.start())
        try:
            futures = [await producer.send(topic, value=v, key=f"k{i}".encode(),
                                           headers=[("seq", str(i).encode())])
                       for i, v in enumerate(values(tag, n))]
            await wait(producer.flush())
            for f in futures:
                await wait(f)
        finally:
            await wait(producer.stop())
        expected.produced[topic] += values(tag, n)

    for compression in CODECS:
        await produce({"compression_type": None if compression == "none" else compression}, T_CODECS, compression,
                      PER_CODEC)
    await produce({"acks": 0}, T_ACKS0, "acks0", 3)

    consumer = AIOKafkaConsumer(**base, group_id=GROUP, auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=6000, heartbeat_interval_ms=500)
    await wait(consumer.start())
    try:
        consumer.subscribe(sorted(expected.produced))
        consumed: dict[str, list[bytes]] = collections.defaultdict(list)
        deadline = time.monotonic() + 40
        while not expected.enough(consumed) and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                consumed[tp.topic] += [r.value for r in records]
        expected.check_consumed(consumed)
        await wait(consumer.commit())
        positions = {tp.topic: await consumer.position(tp) for tp in consumer.assignment()}
        read_back = {t: await wait(consumer.committed(TopicPartition(t, 0))) for t in expected.produced}
        assert read_back == positions
        assert read_back == {t: len(v) for t, v in expected.produced.items()}
    finally:
        await wait(consumer.stop())

    # The commits, read back by a fresh consumer of the group. (aiokafka's admin
    # list_consumer_group_offsets cannot parse Tansu's OffsetFetch answer, with or without kinspect.)
    reader = AIOKafkaConsumer(**base, group_id=GROUP, enable_auto_commit=False)
    await wait(reader.start())
    try:
        assert {t: await wait(reader.committed(TopicPartition(t, 0))) for t in expected.produced} == read_back
    finally:
        await wait(reader.stop())


# ----------------------------------------------------------------------------- passthrough mode


def test_passthrough_mode_produce_consume(codec: Codec, cleanup):
    """Passthrough: Tansu advertises kinspect's listener itself, so every connection crosses kinspect."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    listen_port = free_port()  # picked first: the broker must advertise it
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}).start()
        try:
            base = {"bootstrap.servers": f"127.0.0.1:{listen_port}", "client.id": "it-passthrough"}
            admin = AdminClient(dict(base))
            admin.create_topics([NewTopic("pt.topic", num_partitions=1, replication_factor=1)])["pt.topic"].result(TIMEOUT)
            md = admin.list_topics(timeout=TIMEOUT)
            assert [(b.host, b.port) for b in md.brokers.values()] == [("127.0.0.1", listen_port)]
            del admin
            sent = [value("pt", i) for i in range(50)]
            producer = Producer({**base, "compression.type": "lz4", "linger.ms": 10})
            cleanup(producer.close)
            for v in sent:
                producer.produce("pt.topic", value=v)
            assert producer.flush(TIMEOUT) == 0
            producer.close()
            consumer = Consumer({**base, "group.id": "pt.group", "auto.offset.reset": "earliest"})
            try:
                consumer.assign([TopicPartition("pt.topic", 0, 0)])
                got = []
                deadline = time.monotonic() + TIMEOUT
                while len(got) < len(sent) and time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        got.append(msg.value())
            finally:
                consumer.close()
            assert got == sent
            del producer, consumer
            gc.collect()
            proxy.wait_idle()
            server = proxy.server
            assert server.connections_total >= 2 and not server.node_listeners  # nothing rewritten, no extra listeners
            requests = proxy.events_of(Request)
            exchanges = proxy.events_of(Exchange)
            answered = {id(x.request) for x in exchanges if x.response is not None}
            assert {r.api_name for r in requests} >= {"ApiVersions", "Metadata", "CreateTopics", "Produce", "Fetch"}
            # Every request was paired with its response (no acks=0 here), except those a client left
            # in flight when it closed (a Fetch long poll, a Metadata refresh), reported as unanswered.
            unanswered = {(p.connection.id, p.detail.split("correlation id ")[1].split()[0])
                          for p in proxy.events_of(Problem) if p.kind == "unanswered"}
            left = [r for r in requests if id(r) not in answered]
            assert all((r.connection.id, str(r.correlation_id)) in unanswered for r in left), \
                [(r.api_name, r.correlation_id) for r in left]
            assert len(left) == len(unanswered) < 5
            assert len(answered) == len(exchanges) > 10
            for x in exchanges:  # the session decodes both sides
                x.request.decode()
                x.response.decode()
            assert not [p for p in proxy.events_of(Problem) if p.kind != "unanswered"]
        finally:
            proxy.stop()


# ----------------------------------------------------------------------------- the real command


def _read_line(stream, timeout: float) -> str:
    """One line from a subprocess pipe, or fail after timeout."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output within {timeout} s")
    return stream.readline().decode()


def test_kinspect_proxy_command_rewrite_mode_and_sigterm(tmp_path: Path, codec: Codec, cleanup):
    """`kinspect proxy --config FILE` in rewrite mode: kafka-python works through it; SIGTERM lets an
    in-flight request finish, then the command exits with status 0."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    node_port, metrics_port = free_port(), free_port()
    with TansuBroker(advertised_host=UNUSABLE_HOST) as tansu:
        config = tmp_path / "kinspect.toml"
        config.write_text(
            "[proxy]\n"
            'mode = "rewrite"\n'
            'listen = "127.0.0.1:0"\n'
            f'bootstrap_servers = ["{tansu.bootstrap}"]\n'
            f'node_ports = {{ "{TANSU_NODE_ID}" = {node_port} }}\n'
            f'upstream_map = {{ "{UNUSABLE_HOST}:{tansu.port}" = "{tansu.bootstrap}" }}\n'
            "shutdown_grace = 8.0\n"
            "[metrics]\n"
            f'listen = "127.0.0.1:{metrics_port}"\n'
            "[log]\n"
            "debug_requests = true\n"
            'include_apis = ["CreateTopics"]\n'
        )
        log_path = tmp_path / "kinspect.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kinspect.cli.main", "proxy", "--config", str(config)],
                stdout=subprocess.PIPE, stderr=log, cwd=tmp_path,
            )
        try:
            line = _read_line(proc.stdout, 20)
            assert "proxy listening on 127.0.0.1:" in line and "rewrite mode" in line, line
            port = int(line.split("127.0.0.1:")[1].split()[0])
            base = {"bootstrap_servers": f"127.0.0.1:{port}", "client_id": "it-cli"}
            sent = [value("cli", i) for i in range(20)]
            admin = KafkaAdminClient(**base)  # (Tansu's topic auto-creation loses and reorders records)
            try:
                admin.create_topics([NewTopic("cli.topic", num_partitions=1, replication_factor=1)])
            finally:
                admin.close()
            producer = KafkaProducer(**base, linger_ms=10, compression_type="zstd")
            cleanup(producer.close)
            for f in [producer.send("cli.topic", value=v) for v in sent]:
                f.get(timeout=TIMEOUT)
            producer.close(timeout=TIMEOUT)
            # (with kafka-python's default session timeout, joining a Tansu group takes ~20 s, kinspect or not)
            consumer = KafkaConsumer(**base, group_id="cli.group", auto_offset_reset="earliest",
                                     enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
            try:
                consumer.subscribe(["cli.topic"])
                got = []
                deadline = time.monotonic() + 30
                while len(got) < len(sent) and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=200).values():
                        got += [r.value for r in records]
                assert got == sent
                consumer.commit()
                assert consumer.committed(TopicPartition("cli.topic", 0)) == len(sent)
            finally:
                consumer.close()

            # The metrics endpoint of the running command reflects what the clients did.
            import urllib.request

            from prometheus_client.parser import text_string_to_metric_families

            base_url = f"http://127.0.0.1:{metrics_port}"
            assert urllib.request.urlopen(f"{base_url}/healthz", timeout=5).status == 200
            assert urllib.request.urlopen(f"{base_url}/readyz", timeout=5).status == 200
            text = urllib.request.urlopen(f"{base_url}/metrics", timeout=5).read().decode()
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples}
            produced = sum(v for (name, labels), v in samples.items()
                           if name == "kinspect_produced_records_total" and dict(labels)["compression"] == "zstd")
            assert produced == len(sent)
            assert any(name == "kinspect_requests_total" and dict(labels)["api"] == "CreateTopics"
                       for name, labels in samples)

            # A long-poll Fetch in flight (Tansu holds it for MaxWaitMs) when SIGTERM arrives.
            with socket.create_connection(("127.0.0.1", node_port), timeout=10) as sock:
                sock.sendall(api_versions(codec, 1))
                recv_frame(sock)
                sock.sendall(fetch(codec, 2, "cli.topic", offset=len(sent), max_wait_ms=1500))
                poll_until(lambda: inflight_requests(base_url) >= 1, 10)  # the Fetch waits at the broker
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                frame = recv_frame(sock)  # the in-flight request is answered ...
                answered = time.monotonic() - signalled
                assert int.from_bytes(frame[:4], "big") == 2
                codec.decode_response(frame, 1, 12)
                wait_closed(sock, 5)  # ... then kinspect closes the connection
            assert proc.wait(timeout=10) == 0
            stopped = time.monotonic() - signalled
            assert 0.9 < answered < 3 and stopped < 5, (answered, stopped)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        text = log_path.read_text()
        assert "stopping: " in text and "Traceback" not in text, text
        # Logs are JSON lines; the debug log shows decoded CreateTopics requests and no other api.
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        debug = [line for line in lines if line.get("event") == "kafka.request"]
        assert debug and {line["api"] for line in debug} == {"CreateTopics"}
        assert "cli.topic" in debug[0]["body"]


def inflight_requests(base_url: str) -> float:
    """kinspect_inflight_requests as the running command's /metrics serves it."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=5).read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "kinspect_inflight_requests")
