"""Capture rows: varint arithmetic, the encoding analysis against hand computation, compact sizes against the codec.

Rows are built as the capture builds them (facts taken from the events' scans on the
event loop, rows and Arrow columns in the writer) and compared with the reference
builder (tests/support/reference_rows.py: decode again, walk the body) on every recorded
conversation and on generated messages of every api and version.
"""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings

from kinspect.capture.batch import BatchBuilder
from kinspect.capture.facts import FactsTaker
from kinspect.capture.schema import COLUMN_NAMES, arrow_schema
from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import UnknownApiError
from kinspect.protocol.wire.primitives import write_uvarint, zigzag_encode
from kinspect.session.facts import request_header_tags, response_header_facts
from kinspect.session.events import ConnectionInfo, Exchange, Request, Response, frame_bytes
from tests.spec_values import struct_value
from tests.support.proxy_harness import record_batch as records_batch
from tests.support.reference_rows import RowBuilder as ReferenceRowBuilder
from tests.support.sample_data import trimmed
from tests.support.varint_sizes import uvarint_size, zigzag_size

METADATA = 3


# ----------------------------------------------------------------------------- helpers


def exchange(codec: Codec, request_frame: bytes, response_frame: bytes | None, *, response_version: int | None = None,
             complete: bool = True, latency: float = 0.0025, size: int | None = None) -> Exchange:
    """An Exchange as a session would emit it, from two frames (without their size prefixes)."""
    conn = ConnectionInfo(7, "127.0.0.1:5555", "broker:9092", node_id=111)
    header = codec.decode_request_header(request_frame)
    name = codec.registry.api_name(header.api_key)
    known = codec.registry.message(header.api_key, "request", header.api_version) is not None
    request = Request(conn, 100.0, 0, header, name, known, *request_header_tags(request_frame, header),
                      size or len(request_frame), request_frame, complete, codec)
    if response_frame is None:
        return Exchange(request, None, None)
    version = header.api_version if response_version is None else response_version
    try:
        hv = codec.response_header_version(header.api_key, header.api_version)
    except UnknownApiError:
        hv = 0
    response = Response(conn, 100.0 + latency, 0, header.api_key, name, known, version, header.api_version,
                        header.correlation_id, hv, *response_header_facts(response_frame, hv), len(response_frame),
                        response_frame, complete, codec)
    return Exchange(request, response, latency)


def req(codec: Codec, api_key: int, version: int, body: dict, correlation_id: int = 5, client_id: str = "rows") -> bytes:
    return codec.encode_request({"RequestApiKey": api_key, "RequestApiVersion": version,
                                 "CorrelationId": correlation_id, "ClientId": client_id}, body)


def resp(codec: Codec, api_key: int, version: int, body: dict, correlation_id: int = 5) -> bytes:
    return codec.encode_response(api_key, version, {"CorrelationId": correlation_id}, body)


SCHEMA = arrow_schema()
_TIMES = ("request_time", "response_time")


def _plain(rows: list[dict]) -> list[dict]:
    """Rows as Arrow gives them back (timestamps as integer microseconds again); integer fields by location and path."""
    for row in rows:
        for name in _TIMES:
            if row[name] is not None:
                row[name] = round(row[name].timestamp() * 1_000_000)
        row["integer_fields"] = sorted(row["integer_fields"], key=lambda f: (f["location"], f["path"]))
    return rows


class FactsRows:
    """Rows the way the capture makes them: facts on the event loop, then a record batch of them in the writer."""

    def __init__(self, codec: Codec, wall_offset: float) -> None:
        self.take = FactsTaker(codec).take
        self.batches = BatchBuilder(wall_offset, codec.registry)

    def build_many(self, exchanges) -> list[dict]:
        return _plain(self.batches.build([self.take(x)[0] for x in exchanges]).to_pylist())

    def build(self, exchange) -> dict:
        return self.build_many([exchange])[0]


class ReferenceRows:
    """The reference rows, through the same Arrow schema (from_pylist) for a like-for-like comparison."""

    def __init__(self, codec: Codec, wall_offset: float) -> None:
        self.inner = ReferenceRowBuilder(Codec(codec.registry), wall_offset)

    def build_many(self, exchanges) -> list[dict]:
        import pyarrow as pa

        return _plain(pa.Table.from_pylist([self.inner.build(x) for x in exchanges], schema=SCHEMA).to_pylist())

    def build(self, exchange) -> dict:
        return self.build_many([exchange])[0]


@pytest.fixture(scope="module")
def builder(codec) -> FactsRows:
    return FactsRows(codec, wall_offset=1_700_000_000.0)  # the events' codec: its scans then count integers


@pytest.fixture(scope="module")
def reference() -> ReferenceRows:
    return ReferenceRows(Codec(), wall_offset=1_700_000_000.0)


def same_rows(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs):
        for name in COLUMN_NAMES:
            assert mine[name] == ref[name], (name, mine["api_name"], mine["request_version"], mine[name], ref[name])


def by_path(row: dict, location: str) -> dict:
    return {f["path"]: f for f in row["integer_fields"] if f["location"] == location}


# ----------------------------------------------------------------------------- varint sizes


@pytest.mark.parametrize("value, bits, expected", [
    (0, 32, 1), (1, 32, 1), (127, 32, 1), (128, 32, 2), (16383, 32, 2), (16384, 32, 3),
    (2**21 - 1, 32, 3), (2**21, 32, 4), (2**28 - 1, 32, 4), (2**28, 32, 5), (2**31 - 1, 32, 5),
    (-1, 32, 5), (-(2**31), 32, 5),
    (-1, 16, 3), (-(2**15), 16, 3), (2**15 - 1, 16, 3), (16383, 16, 2), (127, 16, 1),
    (-1, 64, 10), (-(2**63), 64, 10), (2**63 - 1, 64, 9), (2**56 - 1, 64, 8), (2**56, 64, 9),
    (2**35, 64, 6),
])
def test_uvarint_size_at_the_boundaries(value, bits, expected):
    assert uvarint_size(value, bits) == expected
    # and agrees with the bytes the codec's own writer produces for the two's complement
    out = bytearray()
    write_uvarint(value & ((1 << bits) - 1), out)
    assert len(out) == expected


@pytest.mark.parametrize("value, expected", [
    (0, 1), (-1, 1), (1, 1), (63, 1), (-64, 1), (64, 2), (-65, 2), (8191, 2), (-8192, 2), (8192, 3),
    (-8193, 3), (2**31 - 1, 5), (-(2**31), 5), (2**63 - 1, 10), (-(2**63), 10), (2**62 - 1, 9), (-(2**62), 9),
    (2**62, 10),
])
def test_zigzag_size_at_the_boundaries(value, expected):
    assert zigzag_size(value) == expected
    out = bytearray()
    write_uvarint(zigzag_encode(value, 64), out)
    assert len(out) == expected


def test_sizes_agree_with_the_writer_over_every_bit_length():
    for bits in (16, 32, 64):
        for n in range(bits):
            for value in (1 << n) - 1, 1 << n, -(1 << n), -(1 << n) - 1:
                if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
                    continue
                out = bytearray()
                write_uvarint(value & ((1 << bits) - 1), out)
                assert uvarint_size(value, bits) == len(out), (bits, value)
                out = bytearray()
                write_uvarint(zigzag_encode(value, bits), out)
                assert zigzag_size(value) == len(out), (bits, value)


def test_values_out_of_range_are_refused():
    with pytest.raises(ValueError, match="int16"):
        uvarint_size(-(2**15) - 1, 16)
    with pytest.raises(ValueError, match="32 bits"):
        uvarint_size(2**32, 32)


# ----------------------------------------------------------------------------- the hand-computed check


def metadata_response_v12() -> dict:
    def partition(error, index, leader, epoch, replicas, isr, offline):
        return {"ErrorCode": error, "PartitionIndex": index, "LeaderId": leader, "LeaderEpoch": epoch,
                "ReplicaNodes": replicas, "IsrNodes": isr, "OfflineReplicas": offline}

    return {
        "ThrottleTimeMs": 0,
        "Brokers": [{"NodeId": 1, "Host": "b1", "Port": 9092, "Rack": None},
                    {"NodeId": 1000, "Host": "b2", "Port": 19092, "Rack": "r"}],
        "ClusterId": "c", "ControllerId": 1,
        "Topics": [
            {"ErrorCode": 0, "Name": "alpha", "TopicId": uuid.UUID(int=1), "IsInternal": False,
             "TopicAuthorizedOperations": -(2**31), "Partitions": [
                 partition(0, 0, 1, -1, [1, 1000, 2**31 - 1], [1], []),
                 partition(6, 1, 1000, 63, [1000], [1000], [-1]),
                 partition(0, 2, -1, 64, [], [], []),
             ]},
            {"ErrorCode": 0, "Name": "beta", "TopicId": uuid.UUID(int=2), "IsInternal": False,
             "TopicAuthorizedOperations": -(2**31), "Partitions": [
                 partition(0, 127, 16383, 8191, [16383], [16383], []),
                 partition(0, 128, 16384, 8192, [16384, 1], [16384], []),
                 partition(-1, 0, -(2**31), -65, [], [], [-(2**31)]),
             ]},
        ],
    }


def expect(field: dict, count: int, fixed: int, uvarint: int, zigzag: int, uhist: dict, zhist: dict) -> None:
    assert (field["count"], field["fixed_bytes"], field["uvarint_bytes"], field["zigzag_bytes"]) == \
        (count, fixed, uvarint, zigzag), field["path"]
    # Schema version 3 leaves a histogram's trailing zero counts out.
    assert field["uvarint_hist"] == trimmed([uhist.get(n, 0) for n in range(1, 11)]), field["path"]
    assert field["zigzag_hist"] == trimmed([zhist.get(n, 0) for n in range(1, 11)]), field["path"]


def test_encoding_analysis_of_a_metadata_response_matches_hand_computation(codec, builder):
    request = req(codec, METADATA, 12, {"Topics": None, "AllowAutoTopicCreation": False,
                                        "IncludeTopicAuthorizedOperations": False})
    row = builder.build(exchange(codec, request, resp(codec, METADATA, 12, metadata_response_v12())))
    assert row["response_decode_error"] is None
    fields = by_path(row, "response")
    assert by_path(row, "request") == {}  # the request has no integer fields (its ints are in the header)
    assert all(f["type"] == "int32" for p, f in fields.items() if not p.endswith("ErrorCode"))

    # PartitionIndex 0, 1, 2, 127, 128, 0 (int32)
    #   fixed: 6 x 4; uvarint: 128 takes 2 bytes, the rest 1 -> 5 + 2
    #   zigzag: 0->0, 1->2, 2->4, 127->254 (2 bytes), 128->256 (2 bytes), 0 -> 1+1+1+2+2+1
    expect(fields["Topics.Partitions.PartitionIndex"], 6, 6 * 4, 5 * 1 + 2, 1 + 1 + 1 + 2 + 2 + 1,
           {1: 5, 2: 1}, {1: 4, 2: 2})
    # LeaderId 1, 1000, -1, 16383, 16384, -2^31
    #   uvarint: 1 | 2 (1000 < 2^14) | 5 (-1 is 0xFFFFFFFF) | 2 | 3 (2^14) | 5 (0x80000000)
    #   zigzag:  2->1 | 2000->2 | 1->1 | 32766->3 | 32768->3 | 2^32-1->5
    expect(fields["Topics.Partitions.LeaderId"], 6, 24, 1 + 2 + 5 + 2 + 3 + 5, 1 + 2 + 1 + 3 + 3 + 5,
           {1: 1, 2: 2, 3: 1, 5: 2}, {1: 2, 2: 1, 3: 2, 5: 1})
    # LeaderEpoch -1, 63, 64, 8191, 8192, -65
    #   uvarint: 5 | 1 | 1 | 2 | 2 | 5 (negatives fill all 32 bits)
    #   zigzag: 1->1 | 126->1 | 128->2 | 16382->2 | 16384->3 | 129->2
    expect(fields["Topics.Partitions.LeaderEpoch"], 6, 24, 5 + 1 + 1 + 2 + 2 + 5, 1 + 1 + 2 + 2 + 3 + 2,
           {1: 2, 2: 2, 5: 2}, {1: 2, 2: 3, 3: 1})
    # ErrorCode (int16) 0, 6, 0, 0, 0, -1: fixed 6 x 2; -1 as uint16 0xFFFF takes 3 bytes; zigzag(-1) = 1
    expect(fields["Topics.Partitions.ErrorCode"], 6, 6 * 2, 5 * 1 + 3, 6 * 1, {1: 5, 3: 1}, {1: 6})
    assert fields["Topics.Partitions.ErrorCode"]["type"] == "int16"
    # ReplicaNodes 1, 1000, 2^31-1, 1000, 16383, 16384, 1
    #   uvarint: 1 + 2 + 5 + 2 + 2 + 3 + 1; zigzag: 1 + 2 + 5 (2^32-2) + 2 + 3 + 3 + 1
    expect(fields["Topics.Partitions.ReplicaNodes"], 7, 7 * 4, 1 + 2 + 5 + 2 + 2 + 3 + 1, 1 + 2 + 5 + 2 + 3 + 3 + 1,
           {1: 2, 2: 3, 3: 1, 5: 1}, {1: 2, 2: 2, 3: 2, 5: 1})
    # IsrNodes 1, 1000, 16383, 16384
    expect(fields["Topics.Partitions.IsrNodes"], 4, 16, 1 + 2 + 2 + 3, 1 + 2 + 3 + 3, {1: 1, 2: 2, 3: 1},
           {1: 1, 2: 1, 3: 2})
    # OfflineReplicas -1, -2^31: both 5 as unsigned; zigzag 1 and 5
    expect(fields["Topics.Partitions.OfflineReplicas"], 2, 8, 5 + 5, 1 + 5, {5: 2}, {1: 1, 5: 1})
    # TopicAuthorizedOperations -2^31 twice
    expect(fields["Topics.TopicAuthorizedOperations"], 2, 8, 10, 10, {5: 2}, {5: 2})
    # Brokers: NodeId 1, 1000; Port 9092 (2 bytes, zigzag 18184: 3), 19092 (3, zigzag 38184: 3)
    expect(fields["Brokers.NodeId"], 2, 8, 1 + 2, 1 + 2, {1: 1, 2: 1}, {1: 1, 2: 1})
    expect(fields["Brokers.Port"], 2, 8, 2 + 3, 3 + 3, {2: 1, 3: 1}, {3: 2})
    expect(fields["ThrottleTimeMs"], 1, 4, 1, 1, {1: 1}, {1: 1})
    expect(fields["ControllerId"], 1, 4, 1, 1, {1: 1}, {1: 1})
    expect(fields["Topics.ErrorCode"], 2, 4, 2, 2, {1: 2}, {1: 2})
    assert set(fields) == {"ThrottleTimeMs", "Brokers.NodeId", "Brokers.Port", "ControllerId", "Topics.ErrorCode",
                           "Topics.TopicAuthorizedOperations", "Topics.Partitions.ErrorCode",
                           "Topics.Partitions.PartitionIndex", "Topics.Partitions.LeaderId",
                           "Topics.Partitions.LeaderEpoch", "Topics.Partitions.ReplicaNodes",
                           "Topics.Partitions.IsrNodes", "Topics.Partitions.OfflineReplicas"}

    # The rest of the row.
    assert row["error_codes"] == [{"code": -1, "name": "UNKNOWN_SERVER_ERROR", "count": 1},
                                  {"code": 6, "name": "NOT_LEADER_OR_FOLLOWER", "count": 1}]
    assert row["topic_partitions"] == [{"topic": "alpha", "partitions": 3}, {"topic": "beta", "partitions": 3}]
    assert row["flexible"] is True and row["request_compact_size"] is None and row["response_compact_size"] is None
    assert row["first_flexible_version"] == 9
    assert row["response_header_version"] == 1 and row["response_header_size"] == 5
    assert row["latency_us"] == 2500 and row["response_time"] - row["request_time"] == 2500
    assert row["request_time"] == (1_700_000_000 + 100) * 1_000_000
    assert (row["connection_id"], row["client_address"], row["broker"], row["node_id"], row["client_id"]) == \
        (7, "127.0.0.1:5555", "broker:9092", 111, "rows")


def test_the_same_metadata_at_v8_has_fixed_widths_and_a_compact_size(codec, builder):
    body = metadata_response_v12()
    for topic in body["Topics"]:
        del topic["TopicId"]
    body["ClusterAuthorizedOperations"] = 0
    request = req(codec, METADATA, 8, {"Topics": None, "AllowAutoTopicCreation": False,
                                       "IncludeClusterAuthorizedOperations": False,
                                       "IncludeTopicAuthorizedOperations": False})
    response = resp(codec, METADATA, 8, body)
    row = builder.build(exchange(codec, request, response))
    assert row["flexible"] is False and row["first_flexible_version"] == 9
    # Request: header v1 -> v2 adds one tag byte; body: Topics null (int32 -1 -> one byte 0: -3),
    # plus one tag section (+1): 4 + 2 + 2 + 1... computed as frame size + 1 - 3 + 1.
    assert row["request_compact_size"] == len(request) + 1 - 3 + 1
    # Response: header v0 -> v1 (+1). Brokers array 4 -> 1 (-3); per broker: Host "bN" 2 -> 1 (-1), Rack null
    # 2 -> 1 (-1) or "r" 2 -> 1 (-1), tag section +1: -1 each; ClusterId 2 -> 1 (-1); Topics 4 -> 1 (-3);
    # per topic: Name 2 -> 1 (-1), Partitions 4 -> 1 (-3), tag +1: -3 each; per partition: three arrays
    # 4 -> 1 (-9), tag +1: -8 each (6 partitions); body tag section +1.
    expected = len(response) + 1 + (-3) + 2 * (-1) + (-1) + (-3) + 2 * (-3) + 6 * (-8) + 1
    assert row["response_compact_size"] == expected
    # and that is what the codec really writes at v9
    body9 = metadata_response_v12()
    for topic in body9["Topics"]:
        del topic["TopicId"]
    body9["ClusterAuthorizedOperations"] = 0
    assert len(resp(codec, METADATA, 9, body9)) == expected


# ----------------------------------------------------------------------------- compact size against the codec


def _signature(struct_spec, version):
    return tuple(
        (f.name, f.type, version in f.nullable_versions, f.encoding_at(version),
         _signature(f.struct, version) if f.struct else None)
        for f in struct_spec.fields if version in f.versions and version not in f.tagged_versions
    )


def _same_field_pairs(codec: Codec) -> list[tuple[int, str, int]]:
    """(api key, direction, F) where the first flexible version F has exactly the fields of F - 1."""
    reg = codec.registry
    pairs = []
    for key in reg.api_keys():
        for direction in ("request", "response"):
            versions = reg.versions(key, direction)
            if not versions:
                continue
            flexible = reg.message(key, direction, versions[-1]).flexible_versions
            if flexible.empty or flexible.low == 0:
                continue
            f = flexible.low
            old, new = reg.message(key, direction, f - 1), reg.message(key, direction, f)
            if old is not None and new is not None and _signature(old.struct, f - 1) == _signature(new.struct, f):
                pairs.append((key, direction, f))
    return pairs


PAIRS = _same_field_pairs(Codec())


def test_there_are_many_same_field_pairs_to_check(codec):
    names = {codec.registry.api_name(k) for k, _, _ in PAIRS}
    assert len(PAIRS) >= 60 and {"Produce", "Metadata", "ApiVersions", "OffsetCommit", "JoinGroup"} <= names


@pytest.mark.parametrize("key, direction, flexible", PAIRS, ids=lambda v: str(v))
def test_compact_size_equals_the_codecs_encoding_at_the_first_flexible_version(codec, builder, key, direction,
                                                                               flexible):
    spec = codec.registry.message(key, direction, flexible - 1)
    request = _minimal_request(codec, key, flexible - 1) if direction == "response" else None

    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=struct_value(spec.struct, flexible - 1, False))
    def check(body):
        if direction == "request":
            frame = req(codec, key, flexible - 1, body)
            row = builder.build(exchange(codec, frame, None))
            assert row["request_decode_error"] is None
            target = req(codec, key, flexible, body)
            assert row["request_compact_size"] == len(target), (row["request_size"], len(target))
        else:
            frame = resp(codec, key, flexible - 1, body)
            row = builder.build(exchange(codec, request, frame))
            assert row["response_decode_error"] is None
            target = resp(codec, key, flexible, body)
            assert row["response_compact_size"] == len(target), (row["response_size"], len(target))

    check()


def _minimal_request(codec: Codec, key: int, version: int) -> bytes:
    """A request frame with the simplest body the spec allows (only its version matters here)."""
    return req(codec, key, version, _minimal(codec.registry.message(key, "request", version).struct, version))


def _minimal(struct_spec, version) -> dict:
    out = {}
    for f in struct_spec.fields:
        if version not in f.versions or version in f.tagged_versions:
            continue
        if f.is_array:
            out[f.name] = []
        elif f.struct is not None:
            out[f.name] = _minimal(f.struct, version)
        else:
            out[f.name] = {"bool": False, "string": "", "uuid": uuid.UUID(int=0), "bytes": b"", "records": b"",
                           "float64": 0.0}.get(f.type, 0)
    return out


# ----------------------------------------------------------------------------- what every row carries


def test_a_produce_row_counts_records_and_compression_and_never_holds_payloads(codec, builder):
    secret = b"s3cr3t-payload-7f1c"
    batch = records_batch([secret, secret + b"2", secret + b"3"])
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
            "TopicData": [{"Name": "orders", "PartitionData": [{"Index": 0, "Records": batch},
                                                                {"Index": 1, "Records": batch}]}]}
    request = req(codec, 0, 9, body, client_id="producer-1")
    response = resp(codec, 0, 9, {"Responses": [{"Name": "orders", "PartitionResponses": [
        {"Index": 0, "ErrorCode": 0, "BaseOffset": 0, "LogAppendTimeMs": -1, "LogStartOffset": 0,
         "RecordErrors": [], "ErrorMessage": None},
        {"Index": 1, "ErrorCode": 0, "BaseOffset": 9_000_000_000, "LogAppendTimeMs": -1, "LogStartOffset": 0,
         "RecordErrors": [], "ErrorMessage": None}]}], "ThrottleTimeMs": 0})
    row = builder.build(exchange(codec, request, response))
    assert row["record_batches"] == 2 and row["record_count"] == 6
    assert row["compression"] == [{"codec": "none", "batches": 2, "records": 6, "bytes": 2 * len(batch)}]
    assert row["topic_partitions"] == [{"topic": "orders", "partitions": 2}]
    assert row["error_codes"] == []
    fields = by_path(row, "response")
    # BaseOffset (int64) 0 and 9e9: 8 + 8 fixed; 9e9 < 2^35 takes 5 bytes as uvarint, 2 x 9e9 < 2^35: 5 as zigzag
    base = fields["Responses.PartitionResponses.BaseOffset"]
    assert (base["type"], base["fixed_bytes"], base["uvarint_bytes"], base["zigzag_bytes"]) == ("int64", 16, 1 + 5, 1 + 5)
    # LogAppendTimeMs -1 as int64: 10 bytes unsigned, 1 as zigzag
    assert fields["Responses.PartitionResponses.LogAppendTimeMs"]["uvarint_hist"][9] == 2
    assert by_path(row, "request")["TopicData.PartitionData.Index"]["count"] == 2
    assert secret not in repr(row).encode()


def test_a_frame_that_does_not_decode_still_gives_a_row(codec, builder):
    request = req(codec, METADATA, 12, {"Topics": None, "AllowAutoTopicCreation": False,
                                        "IncludeTopicAuthorizedOperations": False})
    response = resp(codec, METADATA, 12, metadata_response_v12())[:-7]  # cut inside the last topic
    row = builder.build(exchange(codec, request, response))
    assert row["request_decode_error"] is None
    assert "Metadata response v12" in row["response_decode_error"]
    assert row["response_size"] == len(response)
    assert [f for f in row["integer_fields"] if f["location"] == "response"] == []
    assert row["error_codes"] == [] and row["response_tag_section_bytes"] == 1  # the header's section only


def test_rows_of_frames_too_large_to_inspect_and_of_unknown_apis(codec, builder):
    request = req(codec, METADATA, 12, {"Topics": None, "AllowAutoTopicCreation": False,
                                        "IncludeTopicAuthorizedOperations": False})
    row = builder.build(exchange(codec, request[:16], None, complete=False, size=5_000_000))
    assert row["request_inspected"] is False and "inspection limit" in row["request_decode_error"]
    assert row["request_size"] == 5_000_000 and row["integer_fields"] == [] and row["request_compact_size"] is None
    assert row["request_header_size"] == 8 + 2 + len("rows") + 1

    unknown = struct.pack(">hhih", 9999, 0, 42, 3) + b"abc" + b"\x00\x01"
    row = builder.build(exchange(codec, unknown, struct.pack(">i", 42) + b"\x00"))
    assert row["api_name"] is None and "api key 9999" in row["request_decode_error"]
    assert row["first_flexible_version"] is None and row["flexible"] is False
    assert row["response_size"] == 5 and "api key 9999" in row["response_decode_error"]


def test_an_acks0_produce_row_has_no_response(codec, builder):
    body = {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1000,
            "TopicData": [{"Name": "t", "PartitionData": [{"Index": 0, "Records": records_batch([b"x"])}]}]}
    row = builder.build(exchange(codec, req(codec, 0, 7, body), None))
    assert row["response_time"] is None and row["latency_us"] is None and row["response_size"] is None
    assert row["record_count"] == 1 and row["response_compact_size"] is None
    assert row["request_compact_size"] is not None  # v7 is not flexible; Produce is from v9


def _recorded_exchanges(codec: Codec) -> list[Exchange]:
    from kinspect.session import Session
    from tests.session.test_real_traffic import CONNECTIONS

    out = []
    for n, requests in enumerate(CONNECTIONS):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        session = Session(codec, ConnectionInfo(n, "c:1", "b:2"))
        events = session.client_data(requests.read_bytes(), 1.0).events + session.broker_data(responses.read_bytes(), 1.5).events
        out += [e for e in events if type(e) is Exchange]
    return out


def test_rows_of_all_recorded_traffic_equal_the_reference_rows(codec, builder, reference):
    exchanges = _recorded_exchanges(codec)
    rows = builder.build_many(exchanges)
    same_rows(rows, reference.build_many(exchanges))
    # and they say something: integers, topics, tagged fields, records, compact sizes
    assert sum(len(r["integer_fields"]) for r in rows) > 1000
    assert sum(len(r["topic_partitions"]) for r in rows) > 50
    assert sum(len(r["tagged_fields"]) for r in rows) > 20
    assert sum(r["record_batches"] for r in rows) > 10
    assert sum(r["request_compact_size"] is not None for r in rows) > 20


def test_rows_of_all_recorded_traffic_fit_the_schema(codec, builder):
    import pyarrow as pa

    exchanges = _recorded_exchanges(codec)
    rows = builder.build_many(exchanges)
    frames = [(frame_bytes(e.request.frame), frame_bytes(e.response.frame) if e.response else None) for e in exchanges]
    assert len(rows) > 200
    assert all(r["request_decode_error"] is None and r["response_decode_error"] is None for r in rows)
    table = pa.Table.from_pylist(rows, schema=arrow_schema())
    assert table.column_names == list(COLUMN_NAMES)
    produced = sum(r["record_count"] for r in rows if r["api_key"] == 0)
    assert produced > 0
    # Real frames at the version before a same-field first flexible version: re-encoded there by the
    # codec, they are exactly as long as the row's compact size says.
    checked = 0
    for row, (request, response) in zip(rows, frames):
        for direction, frame, size in (("request", request, row["request_compact_size"]),
                                       ("response", response, row["response_compact_size"])):
            if frame is None or (row["api_key"], direction, row["request_version"] + 1) not in PAIRS:
                continue
            version = row["request_version"]
            if direction == "request":
                decoded = codec.decode_request(frame)
                fields = dict(decoded.header.fields, RequestApiVersion=version + 1)
                target = codec.encode_request(fields, decoded.body, decoded.trailing)
            else:
                decoded = codec.decode_response(frame, row["api_key"], version)
                target = codec.encode_response(row["api_key"], version + 1, decoded.header, decoded.body,
                                               decoded.trailing)
            assert size == len(target), (row["api_name"], direction, version)
            checked += 1
    assert checked >= 20


def test_the_walks_inlined_sizes_agree_with_the_size_functions():
    from tests.support.field_walk import _count_ints, _Entry

    for type_name, bits in (("int16", 16), ("int32", 32), ("int64", 64)):
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        values = sorted({v for n in range(bits) for v in ((1 << n) - 1, 1 << n, -(1 << n), -(1 << n) - 1)
                         if low <= v <= high} | {low, high, 0})
        entry = _Entry("F", 0, "F", type_name, bits // 8, None, None, None, False)
        integers: dict = {}
        _count_ints(integers, entry, values)
        _, count, fixed, u, z, uh, zh = integers["F"]
        assert (count, fixed) == (len(values), len(values) * bits // 8)
        assert u == sum(uvarint_size(v, bits) for v in values)
        assert z == sum(zigzag_size(v) for v in values)
        assert uh == [sum(uvarint_size(v, bits) == n for v in values) for n in range(1, 11)]
        assert zh == [sum(zigzag_size(v) == n for v in values) for n in range(1, 11)]


def test_the_scanners_integer_counts_agree_with_the_size_functions():
    """codec_runtime.count_int(s), which the pure-Python scanner calls (the C scanner is checked against it)."""
    from array import array

    from kinspect.protocol.codec.runtime import count_int, count_ints
    from kinspect.protocol.codec.codegen import COUNTER_TYPECODE, SLOT_STRIDE

    for bits in (16, 32, 64):
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        values = sorted({v for n in range(bits) for v in ((1 << n) - 1, 1 << n, -(1 << n), -(1 << n) - 1)
                         if low <= v <= high} | {low, high, 0})
        negative = {16: 3, 32: 5, 64: 10}[bits]
        one, many = array(COUNTER_TYPECODE, [0]) * SLOT_STRIDE, array(COUNTER_TYPECODE, [0]) * SLOT_STRIDE
        for v in values:
            count_int(one, 0, v, negative, bits // 8, 0)
        count_ints(many, 0, values, negative, bits // 8, 0)
        u = [uvarint_size(v, bits) for v in values]
        z = [zigzag_size(v) for v in values]
        expected = [len(values), len(values), len(values) * bits // 8, sum(u), sum(z),
                    *[u.count(n) for n in range(1, 11)], *[z.count(n) for n in range(1, 11)]]
        assert list(one) == expected
        assert list(many) == [1, *expected[1:]]  # an array is one occurrence of its field
        # KAFKA-9927 encodings: bytes today are the zig-zag (packed) or unsigned (upacked) varint's
        packed, upacked = array(COUNTER_TYPECODE, [0]) * SLOT_STRIDE, array(COUNTER_TYPECODE, [0]) * SLOT_STRIDE
        for v in values:
            count_int(packed, 0, v, negative, 0, 0)
            count_int(upacked, 0, v, negative, -1, 10)
        assert packed[2] == sum(z)
        assert upacked[2] == sum(uvarint_size(v, 64) for v in values)


# ----------------------------------------------------------------------------- every api and version


def _cases(codec: Codec) -> list[tuple[int, str, int]]:
    reg = codec.registry
    # A response is paired with a request of its version (every response version has one in the specs).
    return [(key, direction, version) for key in reg.api_keys() for direction in ("request", "response")
            for version in reg.versions(key, direction)
            if direction == "request" or reg.message(key, "request", version) is not None]


CASES = _cases(Codec())


@pytest.mark.parametrize("key, direction, version", CASES, ids=lambda v: str(v))
def test_rows_of_generated_messages_equal_the_reference_rows(codec, builder, reference, key, direction, version):
    spec = codec.registry.message(key, direction, version)
    request = _minimal_request(codec, key, version) if direction == "response" else None

    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=struct_value(spec.struct, version, version in spec.flexible_versions))
    def check(body):
        if direction == "request":
            x = exchange(codec, req(codec, key, version, body), None)
        else:
            x = exchange(codec, request, resp(codec, key, version, body))
        ours, theirs = builder.build(x), reference.build(x)
        assert ours[f"{direction}_decode_error"] is None
        same_rows([ours], [theirs])

    check()
