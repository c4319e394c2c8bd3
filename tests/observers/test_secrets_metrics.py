"""Credentials, record payloads and client ids never reach /metrics; topic names only where documented.

Known secrets cross kinspect: a client id, a topic name, record keys, values and headers
(confluent-kafka producing and consuming through kinspect to Tansu), and a SASL PLAIN password
(SaslHandshake v1 + SaslAuthenticate v2 over a raw socket, and a v0 handshake followed by a raw
token). /metrics is then scraped from two observers of the same traffic: with
metrics.topic_bytes off (the default) no secret, client id or topic name appears at all; with it
on, the topic name appears only as the `topic` label of kinspect_topic_bytes_total, as the
README documents, and nothing else does. Each secret is looked for in every form a text could
carry it (raw, hex, base64, escaped: tests/observers/test_debug_log.py's leak_forms), and each is first
shown to have crossed kinspect, so the test means something.
"""

from __future__ import annotations

import gc
import socket
import struct

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.codec import Codec
from kinspect.session import Request
from tests.support.proxy_harness import ProxyHarness, recv_frame, request_frame
from tests.support.tansu import TansuBroker, free_port
from tests.observers.test_debug_log import leak_forms

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLIENT_ID = "client-id-Q9x7-private"
TOPIC = "topic-name-K4m2-secretive"
KEY = b"RECORD-KEY-secret-1f2e"
VALUE = b"RECORD-VALUE-secret-9a8b"
HEADER = b"RECORD-HEADER-secret-77c1"
PASSWORD = b"SASL-P4ssw0rd-zz91"
RAW_TOKEN_PASSWORD = b"RAW-SASL-pw-5521q"


def occurrences(text: str, secret: bytes | str) -> list[str]:
    """The lines of an exposition that carry a secret in any form."""
    forms = leak_forms(secret)
    return [line for line in text.splitlines() if any(f in line for f in forms)]


def test_metrics_never_carry_credentials_payloads_or_client_ids(codec: Codec):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    listen = free_port()
    default = MetricsObserver()  # metrics.topic_bytes off: the default
    with_topics = MetricsObserver(topic_bytes=True)
    with TansuBroker(advertised_port=listen) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen}",
                              "proxy.upstream": tansu.bootstrap}, observers=(default, with_topics))
        default.server = with_topics.server = proxy.server
        proxy.start()
        bootstrap = f"127.0.0.1:{listen}"
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID})
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(20)
            producer = Producer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "acks": "all",
                                 "compression.type": "none"})
            for _ in range(5):
                producer.produce(TOPIC, key=KEY, value=VALUE, headers=[("h", HEADER)])
            assert producer.flush(20) == 0
            consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "group.id": "secrets",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False})
            consumer.assign([TopicPartition(TOPIC, 0, 0)])
            got = []
            for _ in range(100):
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append((msg.key(), msg.value(), msg.headers()))
                if len(got) == 5:
                    break
            consumer.close()
            assert got == [(KEY, VALUE, [("h", HEADER)])] * 5

            # SASL PLAIN through the KIP-152 requests, then through a v0 handshake and a raw token.
            with socket.create_connection(("127.0.0.1", listen), timeout=10) as sock:
                sock.sendall(request_frame(codec, 17, 1, 1, {"Mechanism": "PLAIN"}, client_id=CLIENT_ID))
                recv_frame(sock)
                sock.sendall(request_frame(codec, 36, 2, 2, {"AuthBytes": b"\x00alice\x00" + PASSWORD},
                                           client_id=CLIENT_ID))
                try:
                    sock.settimeout(5)
                    recv_frame(sock)  # Tansu may answer or hang up: the request crossed kinspect either way
                except (EOFError, OSError):
                    pass
            with socket.create_connection(("127.0.0.1", listen), timeout=10) as sock:
                sock.sendall(request_frame(codec, 17, 0, 1, {"Mechanism": "PLAIN"}, client_id=CLIENT_ID))
                recv_frame(sock)
                token = b"\x00bob\x00" + RAW_TOKEN_PASSWORD
                try:
                    sock.sendall(struct.pack(">i", len(token)) + token)
                    sock.settimeout(2)
                    recv_frame(sock)
                except (EOFError, OSError):
                    pass
            del admin, producer  # librdkafka closes their connections
            gc.collect()
            proxy.wait_idle()

            # The secrets did cross kinspect.
            frames = [e.frame for e in proxy.events_of(Request)]
            assert any(KEY in f and VALUE in f and HEADER in f for f in frames)
            assert any(PASSWORD in f for f in frames)
            assert any(e.header.client_id == CLIENT_ID for e in proxy.events_of(Request))

            plain = proxy.run(lambda: generate_latest(default.registry).decode())
            topical = proxy.run(lambda: generate_latest(with_topics.registry).decode())
        finally:
            proxy.stop()

    assert 'kinspect_produced_records_total{compression="none"} 5.0' in plain  # the records were counted
    for secret in (KEY, VALUE, HEADER, PASSWORD, RAW_TOKEN_PASSWORD, b"alice", CLIENT_ID, TOPIC):
        assert occurrences(plain, secret) == [], secret
    for secret in (KEY, VALUE, HEADER, PASSWORD, RAW_TOKEN_PASSWORD, b"alice", CLIENT_ID):
        assert occurrences(topical, secret) == [], secret
    # With topic_bytes on, the topic is a label of kinspect_topic_bytes_total, and of nothing else.
    lines = occurrences(topical, TOPIC)
    assert lines and all(line.startswith(("kinspect_topic_bytes_total{", "kinspect_topic_bytes_created{"))
                         for line in lines), lines
    topic_labels = {s.labels.get("topic") for f in text_string_to_metric_families(topical)
                    if f.name == "kinspect_topic_bytes" for s in f.samples}
    assert TOPIC in topic_labels
