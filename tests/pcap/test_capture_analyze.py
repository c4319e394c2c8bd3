"""`kinspect capture --pcap` of the three-client recording, then `kinspect analyze` over what it wrote."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from kinspect.cli.main import main
from tests.pcap.helpers import reassemble

pytestmark = pytest.mark.integration


def test_capture_then_analyze(recorded, spark, tmp_path, capsys):
    from kinspect.analyze.job import analyze

    out = tmp_path / "captures"
    assert main(["capture", "--pcap", str(recorded["pcap"]), "--port", str(recorded["port"]), "--out", str(out)]) == 0
    capsys.readouterr()
    rows = pq.read_table(out).to_pylist()
    flows, _, decoded = reassemble(recorded["pcap"], [recorded["port"]])
    requests = sum(1 for f in flows.values() for r in f.records if r["direction"] == "request" and "api_key" in r)
    unanswered = sum(1 for f in flows.values() for r in f.records if "unanswered" in r)
    assert len(rows) == requests - unanswered  # a row per exchange: answered, or acks=0
    assert all(r["latency_us"] == round((r["response_time"] - r["request_time"]).total_seconds() * 1e6)
               for r in rows if r["response_time"] is not None)

    result = analyze(spark, [str(out)], str(tmp_path / "report"), top=20)
    summary = result.tables["summary"][0]
    assert summary["exchanges"] == len(rows)
    clients = {r["client_id"] for r in result.tables["top_clients"]}
    assert {"pcap-confluent", "pcap-kafka-python", "pcap-aiokafka"} <= clients
    topics = {r["topic"] for r in result.tables["top_topics"]}
    assert {"pcap.confluent_kafka", "pcap.kafka_python", "pcap.aiokafka"} <= topics
    assert result.tables["latency"] and (tmp_path / "report" / "report.html").exists()
