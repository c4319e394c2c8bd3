"""Real clients forced to old protocols, through kinspect to Tansu: flagged against 4.3.1 with the right versions.

Each client produces and consumes through a passthrough kinspect whose inventory observer
checks against 4.3.1 and 3.9.2. Tansu refuses some of the old versions (it closes the
connection): the clients are then not required to succeed, only kinspect to see and
classify what they sent. What a target rejects is checked against validVersions read
straight from the JSON spec files, and against the pairs the session's own event log saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kinspect.observers.inventory import InventoryObserver
from kinspect.session import Request
from kinspect.upgrade.targets import load_target
from tests.support.paths import ROOT
from tests.support.proxy_harness import ProxyHarness
from tests.support.tansu import TansuBroker, free_port

pytestmark = pytest.mark.integration

OLD_AIOKAFKA = ROOT / ".venv" / "aiokafka-0.12.0"
PRODUCE, FETCH = 0, 1


def spec_range(release: str, api_key: int) -> tuple[int, int] | None:
    """validVersions of an api's request in a shipped release, read from the JSON file itself."""
    for file in (ROOT / "specs" / release).glob("*Request.json"):
        text = "\n".join(line.split("//")[0] for line in file.read_text("utf-8").splitlines())
        doc = json.loads(text)
        if doc.get("apiKey") == api_key and doc.get("type") == "request":
            low, _, high = doc["validVersions"].partition("-")
            return int(low), int(high or low)
    return None


def rejected_by_spec(release: str, pairs: set[tuple[int, int]], magics: dict) -> set[tuple[int, int]]:
    out = set()
    for api_key, version in pairs:
        span = spec_range(release, api_key)
        if span is None or not span[0] <= version <= span[1]:
            out.add((api_key, version))
        elif api_key == PRODUCE and min(magics.get((api_key, version), {2})) < 2 and spec_range(release, 0)[0] >= 3:
            out.add((api_key, version))
    return out


@pytest.fixture(scope="module")
def rig():
    listen = free_port()
    observer = InventoryObserver([load_target("4.3.1"), load_target("3.9.2")])
    with TansuBroker(advertised_port=listen) as tansu:  # follow-up connections come through kinspect
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen}",
                              "proxy.upstream": tansu.bootstrap}, observers=(observer,))
        observer.inventory.api_name = proxy.codec.registry.api_name
        with proxy:
            yield proxy, observer, f"127.0.0.1:{listen}"


def client_view(proxy, observer, client_id: str) -> dict:
    doc = proxy.run(observer.clients_json)
    mine = [c for c in doc["clients"] if c["client_ids"] == [client_id]]
    assert len(mine) == 1, [c["client_ids"] for c in doc["clients"]]
    return mine[0]


def sent_pairs(proxy, client_id: str) -> set[tuple[int, int]]:
    events = proxy.run(lambda: list(proxy.events.events))
    return {(e.api_key, e.api_version) for e in events if isinstance(e, Request) and e.header.client_id == client_id}


def wait_for(proxy, observer, client_id: str, predicate, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        doc = proxy.run(observer.clients_json)
        mine = [c for c in doc["clients"] if c["client_ids"] == [client_id]]
        if mine and predicate({(r["api_key"], r["version"]) for r in mine[0]["requests"]}):
            return mine[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{client_id}: not seen in time: {mine}")
        time.sleep(0.05)


def check_classification(proxy, observer, client_id: str, produce: tuple[int, int], also: set):
    """The client's flagged pairs against both targets equal what the spec files say, and include `also`."""
    view = client_view(proxy, observer, client_id)
    pairs = {(r["api_key"], r["version"]) for r in view["requests"]}
    assert pairs == sent_pairs(proxy, client_id)  # the inventory holds every pair the session saw
    magics = {(r["api_key"], r["version"]): set(r["record_magics"]) for r in view["requests"]}
    assert magics[(PRODUCE, produce[0])] == {produce[1]}
    flagged_new = {(r["api_key"], r["version"]) for r in view["rejected"]["4.3.1"]}
    assert flagged_new == rejected_by_spec("4.3.1", pairs, magics)
    assert {(PRODUCE, produce[0]), *also} <= flagged_new
    reasons = {(r["api_key"], r["version"]): r["reason"] for r in view["rejected"]["4.3.1"]}
    assert reasons[(PRODUCE, produce[0])] == "api version removed"
    # 3.9.2 still takes every one of these old versions and record formats.
    assert rejected_by_spec("3.9.2", pairs, magics) == set()
    assert view["rejected"]["3.9.2"] == []
    assert view["software_name"] == "unknown"  # ApiVersions v0 (or none) carries no software name
    return view


def test_kafka_python_forced_to_0_10_1(rig):
    from kafka import KafkaConsumer, KafkaProducer

    proxy, observer, bootstrap = rig
    client_id = f"kp-old-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=(0, 10, 1), client_id=client_id,
                             request_timeout_ms=2000, retries=0, max_block_ms=5000)
    future = producer.send("upgrade-kp", b"old")
    wait_for(proxy, observer, client_id, lambda pairs: (PRODUCE, 2) in pairs)
    try:
        future.get(timeout=5)
    except Exception:  # noqa: BLE001 (Tansu may refuse Produce v2 / magic 1)
        pass
    producer.close(timeout=1)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=(0, 10, 1), client_id=client_id,
                             auto_offset_reset="earliest", request_timeout_ms=3000, consumer_timeout_ms=500)
    from kafka import TopicPartition

    consumer.assign([TopicPartition("upgrade-kp", 0)])
    deadline = time.monotonic() + 20
    while not any(k == FETCH for k, _ in sent_pairs(proxy, client_id)) and time.monotonic() < deadline:
        consumer.poll(timeout_ms=200)
    consumer.close()
    # kafka-python 0.10.1: Produce v2 with magic 1 batches, Fetch v3 (4.0 removed Fetch v0-3).
    check_classification(proxy, observer, client_id, produce=(2, 1), also={(FETCH, 3)})


def test_confluent_kafka_with_api_version_request_off(rig):
    import confluent_kafka

    proxy, observer, bootstrap = rig
    client_id = f"ck-old-{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": bootstrap, "client.id": client_id, "api.version.request": False,
            "broker.version.fallback": "0.9.0", "log_level": 0, "message.timeout.ms": 3000}
    producer = confluent_kafka.Producer(conf)
    producer.produce("upgrade-ck", b"old")
    deadline = time.monotonic() + 30
    while (PRODUCE, 1) not in sent_pairs(proxy, client_id) and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.flush(0)
    consumer = confluent_kafka.Consumer({**conf, "group.id": f"g-{client_id}", "auto.offset.reset": "earliest"})
    consumer.subscribe(["upgrade-ck"])
    deadline = time.monotonic() + 30
    while not any(k == 11 for k, _ in sent_pairs(proxy, client_id)) and time.monotonic() < deadline:  # JoinGroup
        consumer.poll(0.2)
    consumer.close()
    # librdkafka with broker.version.fallback 0.9.0: Produce v1 with magic 0 messages.
    check_classification(proxy, observer, client_id, produce=(1, 0), also=set())


def test_aiokafka_with_api_version_0_10_1(rig):
    proxy, observer, bootstrap = rig
    if not (OLD_AIOKAFKA / "aiokafka").is_dir():
        pytest.fail(f"aiokafka 0.12.0 is not installed at {OLD_AIOKAFKA}: run `make test` (or "
                    f"make {OLD_AIOKAFKA.relative_to(ROOT)}/aiokafka)")
    client_id = f"aio-old-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OLD_AIOKAFKA), str(ROOT)])}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("old_aiokafka_client.py")), bootstrap,
                          "upgrade-aio", "0.10.1", client_id], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("aiokafka 0.12.0"), (out.stdout, out.stderr[-2000:])
    # aiokafka 0.12 with api_version 0.10.1: Produce v2 with magic 1 batches, Fetch v3.
    view = check_classification(proxy, observer, client_id, produce=(2, 1), also={(FETCH, 3)})
    assert (FETCH, 3) in {(r["api_key"], r["version"]) for r in view["requests"]}


@pytest.mark.parametrize("library", ["kafka-python", "confluent-kafka"])
def test_a_current_client_is_not_flagged(rig, library):
    proxy, observer, bootstrap = rig
    client_id = f"current-{library}-{uuid.uuid4().hex[:6]}"
    if library == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id)
        producer.send("upgrade-current", b"new").get(timeout=20)
        producer.close()
        expect_name = "kafka-python"
    else:
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "client.id": client_id})
        producer.produce("upgrade-current", b"new")
        assert producer.flush(20) == 0
        expect_name = "confluent-kafka-python"
    view = client_view(proxy, observer, client_id)
    assert view["software_name"] == expect_name and view["software_version"] != "unknown"
    pairs = {(r["api_key"], r["version"]) for r in view["requests"]}
    assert (PRODUCE, max(v for k, v in pairs if k == PRODUCE)) in pairs
    assert all(set(r["record_magics"]) == {2} for r in view["requests"] if r["api_key"] == PRODUCE)
    assert view["rejected"]["4.3.1"] == []
    assert rejected_by_spec("4.3.1", pairs, {}) == set()
