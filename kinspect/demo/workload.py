"""The demo's sample workload: confluent-kafka creates a topic, produces with several codecs, consumes in a group."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

TOPIC = "kinspect-demo"
GROUP = "kinspect-demo-group"
PARTITIONS = 3
CODECS = ("none", "gzip", "zstd")
RECORDS_PER_CODEC = 100
CLIENT_LOGGER = "kinspect.demo.client"
TIMEOUT = 20.0  # seconds any one step may take
CONSUME_TIMEOUT = 40.0


class WorkloadCancelled(Exception):
    """The demo was asked to stop while the workload ran."""


class WorkloadError(RuntimeError):
    """A step of the workload failed; the message names it."""


@dataclass
class WorkloadResult:
    topic: str = TOPIC
    group: str = GROUP
    produced: dict[str, int] = field(default_factory=dict)  # codec -> records acknowledged
    consumed: int = 0
    seconds: float = 0.0

    def lines(self) -> list[str]:
        produced = sum(self.produced.values())
        codecs = ", ".join(f"{c} {n}" for c, n in self.produced.items())
        return [f"workload: topic {self.topic} ({PARTITIONS} partitions): produced {produced} records ({codecs}), "
                f"consumed {self.consumed} in group {self.group}, in {self.seconds:.1f} s"]


def run_workload(bootstrap: str, cancel: threading.Event) -> WorkloadResult:
    """Drive a real client through kinspect at bootstrap; checks `cancel` between (bounded) steps."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection
    from confluent_kafka.admin import AdminClient, NewTopic

    started = time.monotonic()
    result = WorkloadResult()
    # librdkafka's own log lines go to kinspect's log file, not over the summary.
    base = {"bootstrap.servers": bootstrap, "client.id": "kinspect-demo", "logger": logging.getLogger(CLIENT_LOGGER)}

    def check() -> None:
        if cancel.is_set():
            raise WorkloadCancelled()

    try:
        admin = AdminClient(dict(base))
        for future in admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)],
                                          operation_timeout=TIMEOUT).values():
            try:
                future.result(timeout=TIMEOUT)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise WorkloadError(f"creating topic {TOPIC}: {exc}") from None
        if TOPIC not in admin.list_topics(timeout=TIMEOUT).topics:
            raise WorkloadError(f"topic {TOPIC} is not in Metadata after it was created")
        check()

        for codec in CODECS:
            errors: list = []
            producer = Producer({**base, "client.id": f"kinspect-demo-{codec}", "compression.type": codec,
                                 "linger.ms": 5, "acks": "all"})
            for i in range(RECORDS_PER_CODEC):
                producer.produce(TOPIC, key=f"key-{i % 10}".encode(),
                                 value=f"{codec} record {i} ".encode() * (1 + i % 8),
                                 on_delivery=lambda err, msg: err and errors.append(err))
                producer.poll(0)
            left = producer.flush(TIMEOUT)
            if left or errors:
                raise WorkloadError(f"producing with {codec}: {left} records undelivered, errors: {errors[:3]}")
            result.produced[codec] = RECORDS_PER_CODEC
            check()

        total = sum(result.produced.values())
        consumer = Consumer({**base, "client.id": "kinspect-demo-consumer", "group.id": GROUP,
                             "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                             "heartbeat.interval.ms": 500, "enable.auto.commit": False})
        try:
            consumer.subscribe([TOPIC])
            deadline = time.monotonic() + CONSUME_TIMEOUT
            while result.consumed < total and time.monotonic() < deadline:
                check()
                for msg in consumer.consume(500, 0.2):
                    if msg.error() is not None:
                        raise WorkloadError(f"consuming: {msg.error()}")
                    result.consumed += 1
            if result.consumed < total:
                raise WorkloadError(f"consumed {result.consumed} of {total} records in {CONSUME_TIMEOUT:.0f} s")
            consumer.commit(asynchronous=False)
            consumer.committed(consumer.assignment(), timeout=TIMEOUT)
        finally:
            consumer.close()  # leaves the group
        check()

        # Metadata and cluster descriptions, as a monitoring tool would ask for them.
        admin.list_topics(timeout=TIMEOUT)
        for future in admin.describe_topics(TopicCollection([TOPIC]), request_timeout=TIMEOUT).values():
            future.result(timeout=TIMEOUT)
        admin.describe_cluster(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
        admin.list_consumer_groups(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
        for future in admin.describe_consumer_groups([GROUP], request_timeout=TIMEOUT).values():
            future.result(timeout=TIMEOUT)
    finally:
        result.seconds = time.monotonic() - started
    return result
