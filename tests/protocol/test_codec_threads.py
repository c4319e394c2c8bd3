"""One Codec shared by several threads: decoding errors diagnosed at once in each give each its own path and offset."""

from __future__ import annotations

import sys
import threading
import uuid

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError

METADATA, FETCH, API_VERSIONS = 3, 1, 18


def _frames(codec: Codec) -> list[tuple[str, bytes, int, int]]:
    """(direction, frame, api key, version) of valid messages cut at every few bytes: many distinct failures."""
    metadata = codec.encode_response(METADATA, 12, {"CorrelationId": 1}, {
        "Brokers": [{"NodeId": n, "Host": f"broker-{n}", "Port": 9092, "Rack": None} for n in range(3)],
        "ClusterId": "c", "ControllerId": 1,
        "Topics": [{"ErrorCode": 0, "Name": f"topic-{t}", "TopicId": uuid.UUID(int=t), "IsInternal": False,
                    "Partitions": [{"ErrorCode": 0, "PartitionIndex": p, "LeaderId": 1, "LeaderEpoch": 0,
                                    "ReplicaNodes": [1, 2], "IsrNodes": [1], "OfflineReplicas": []}
                                   for p in range(4)], "TopicAuthorizedOperations": 0} for t in range(3)],
    })
    # A tagged field inside (SupportedFeatures, tag 0), so that the traced tag-section path is taken.
    versions = codec.encode_response(API_VERSIONS, 3, {"CorrelationId": 2}, {
        "ErrorCode": 0, "ApiKeys": [{"ApiKey": k, "MinVersion": 0, "MaxVersion": 9} for k in range(5)],
        "ThrottleTimeMs": 0, "SupportedFeatures": [{"Name": "f", "MinVersion": 1, "MaxVersion": 2}],
    })
    fetch = codec.encode_request({"RequestApiKey": FETCH, "RequestApiVersion": 12, "CorrelationId": 3,
                                  "ClientId": "threads"}, {
        "ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20, "IsolationLevel": 0,
        "SessionId": 0, "SessionEpoch": -1, "ClusterId": "cluster",
        "Topics": [{"Topic": "t", "Partitions": [{"Partition": p, "CurrentLeaderEpoch": 0, "FetchOffset": 10,
                                                  "LastFetchedEpoch": -1, "LogStartOffset": 0,
                                                  "PartitionMaxBytes": 1024} for p in range(3)]}],
        "ForgottenTopicsData": [], "RackId": "",
    })
    out = []
    for direction, frame, key, version in (("response", metadata, METADATA, 12),
                                           ("response", versions, API_VERSIONS, 3),
                                           ("request", fetch, FETCH, 12)):
        start = 5 if direction == "response" else 0
        for cut in range(start + 9, len(frame), 3):
            out.append((direction, frame[:cut], key, version))
    # Bytes spoiled inside the tagged field (its declared size kept): failures deep in the traced tag path.
    for i in range(len(versions) - 14, len(versions) - 1):
        for value in (0x00, 0x7F, 0xFF):
            out.append(("response", versions[:i] + bytes([value]) + versions[i + 1:], API_VERSIONS, 3))
    return out


def _outcome(codec: Codec, case) -> str:
    direction, frame, key, version = case
    try:
        if direction == "request":
            codec.decode_request(frame)
        else:
            codec.decode_response(frame, key, version)
    except DecodeError as exc:
        return f"{exc} | path={exc.path} offset={exc.offset}"
    return "decoded"


def test_threads_sharing_a_codec_each_get_their_own_diagnosis():
    reference = Codec()
    cases = _frames(reference)
    expected = [_outcome(reference, c) for c in cases]
    assert sum(e != "decoded" for e in expected) > 100
    assert len(set(expected)) > 50  # failures at many different paths and offsets
    assert any("SupportedFeatures" in e for e in expected) and any("Topics[2]" in e for e in expected)

    shared = Codec(reference.registry)  # compiled on first use, from several threads at once
    mismatches: list = []
    errors: list = []
    start = threading.Barrier(6)

    def work(seed: int) -> None:
        try:
            start.wait(10)
            order = list(range(len(cases)))
            order = order[seed:] + order[:seed]  # each thread in its own order
            for _ in range(3):
                for i in order:
                    got = _outcome(shared, cases[i])
                    if got != expected[i]:
                        mismatches.append((i, got, expected[i]))
        except BaseException as exc:  # reported below, never lost in the thread
            errors.append(exc)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        threads = [threading.Thread(target=work, args=(n * 17,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(previous)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert mismatches == [], mismatches[:3]
