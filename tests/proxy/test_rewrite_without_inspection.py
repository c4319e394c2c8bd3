"""Rewriting does not depend on inspection: with every observer failing and the client direction's facts
no longer computed, responses that name brokers still reach a real client rewritten."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from kinspect.session import Problem, Response
from tests.support.proxy_harness import (
    CLIENT_HOST, TANSU_NODE_ID, RewriteRig, metadata, poll_until, recv_frame, request_frame,
)

pytestmark = pytest.mark.integration

TIMEOUT = 30


class RaisesOnEveryEvent:
    """An observer with a bug: it raises on every event it is given."""

    needs_bodies = True

    def __init__(self) -> None:
        self.calls = 0

    def on_event(self, event) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


class BrokenRequestInspection(Codec):
    """A codec whose request-header parsing fails: the session cannot compute a request's facts."""

    def decode_request_header(self, frame: bytes):
        raise RuntimeError("inspection bug")


def test_rewrite_survives_failing_observers_and_stopped_request_inspection(tmp_path: Path):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broken = RaisesOnEveryEvent()
    with RewriteRig(tmp_path, codec=BrokenRequestInspection(), observers=(broken,)) as rig:
        base = {"bootstrap.servers": rig.bootstrap, "client.id": "no-inspection"}
        admin = AdminClient(dict(base))
        for future in admin.create_topics([NewTopic("rw.topic", num_partitions=1, replication_factor=1)],
                                          operation_timeout=TIMEOUT).values():
            future.result(timeout=TIMEOUT)
        # Metadata: the broker Tansu advertises (127.0.0.2, unusable) is kinspect's node listener.
        listed = admin.list_topics(timeout=TIMEOUT)
        assert {b.id: (b.host, b.port) for b in listed.brokers.values()} == {
            TANSU_NODE_ID: (CLIENT_HOST, rig.node_port)}
        cluster = admin.describe_cluster(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
        assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]
        # DescribeCluster and Metadata on a raw connection, read with a healthy codec.
        healthy = Codec()
        host, port = rig.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
            sock.sendall(request_frame(healthy, 60, 0, 1, {"IncludeClusterAuthorizedOperations": False}))
            described = healthy.decode_response(recv_frame(sock), 60, 0).body
            assert [(b["BrokerId"], b["Host"], b["Port"]) for b in described["Brokers"]] == [
                (TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]
            sock.sendall(metadata(healthy, 2))
            brokers = healthy.decode_response(recv_frame(sock), 3, 12).body["Brokers"]
            assert [(b["NodeId"], b["Host"], b["Port"]) for b in brokers] == [(TANSU_NODE_ID, CLIENT_HOST, rig.node_port)]

        producer = Producer({**base, "linger.ms": 5})
        for i in range(20):
            producer.produce("rw.topic", value=f"v{i}".encode())
        assert producer.flush(TIMEOUT) == 0
        # A consumer group: FindCoordinator must lead the client to kinspect, not to 127.0.0.2.
        consumer = Consumer({**base, "group.id": "rw.group", "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "enable.auto.commit": False})
        consumer.subscribe(["rw.topic"])
        got: list[bytes] = []

        def consumed() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
            return len(got) >= 20

        poll_until(consumed, timeout=TIMEOUT, interval=0)
        consumer.commit(asynchronous=False)
        consumer.close()
        assert got == [f"v{i}".encode() for i in range(20)]

        events = rig.proxy.events.events
        failed = [e for e in events if isinstance(e, Problem) and e.kind == "inspection_failed"]
        assert failed and all(e.direction == "request" for e in failed)
        assert broken.calls > 0 and rig.proxy.dispatcher.failures >= broken.calls
        # No request facts, but the responses were still paired and rewritten.
        apis = {e.api_key for e in events if isinstance(e, Response)}
        assert {3, 10, 60} <= apis  # Metadata, FindCoordinator, DescribeCluster
        assert rig.proxy.server.stats().inspection_failures == len(failed)
