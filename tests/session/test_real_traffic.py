"""Recorded conversations of three real clients with a real broker: every frame decodes and re-encodes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinspect.offline_decode import DecodeStats, decode_conversation
from kinspect.protocol.codec import Codec
from kinspect.protocol.framing.framer import split_frames
from tests.support.framers import whole_framer
from tests.support.paths import TRAFFIC

CLIENTS = ["confluent_kafka", "kafka_python", "aiokafka"]
CONNECTIONS = sorted(TRAFFIC.glob("*/*.requests.bin"))


def test_fixtures_are_present():
    for client in CLIENTS:
        assert len(list((TRAFFIC / client).glob("*.requests.bin"))) >= 10, client


@pytest.mark.parametrize("requests", CONNECTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_frame_decodes_and_reencodes_byte_exactly(codec: Codec, requests: Path):
    responses = requests.with_name(requests.name.replace("requests", "responses"))
    stats = DecodeStats()
    records = list(decode_conversation(codec, requests.read_bytes(), responses.read_bytes(), roundtrip=True, stats=stats))
    assert stats.errors == []
    assert stats.decode_errors == 0, [r["error"] for r in records if r.get("error")]
    assert stats.roundtrip_mismatches == 0, [r for r in records if not r.get("roundtrip", {}).get("identical", True)]
    assert all(r["roundtrip"]["identical"] for r in records)
    n_requests = len(split_frames(requests.read_bytes())[0])
    n_responses = len(split_frames(responses.read_bytes())[0])
    assert len(records) == n_requests + n_responses
    json.dumps(records)  # the decode command's output is plain JSON


@pytest.mark.parametrize("client", CLIENTS)
def test_apis_of_the_workload_are_covered(codec: Codec, client: str):
    seen = set()
    for path in (TRAFFIC / client).glob("*.requests.bin"):
        for _, frame in split_frames(path.read_bytes())[0]:
            header = codec.decode_request_header(frame)
            seen.add(codec.registry.api_name(header.api_key))
    for api in ("ApiVersions", "Metadata", "Produce", "Fetch", "FindCoordinator", "JoinGroup", "SyncGroup",
                "OffsetCommit", "OffsetFetch", "CreateTopics", "DeleteTopics", "InitProducerId"):
        assert api in seen, (client, api)


def _frames_of(client: str, api_name: str, codec: Codec):
    for path in sorted((TRAFFIC / client).glob("*.requests.bin")):
        for _, frame in split_frames(path.read_bytes())[0]:
            request = codec.decode_request(frame)
            if request.api_name == api_name:
                yield request


def test_produce_batches_carry_every_codec(codec: Codec):
    from kinspect.protocol.records import summarize_records

    for client in CLIENTS:
        codecs = set()
        for request in _frames_of(client, "Produce", codec):
            for topic in request.body["TopicData"]:
                for partition in topic["PartitionData"]:
                    summary = summarize_records(partition["Records"])
                    codecs.update(b.compression for b in summary.batches)
        assert {"none", "gzip", "snappy", "lz4", "zstd"} <= codecs, client


def test_acks_zero_and_transactions_are_recorded(codec: Codec):
    acks = {r.body["Acks"] for c in CLIENTS for r in _frames_of(c, "Produce", codec)}
    assert {0, -1} <= acks
    assert any(True for _ in _frames_of("confluent_kafka", "EndTxn", codec))
    assert any(True for _ in _frames_of("kafka_python", "AddPartitionsToTxn", codec))


@pytest.mark.parametrize("client", CLIENTS)
def test_scan_agrees_with_full_decode(codec: Codec, client: str):
    """The scanner's topics and error codes are what the full decode shows."""
    for path in sorted((TRAFFIC / client).glob("*.requests.bin")):
        for _, frame in split_frames(path.read_bytes())[0]:
            request = codec.decode_request(frame)
            body = codec.body(request.header.api_key, "request", request.header.api_version)
            result = codec.scan_request(frame, request.header)
            assert result.trailing_bytes == len(request.trailing)
            expected_topics = set(_strings_named(request.body, body.spec.struct))
            assert result.topics == expected_topics


def _strings_named(value, struct):
    for f in struct.fields:
        if f.name not in value or value[f.name] is None:
            continue
        item = value[f.name]
        if f.entity_type == "topicName" and f.element_type == "string":
            yield from (item if f.is_array else [item])
        elif f.struct is not None:
            for x in item if f.is_array else [item]:
                yield from _strings_named(x, f.struct)


@pytest.mark.parametrize("client", CLIENTS)
def test_framer_fed_one_byte_at_a_time_and_whole(client: str):
    path = sorted((TRAFFIC / client).glob("*.responses.bin"))[1]
    data = path.read_bytes()
    whole = whole_framer().feed(data)
    framer = whole_framer()
    one_by_one = [f for i in range(len(data)) for f in framer.feed(data[i : i + 1])]
    assert whole == one_by_one == [f for _, f in split_frames(data)[0]]
    assert framer.buffered == 0
