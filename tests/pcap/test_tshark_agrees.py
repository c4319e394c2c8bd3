"""The same capture through tshark's Kafka dissector: every PDU it decodes agrees with kinspect's frame."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict

import pytest

from tests.pcap.helpers import reassemble

pytestmark = pytest.mark.integration


def _multi(pairs):
    """JSON objects whose keys repeat (tshark writes one key per occurrence): key -> list of values."""
    out: dict = defaultdict(list)
    for key, value in pairs:
        out[key].append(value)
    return out


def _walk(node, found: dict) -> None:
    """Every scalar under every key, at any depth."""
    if isinstance(node, dict):
        for key, values in node.items():
            for value in values if isinstance(values, list) else [values]:
                if isinstance(value, (dict, list)):
                    _walk(value, found)
                else:
                    found[key].append(value)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)


def tshark_pdus(pcap, port) -> list[dict]:
    """One dict per Kafka PDU tshark decodes: the tcp ports and every field it printed (lists of strings)."""
    out = subprocess.run([shutil.which("tshark") or "tshark", "-r", str(pcap), "-d", f"tcp.port=={port},kafka",
                          "-T", "json", "-J", "tcp kafka"], capture_output=True, check=True).stdout
    pdus = []
    for packet in json.loads(out, object_pairs_hook=_multi):
        layers = packet["_source"][0]["layers"][0]
        for kafka in layers.get("kafka", []):
            fields: dict = defaultdict(list)
            _walk(kafka, fields)
            tcp = layers["tcp"][0]
            fields["srcport"] = [int(tcp["tcp.srcport"][0])]
            fields["dstport"] = [int(tcp["tcp.dstport"][0])]
            pdus.append(fields)
    return pdus


def _values(node, keys: tuple) -> set:
    found: dict = defaultdict(list)
    _walk(node, found)
    return {v for k in keys for v in found.get(k, [])}


def test_tshark_and_kinspect_agree(recorded):
    port = recorded["port"]
    flows, _, _ = reassemble(recorded["pcap"], [port])
    # kinspect's records per (client port, direction), in stream order.
    ours: dict = defaultdict(list)
    for got in flows.values():
        frames = [r for r in got.records if "offset" in r]  # not the flow's closing notes
        for record in sorted(frames, key=lambda r: (r["direction"], r["offset"])):
            ours[(got.client_port, record["direction"])].append(record)
    theirs: dict = defaultdict(list)
    for pdu in tshark_pdus(recorded["pcap"], port):
        direction = "request" if pdu["dstport"][0] == port else "response"
        client = pdu["srcport"][0] if direction == "request" else pdu["dstport"][0]
        theirs[(client, direction)].append(pdu)
    compared = bodies = 0
    for key, pdus in theirs.items():
        records = ours[key]
        by_corr = defaultdict(list)
        for record in records:
            by_corr[(record.get("correlation_id"), record["size"])].append(record)
        for pdu in pdus:
            if "kafka.correlation_id" not in pdu or "kafka.len" not in pdu:
                continue  # a PDU tshark could not get through
            size, corr = int(pdu["kafka.len"][0]), int(pdu["kafka.correlation_id"][0])
            matches = by_corr.get((corr, size))
            assert matches, f"{key}: tshark's PDU (correlation id {corr}, {size} bytes) is not among kinspect's frames"
            record = matches.pop(0)
            compared += 1
            if "api_key" not in record:
                # Unpaired (Tansu answers Produce acks=0; the session does not pair it): no api to compare.
                assert record["error"]["kind"] == "unpaired_response", record
                continue
            if "kafka.api_key" in pdu:
                assert int(pdu["kafka.api_key"][0]) == record["api_key"], (key, corr)
            version = pdu.get("kafka.api_version") or pdu.get("kafka.response.version")
            if version:
                assert int(version[0]) == record["api_version"], (key, corr)
            if "kafka.unsupported_api_version" in pdu or "_ws.malformed" in pdu or "kafka.truncated_content" in pdu:
                continue  # tshark 4.0 does not decode this version's body: nothing to compare
            body = record.get("body") or {}
            if "kafka.client_id" in pdu and record["direction"] == "request":
                assert pdu["kafka.client_id"][0] == (record["client_id"] or ""), (key, corr)
            if "kafka.topic_name" in pdu:
                assert set(pdu["kafka.topic_name"]) <= _values(body, ("Name", "Topic", "TopicName")) | {""}, \
                    (key, corr, pdu["kafka.topic_name"])
                bodies += 1
            if "kafka.partition_id" in pdu:
                assert {int(v) for v in pdu["kafka.partition_id"]} <= _values(
                    body, ("PartitionIndex", "PartitionIndexes", "Partition", "PartitionId", "Index", "Partitions")), \
                    (key, corr, record["api_name"], body)
            if "kafka.error" in pdu:
                assert {int(v) for v in pdu["kafka.error"]} <= _values(body, ("ErrorCode",)), (key, corr)
                bodies += 1
            if "kafka.required_acks" in pdu:
                assert int(pdu["kafka.required_acks"][0]) == body["Acks"], (key, corr)
            if "kafka.timeout" in pdu and "TimeoutMs" in body:
                assert int(pdu["kafka.timeout"][0]) == body["TimeoutMs"], (key, corr)
    assert compared >= 200 and bodies >= 50, (compared, bodies)
