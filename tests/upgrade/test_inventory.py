"""The inventory from recorded conversations and hostile input: sessions, the observer, capture rows, `kinspect clients`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kinspect.analyze.inputs import check_capture_file
from kinspect.capture.facts import FactsTaker
from kinspect.capture.batch import BatchBuilder
from kinspect.capture.schema import ADDED_IN, METADATA_VERSION_KEY, SCHEMA_VERSION, arrow_schema
from kinspect.cli.main import main
from kinspect.observers.inventory import METRIC_NAMES, InventoryObserver
from kinspect.observers.metrics import MetricsObserver
from kinspect.protocol.framing.framer import split_frames
from kinspect.session.client_software import MAX_CHARS, sanitize
from kinspect.session import Session
from kinspect.session.events import ConnectionInfo, Exchange
from kinspect.upgrade.inventory import Inventory
from kinspect.upgrade.targets import load_target
from tests.support.paths import TRAFFIC

CLIENTS = ["kafka_python", "aiokafka", "confluent_kafka"]
TARGETS = ["4.3.1", "3.9.2"]


# ----------------------------------------------------------------------------- helpers


def feed(session: Session, requests: bytes, responses: bytes, observers, now: float = 1.0) -> list:
    """Feed a conversation frame by frame, each request before its response (as a proxy sees it)."""
    events = []
    req_frames, _ = split_frames(requests)
    resp_frames, _ = split_frames(responses)
    by_id = {int.from_bytes(f[:4], "big", signed=True): f for _, f in resp_frames}
    for _, frame in req_frames:
        events += session.client_data(struct.pack(">i", len(frame)) + frame, now).events
        correlation_id = int.from_bytes(frame[4:8], "big", signed=True)
        answer = by_id.get(correlation_id)
        if answer is not None:
            events += session.broker_data(struct.pack(">i", len(answer)) + answer, now + 0.001).events
        now += 0.01
    events += session.close(now)
    for event in events:
        for observer in observers:
            observer.on_event(event)
    return events


def api_versions_v3(name: bytes, version: bytes, correlation_id: int = 1, client_id: bytes = b"hostile") -> bytes:
    """An ApiVersions v3 request frame (size prefix included) naming its software, bytes as given."""
    def compact(data: bytes) -> bytes:
        n, out = len(data) + 1, bytearray()
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out) + data
    body = struct.pack(">hhih", 18, 3, correlation_id, len(client_id)) + client_id + b"\x00"
    body += compact(name) + compact(version) + b"\x00"
    return struct.pack(">i", len(body)) + body


def api_versions_error_35(correlation_id: int) -> bytes:
    """KIP-511's answer to a version the broker lacks: header v0, a v0 body with error 35 and its own versions."""
    body = struct.pack(">ih", correlation_id, 35) + struct.pack(">i", 1) + struct.pack(">hhh", 18, 0, 4)
    return struct.pack(">i", len(body)) + body


def metric_samples(registry) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        out.setdefault(family.name, []).extend(s for s in family.samples if not s.name.endswith("_created"))
    return out


@pytest.fixture(scope="module")
def recorded(codec):
    """Every recorded conversation through sessions, one inventory observer and the capture's row builder."""
    metrics = MetricsObserver()
    observer = InventoryObserver([load_target(t) for t in TARGETS], label_overflow=metrics.label_overflow,
                                 api_name=codec.registry.api_name)
    metrics.registry.register(observer.collector())
    builder, facts = BatchBuilder(1_790_000_000.0, codec.registry), FactsTaker(codec)
    rows = []
    connection_id = 0
    for client in CLIENTS:
        for requests in sorted((TRAFFIC / client).glob("*.requests.bin")):
            connection_id += 1
            info = ConnectionInfo(connection_id, f"10.0.{CLIENTS.index(client)}.1:{40000 + connection_id}", "tansu:9092")
            responses = requests.with_name(requests.name.replace("requests", "responses"))
            events = feed(Session(codec, info), requests.read_bytes(), responses.read_bytes(), [metrics, observer])
            rows += builder.build([facts.take(e)[0] for e in events if isinstance(e, Exchange)]).to_pylist()
    return observer, metrics, rows


# ----------------------------------------------------------------------------- sanitize


def test_sanitize_escapes_and_truncates():
    assert sanitize("apache-kafka-java") == "apache-kafka-java"
    assert sanitize(b"evil\x1b[31m\n\x00") == "evil\\x1b[31m\\n\\x00"
    assert sanitize(b"bad\xff\xfeutf8") == "bad\\xff\\xfeutf8"
    assert sanitize("line\u2028sep\x85") == "line\\u2028sep\\x85"
    assert sanitize("admin\u202egnp.exe\u200b") == "admin\\u202egnp.exe\\u200b"  # bidi override, zero width
    long = sanitize(b"A" * 65536)
    assert long == "A" * MAX_CHARS + "…"
    escaped = sanitize(b"\xff" * 65536)
    assert len(escaped) <= MAX_CHARS + 1 and escaped.endswith("…") and escaped.startswith("\\xff")
    assert sanitize("é" * 64) == "é" * 64 and sanitize("é" * 65) == "é" * 64 + "…"


def test_hostile_software_names_are_escaped_truncated_and_capped(codec):
    metrics = MetricsObserver(max_unknown_series=20)
    observer = InventoryObserver([load_target("4.3.1")], max_unknown_series=20,
                                 label_overflow=metrics.label_overflow, api_name=codec.registry.api_name)
    metrics.registry.register(observer.collector())
    hostile = [(b"ctl\x1b]0;pwned\x07\r\n", b"1.0\x00"), (b"x" * 65536, b"v" * 65536), (b"\xc3\x28\xff", b"\xed\xa0\x80")]
    names = hostile + [(f"client-{i}".encode(), b"1") for i in range(300)]
    for i, (name, version) in enumerate(names):
        info = ConnectionInfo(i, f"127.0.0.1:{20000 + i}", "b:9092")
        session = Session(codec, info)
        events = session.client_data(api_versions_v3(name, version, i), 1.0).events
        for e in events:
            observer.on_event(e)
        assert info.client_software_name == sanitize(name) and info.client_software_version == sanitize(version)
    conns = {(r.software_name, r.software_version) for r in observer.inventory.records()}
    assert ("ctl\\x1b]0;pwned\\x07\\r\\n", "1.0\\x00") in conns
    assert ("x" * MAX_CHARS + "…", "v" * MAX_CHARS + "…") in conns
    assert ("\\xc3(\\xff", "\\xed\\xa0\\x80") in conns
    samples = metric_samples(metrics.registry)
    connections = samples["kinspect_client_connections"]
    assert len(connections) == 21  # 20 distinct (software, version) series, then "other"
    other = [s for s in connections if s.labels["software"] == "other"]
    assert other[0].value == len(names) - 20 and other[0].labels["software_version"] == "other"
    assert all(len(v) <= MAX_CHARS + 1 for s in connections for v in s.labels.values())
    assert all(v.isprintable() for s in connections for v in s.labels.values())
    overflow = {s.labels["metric"]: s.value for s in samples["kinspect_label_overflow"]}
    assert overflow["kinspect_client_requests_total"] == len(names) - 20
    json.dumps(observer.clients_json())


def test_unsupported_version_responses_are_counted_per_software(codec):
    observer = InventoryObserver()
    info = ConnectionInfo(1, "127.0.0.1:1", "b:9092")
    session = Session(codec, info)
    first = session.client_data(api_versions_v3(b"future-client", b"9.0", 1), 1.0).events
    events = first + session.broker_data(api_versions_error_35(1), 1.1).events
    for e in events:
        observer.on_event(e)
    registry_samples = {tuple(m.samples[0].labels.items()): m.samples[0].value
                        for m in observer.collector().collect() if m.name == "kinspect_unsupported_version_responses"}
    assert registry_samples == {(("software", "future-client"),): 1}
    assert observer.clients_json()["clients"][0]["unsupported_version_responses"] == 1


def test_the_least_recently_seen_connection_is_forgotten_first(codec):
    """At most max_connections records: requests from interleaved connections keep theirs recent."""
    observer = InventoryObserver(max_connections=2)
    sessions = {name: Session(codec, ConnectionInfo(i, f"10.0.0.{i}:1000", "b:9092"))
                for i, name in enumerate("ABC", 1)}
    for step, name in enumerate("ABABAC"):  # C arrives when B was seen less recently than A
        for e in sessions[name].client_data(api_versions_v3(name.encode(), b"1", step), float(step)).events:
            observer.on_event(e)
    records = observer.inventory.records()
    assert [r.address for r in records] == ["10.0.0.1:1000", "10.0.0.3:1000"]  # A, then C (the newest)
    assert observer.inventory.forgotten == 1
    assert [sum(r.requests.values()) for r in records] == [3, 1]
    counted = {s.labels["software"]: s.value for m in observer.collector().collect() for s in m.samples
               if m.name == "kinspect_client_connections"}
    assert counted == {"A": 1, "B": 1, "C": 1}


# ----------------------------------------------------------------------------- recorded traffic


def test_recorded_clients_are_named_and_current(recorded):
    observer, metrics, _ = recorded
    doc = observer.clients_json()
    for index, client in enumerate(CLIENTS):
        manifest = json.loads((TRAFFIC / client / "manifest.json").read_text())["client"]
        mine = [c for c in doc["clients"] if c["host"] == f"10.0.{index}.1"]
        named = [c for c in mine if c["software_name"] != "unknown"]
        if client == "aiokafka":
            assert named == []  # aiokafka sends ApiVersions v0: no KIP-511 name
        else:
            expect = {"kafka_python": "kafka-python", "confluent_kafka": "confluent-kafka-python"}[client]
            assert {c["software_name"] for c in named} == {expect}
            assert all(c["software_version"].startswith(manifest["version"]) for c in named)
        for c in mine:
            assert c["rejected"]["4.3.1"] == [], (client, c["rejected"]["4.3.1"])
            produce = [r for r in c["requests"] if r["api"] == "Produce"]
            assert all(r["record_magics"] == [2] for r in produce)
    assert {c["host"] for c in doc["clients"]} == {f"10.0.{i}.1" for i in range(len(CLIENTS))}
    samples = metric_samples(metrics.registry)
    assert samples.get("kinspect_upgrade_incompatible_requests", []) == []
    requests = sum(s.value for s in samples["kinspect_client_requests"])
    assert requests == sum(r for c in doc["connections"] for r in (x["count"] for x in c["requests"]))


def test_capture_rows_carry_software_and_magics_and_rebuild_the_same_inventory(recorded, codec):
    observer, _, rows = recorded
    produce = [r for r in rows if r["api_key"] == 0]
    assert produce and all(r["record_magics"] == [2] for r in produce if r["record_batches"])
    assert all(r["record_magics"] == [] for r in rows if r["api_key"] != 0)
    assert {r["client_software_name"] for r in rows} == {None, "kafka-python", "confluent-kafka-python"}
    schema = arrow_schema()
    table = pa.Table.from_pylist(rows, schema=schema)
    assert table.schema.metadata[METADATA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    rebuilt = Inventory.from_rows(table.to_pylist(), codec.registry.api_name)
    targets = [load_target(t) for t in TARGETS]
    live = {(c["software_name"], c["software_version"], tuple(c["client_ids"]), c["host"]):
            (c["requests"], c["rejected"]) for c in observer.clients_json()["clients"]}
    again = {(c["software_name"], c["software_version"], tuple(c["client_ids"]), c["host"]):
             (c["requests"], c["rejected"]) for c in rebuilt.to_json(targets)["clients"]}
    assert again == live


def _write(rows: list, path: Path, version: int = SCHEMA_VERSION) -> Path:
    schema = arrow_schema()
    table = pa.Table.from_pylist(rows, schema=schema)
    if version == 1:
        table = table.drop_columns(list(ADDED_IN)).replace_schema_metadata({METADATA_VERSION_KEY: b"1"})
        table = table.set_column(0, "schema_version", pa.array([1] * len(rows), pa.int16()))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_kinspect_clients_from_captures_prints_the_table(recorded, tmp_path, capsys):
    _, _, rows = recorded
    _write(rows, tmp_path / "caps" / "capture-20261122T000000Z-000001.parquet")
    assert main(["clients", "--captures", str(tmp_path / "caps"), "--target", "4.3.1", "--target", "3.9.2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["SOFTWARE", "VERSION", "CLIENT", "IDS"]
    assert "REJECTED BY 4.3.1" in out[0] and "REJECTED BY 3.9.2" in out[0]
    body = out[1:]
    assert {line.split()[0] for line in body} == {"confluent-kafka-python", "kafka-python", "unknown"}
    assert all(line.rstrip().endswith("ok  ok") or line.rstrip().endswith("ok") for line in body)
    assert main(["clients", "--captures", str(tmp_path / "caps"), "--target", "4.3.1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["targets"] == ["4.3.1"] and len(doc["clients"]) == len(body)
    kp = [c for c in doc["clients"] if c["software_name"] == "kafka-python"]
    assert kp and any(r["api"] == "Produce" for c in kp for r in c["requests"])


def test_v1_capture_files_still_read(recorded, tmp_path, capsys):
    _, _, rows = recorded
    path = _write(rows, tmp_path / "v1" / "capture-20261101T000000Z-000001.parquet", version=1)
    assert check_capture_file(path) == 1
    assert main(["clients", "--captures", str(path.parent), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {c["software_name"] for c in doc["clients"]} == {"unknown"}
    assert sum(c["connections"] for c in doc["clients"]) == len({r["connection_id"] for r in rows})


def test_hostile_strings_in_captures_are_shown_escaped(recorded, tmp_path, capsys):
    _, _, rows = recorded
    evil = dict(rows[0], client_software_name="evil\x1b[2J" + "A" * 70000, client_id="id\nnext", connection_id=999)
    _write([evil], tmp_path / "evil" / "capture-20261101T000000Z-000001.parquet")
    assert main(["clients", "--captures", str(tmp_path / "evil")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and len(out.splitlines()) == 2
    prefix = "evil\\x1b[2J"
    assert prefix + "A" * (MAX_CHARS - len(prefix)) + "…" in out and "id\\nnext" in out


@pytest.mark.parametrize("argv, message", [
    (["--captures", "/nonexistent/caps"], "no such file or directory"),
    (["--captures", "{tmp}", "--target", "9.9.9"], "unknown upgrade target '9.9.9'"),
    (["--captures", "{tmp}"], "no capture files"),
    (["--from", "ftp://example"], "is not an http://HOST:PORT address"),
    (["--from", "http://127.0.0.1:1"], "cannot read"),
])
def test_kinspect_clients_bad_input_is_one_line(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["clients", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_metric_names_are_the_contract():
    assert set(METRIC_NAMES) == {"kinspect_client_connections_total", "kinspect_client_requests_total",
                                 "kinspect_upgrade_incompatible_requests_total",
                                 "kinspect_unsupported_version_responses_total"}


def test_an_unknown_configured_target_is_a_one_line_error(tmp_path, capsys):
    config = tmp_path / "kinspect.toml"
    config.write_text('[upgrade]\ntargets = ["5.0.0"]\n')
    assert main(["proxy", "--config", str(config), "--upstream", "127.0.0.1:9"]) == 2
    out = capsys.readouterr()
    said = out.out + out.err  # the proxy command prints its start-up errors on stdout
    assert "unknown upgrade target '5.0.0'" in said and said.count("\n") == 1 and "Traceback" not in said
    config.write_text('[upgrade]\ntargets = "4.3.1"\n')
    assert main(["proxy", "--config", str(config)]) == 2
    assert "upgrade.targets must be list[str]" in capsys.readouterr().err
