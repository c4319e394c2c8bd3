"""`kinspect proxy` with `[upgrade] targets`, then `kinspect clients --from` and `--captures`, as a user runs them.

An old kafka-python (api_version (0, 10, 1)) and a current one produce through a real
`kinspect proxy` process to Tansu. /metrics, /clients and both `kinspect clients` sources
must tell the same story. (Tansu answers every ApiVersions version without error 35, so
UNSUPPORTED_VERSION counting is checked on a recorded-style exchange in test_inventory.py.)
"""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import ROOT
from tests.support.tansu import TansuBroker, free_port

pytestmark = pytest.mark.integration


def kinspect(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinspect.cli.main", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, **kwargs)


def started(proc: subprocess.Popen) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(30), "kinspect printed nothing within 30 s"
    line = proc.stdout.readline().decode()
    assert "proxy listening on" in line, line
    return line


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def samples(text: str, name: str) -> list:
    family = name.removesuffix("_total")  # the parser names counter families without _total
    return [s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples
            if not s.name.endswith("_created")]


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_proxy_clients_endpoint_metrics_and_the_clients_command(tmp_path: Path):
    from kafka import KafkaProducer

    listen, metrics_port = free_port(), free_port()
    captures = tmp_path / "captures"
    config = tmp_path / "kinspect.toml"
    config.write_text(f"""
[proxy]
listen = "127.0.0.1:{listen}"
[metrics]
listen = "127.0.0.1:{metrics_port}"
[capture]
enabled = true
directory = "{captures}"
[upgrade]
targets = ["4.3.1"]
""")
    base = f"http://127.0.0.1:{metrics_port}"
    with TansuBroker(advertised_port=listen) as tansu:
        log = open(tmp_path / "kinspect.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "kinspect.cli.main", "proxy", "--config", str(config),
                                 "--upstream", tansu.bootstrap], cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
        log.close()
        try:
            started(proc)
            bootstrap = f"127.0.0.1:{listen}"
            # acks=0: Tansu drops the connection on Produce v2, and a capture row is an exchange; an acks=0
            # produce is one without waiting for its (never coming) response.
            old = KafkaProducer(bootstrap_servers=bootstrap, api_version=(0, 10, 1), client_id="legacy-billing",
                                request_timeout_ms=2000, retries=0, max_block_ms=5000, acks=0)
            old.send("upgrade-cli", b"old")
            current = KafkaProducer(bootstrap_servers=bootstrap, client_id="orders")
            current.send("upgrade-cli", b"new").get(timeout=20)
            current.close()

            def incompatible():
                text = get(f"{base}/metrics").decode()
                return [s for s in samples(text, "kinspect_upgrade_incompatible_requests_total")
                        if s.labels == {"target": "4.3.1", "api": "Produce", "version": "2", "software": "unknown"}]
            assert wait_for(incompatible)[0].value >= 1
            old.close(timeout=1)
            text = get(f"{base}/metrics").decode()
            assert samples(text, "kinspect_unsupported_version_responses_total") == []
            connections = {s.labels["software"]: s.value for s in samples(text, "kinspect_client_connections_total")}
            assert connections.get("kafka-python", 0) >= 1 and connections.get("unknown", 0) >= 2

            document = json.loads(get(f"{base}/clients"))
            assert document["targets"] == ["4.3.1"]
            legacy = [c for c in document["clients"] if c["client_ids"] == ["legacy-billing"]]
            assert legacy and [(r["api"], r["version"], r["reason"]) for r in legacy[0]["rejected"]["4.3.1"]] == \
                [("Produce", 2, "api version removed")]
            orders = [c for c in document["clients"] if c["client_ids"] == ["orders"]]
            assert orders[0]["software_name"] == "kafka-python" and orders[0]["rejected"]["4.3.1"] == []

            table = kinspect("clients", "--from", base)
            assert table.returncode == 0, table.stderr
            lines = table.stdout.splitlines()
            assert "REJECTED BY 4.3.1" in lines[0]
            legacy_line = [line for line in lines if "legacy-billing" in line]
            assert len(legacy_line) == 1 and legacy_line[0].rstrip().endswith("Produce v2: api version removed")
            assert [line for line in lines if " orders " in line][0].rstrip().endswith("ok")
            older = kinspect("clients", "--from", base, "--target", "3.9.2", "--json")
            assert older.returncode == 0, older.stderr
            assert all(c["rejected"]["3.9.2"] == [] for c in json.loads(older.stdout)["clients"])
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    # The capture files the proxy wrote tell the same story, read without the proxy.
    from_files = kinspect("clients", "--captures", str(captures), "--target", "4.3.1", "--json")
    assert from_files.returncode == 0, from_files.stderr
    clients = json.loads(from_files.stdout)["clients"]
    legacy = [c for c in clients if c["client_ids"] == ["legacy-billing"]]
    assert [(r["api"], r["version"]) for r in legacy[0]["rejected"]["4.3.1"]] == [("Produce", 2)]
    produce = [r for r in legacy[0]["requests"] if r["api"] == "Produce"]
    assert produce and produce[0]["version"] == 2 and produce[0]["record_magics"] == [1]
    orders = [c for c in clients if c["client_ids"] == ["orders"]]
    assert orders[0]["software_name"] == "kafka-python" and orders[0]["rejected"]["4.3.1"] == []
