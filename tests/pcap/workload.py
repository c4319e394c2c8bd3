"""The three real clients' workloads for the pcap recordings: produce (plain, gzip, acks=0, large values), consume."""

from __future__ import annotations

import asyncio
import time

# Tansu's groups need a session timeout of 6 s: with the clients' defaults a group join can stall (a CI run's
# kafka-python consumer got nothing in TIMEOUT_S).
SESSION_TIMEOUT_MS = 6000
TIMEOUT_S = 90.0  # generous: a loaded machine makes group joins slow; loops end as soon as all is consumed
VALUES = [b"v" * n for n in (10, 300, 2000, 150_000)]  # the last spans many TCP segments


def _values(count: int) -> list[bytes]:
    return [VALUES[i % len(VALUES)] + str(i).encode() for i in range(count)]


def confluent_kafka(bootstrap: str, topic: str, count: int = 40) -> int:
    from confluent_kafka import Consumer, Producer

    for conf in ({"compression.type": "none"}, {"compression.type": "gzip"}, {"acks": 0}):
        producer = Producer({"bootstrap.servers": bootstrap, "client.id": "pcap-confluent", "linger.ms": 5,
                             "message.max.bytes": 1_000_000, **conf})
        for value in _values(count):
            producer.produce(topic, value)
        assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}.group", "client.id": "pcap-confluent",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_TIMEOUT_MS})
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + TIMEOUT_S
    while got < 2 * count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    return got


def kafka_python(bootstrap: str, topic: str, count: int = 40) -> int:
    from kafka import KafkaConsumer, KafkaProducer

    for conf in ({}, {"compression_type": "gzip"}, {"acks": 0}):
        producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="pcap-kafka-python", linger_ms=5, **conf)
        for value in _values(count):
            producer.send(topic, value)
        producer.flush(TIMEOUT_S)
        producer.close(TIMEOUT_S)
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{topic}.group",
                             client_id="pcap-kafka-python", auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=3000,
                             session_timeout_ms=SESSION_TIMEOUT_MS)
    got, deadline = 0, time.monotonic() + TIMEOUT_S
    while got < 2 * count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += len(records)
    consumer.commit()
    consumer.close()
    return got


def aiokafka(bootstrap: str, topic: str, count: int = 40) -> int:
    return asyncio.run(_aiokafka(bootstrap, topic, count))


async def _aiokafka(bootstrap: str, topic: str, count: int) -> int:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    for conf in ({}, {"compression_type": "gzip"}, {"acks": 0}):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="pcap-aiokafka", linger_ms=5, **conf)
        await producer.start()
        try:
            for value in _values(count):
                await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{topic}.group",
                                client_id="pcap-aiokafka", auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_TIMEOUT_MS)
    await consumer.start()
    got = 0
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while got < 2 * count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            got += sum(len(records) for records in batches.values())
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


CLIENTS = {"confluent_kafka": confluent_kafka, "kafka_python": kafka_python, "aiokafka": aiokafka}
