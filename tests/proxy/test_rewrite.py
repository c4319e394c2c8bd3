"""Address rewriting: every response kind that names brokers, and the held-frame stream."""

from __future__ import annotations

import random
import struct

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.session import ConnectionInfo, Plan, Problem, Session
from kinspect.session.address_rewrite import AddressRewrite, NodeMap, carries_addresses, rewrite_response

NODES = NodeMap("kinspect.local", port_base=20000, ports={7: 29999})
ENDPOINTS = [{"NodeId": 1, "Host": "broker-1.internal", "Port": 9092, "Rack": None},
             {"NodeId": 7, "Host": "broker-7.internal", "Port": 9093, "Rack": "r7"}]


def _roundtrip(codec: Codec, api_key: int, version: int, body: dict):
    frame = codec.encode_response(api_key, version, {"CorrelationId": 5}, body)
    new, seen = rewrite_response(codec, frame, api_key, version, NODES)
    return codec.decode_response(_joined(new), api_key, version).body, seen


def test_metadata_brokers(codec):
    body = {"ThrottleTimeMs": 0, "Brokers": ENDPOINTS, "ClusterId": "c", "ControllerId": 1, "Topics": []}
    out, seen = _roundtrip(codec, 3, 12, body)
    assert [(b["NodeId"], b["Host"], b["Port"]) for b in out["Brokers"]] == [(1, "kinspect.local", 20001),
                                                                          (7, "kinspect.local", 29999)]
    assert seen == [(1, "broker-1.internal", 9092), (7, "broker-7.internal", 9093)]
    assert out["Brokers"][1]["Rack"] == "r7" and out["ClusterId"] == "c"


def test_find_coordinator_single_and_array(codec):
    single = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "NodeId": 7, "Host": "b7", "Port": 1}
    out, _ = _roundtrip(codec, 10, 3, single)
    assert (out["Host"], out["Port"]) == ("kinspect.local", 29999)
    array = {"ThrottleTimeMs": 0, "Coordinators": [
        {"Key": "g1", "NodeId": 1, "Host": "b1", "Port": 1, "ErrorCode": 0, "ErrorMessage": None},
        {"Key": "g2", "NodeId": -1, "Host": "", "Port": -1, "ErrorCode": 15, "ErrorMessage": "not available"}]}
    out, _ = _roundtrip(codec, 10, 6, array)
    assert [(c["Host"], c["Port"]) for c in out["Coordinators"]] == [("kinspect.local", 20001), ("", -1)]


def test_describe_cluster(codec):
    body = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "EndpointType": 1, "ClusterId": "c",
            "ControllerId": 1, "Brokers": [{"BrokerId": 1, "Host": "b1", "Port": 9092, "Rack": None,
                                             "IsFenced": False}], "ClusterAuthorizedOperations": 0}
    out, _ = _roundtrip(codec, 60, 2, body)
    assert (out["Brokers"][0]["Host"], out["Brokers"][0]["Port"]) == ("kinspect.local", 20001)


def test_kip951_node_endpoints_in_produce_and_fetch(codec):
    produce = {"Responses": [], "ThrottleTimeMs": 0, "NodeEndpoints": ENDPOINTS}
    out, _ = _roundtrip(codec, 0, 10, produce)
    assert [(e["Host"], e["Port"]) for e in out["NodeEndpoints"]] == [("kinspect.local", 20001), ("kinspect.local", 29999)]
    fetch = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [], "NodeEndpoints": ENDPOINTS,
             UNKNOWN_TAGS: [(9, b"keep")]}
    out, _ = _roundtrip(codec, 1, 16, fetch)
    assert out["NodeEndpoints"][0]["Port"] == 20001 and out[UNKNOWN_TAGS] == [(9, b"keep")]


def test_responses_without_addresses_are_left_byte_for_byte(codec):
    produce = {"Responses": [], "ThrottleTimeMs": 0}
    frame = codec.encode_response(0, 10, {"CorrelationId": 5}, produce)
    assert rewrite_response(codec, frame, 0, 10, NODES) == (frame, [])
    already = {"ThrottleTimeMs": 0, "Brokers": [{"NodeId": 1, "Host": "kinspect.local", "Port": 20001, "Rack": None}],
               "ClusterId": None, "ControllerId": 1, "Topics": []}
    frame = codec.encode_response(3, 12, {"CorrelationId": 5}, already)
    assert rewrite_response(codec, frame, 3, 12, NODES)[0] is frame


def test_which_responses_are_held():
    assert carries_addresses(3, 0) and carries_addresses(10, 0) and carries_addresses(60, 0)
    assert carries_addresses(0, 10) and not carries_addresses(0, 9)
    assert carries_addresses(1, 16) and not carries_addresses(1, 15)
    assert carries_addresses(78, 0) and carries_addresses(79, 0)
    assert not carries_addresses(1, 16, node_endpoints=False) and carries_addresses(3, 12, node_endpoints=False)
    assert not carries_addresses(18, 3)


def _rewriting_session(codec, transform=None) -> Session:
    plan = Plan(False, transform or AddressRewrite(codec, NODES))
    return Session(codec, ConnectionInfo(1, "127.0.0.1:1", "b:9092"), plan=plan)


def _ask(codec, session, api_key, version, correlation_id, body):
    header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id, "ClientId": "c"}
    frame = codec.encode_request(header, body)
    session.client_data(struct.pack(">i", len(frame)) + frame, 1.0)


def test_stream_holds_only_planned_frames_in_any_chunking(codec):
    metadata = codec.encode_response(3, 12, {"CorrelationId": 2}, {
        "ThrottleTimeMs": 0, "Brokers": ENDPOINTS, "ClusterId": "c", "ControllerId": 1, "Topics": []})
    versions = {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}
    first = codec.encode_response(18, 3, {"CorrelationId": 1}, versions)
    last = codec.encode_response(18, 3, {"CorrelationId": 3}, versions)
    stream = b"".join(struct.pack(">i", len(f)) + f for f in (first, metadata, last))
    expected_metadata, _ = rewrite_response(codec, metadata, 3, 12, NODES)
    expected = b"".join(struct.pack(">i", len(f)) + f for f in (first, expected_metadata, last))
    rng = random.Random(3)
    for _ in range(50):
        session = _rewriting_session(codec)
        _ask(codec, session, 18, 3, 1, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"})
        _ask(codec, session, 3, 12, 2, {"Topics": None, "AllowAutoTopicCreation": True,
                                         "IncludeTopicAuthorizedOperations": False})
        _ask(codec, session, 18, 3, 3, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"})
        out, events, pos = [], [], 0
        while pos < len(stream):
            step = rng.randint(1, 40)
            forward, new = session.broker_data(stream[pos : pos + step], 2.0)
            out += forward
            events += new
            pos += step
        assert b"".join(out) == expected
        assert not [e for e in events if isinstance(e, Problem)] and session.inflight == 0
        # Observers see the broker's frames as it sent them.
        assert [e.size for e in events if type(e).__name__ == "Response"] == [len(first), len(metadata), len(last)]


def test_a_response_that_cannot_be_rewritten_goes_on_unchanged(codec):
    session = _rewriting_session(codec)
    _ask(codec, session, 3, 12, 2, {"Topics": None, "AllowAutoTopicCreation": True,
                                     "IncludeTopicAuthorizedOperations": False})
    garbage = struct.pack(">i", 2) + b"\xff\xff\xff"
    forward, events = session.broker_data(struct.pack(">i", len(garbage)) + garbage, 2.0)
    assert b"".join(forward) == struct.pack(">i", len(garbage)) + garbage
    problems = [e for e in events if isinstance(e, Problem)]
    assert problems and problems[0].kind == "transform_failed" and "could not rewrite" in problems[0].detail


def test_share_group_responses(codec):
    share_fetch = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "AcquisitionLockTimeoutMs": 1000,
                   "Responses": [], "NodeEndpoints": ENDPOINTS}
    out, _ = _roundtrip(codec, 78, 2, share_fetch)
    assert [e["Port"] for e in out["NodeEndpoints"]] == [20001, 29999]
    share_ack = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Responses": [], "NodeEndpoints": ENDPOINTS}
    version = codec.registry.versions(79, "response")[-1]
    out, _ = _roundtrip(codec, 79, version, share_ack)
    assert [e["Host"] for e in out["NodeEndpoints"]] == ["kinspect.local"] * 2


# -- KIP-951 NodeEndpoints: only the root tag section is rewritten (issue 12)

def _joined(out) -> bytes:
    return b"".join(bytes(piece) for piece in out) if type(out) is tuple else bytes(out)


@pytest.mark.parametrize("api_key, versions", [(0, range(10, 14)), (1, range(16, 19))])
def test_node_endpoints_splice_equals_the_whole_rewrite(codec, api_key, versions):
    """The splice (scan, then the tag section alone) sends the same bytes as decoding and encoding the
    whole response, for every version, with records, unknown tags and nodes that stay or move."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kinspect.session.address_rewrite import _rewrite_decoded
    from tests.spec_values import struct_value

    endpoint = st.fixed_dictionaries({"NodeId": st.integers(-1, 9), "Host": st.sampled_from(["b1", "kinspect.local"]),
                                      "Port": st.sampled_from([9092, 20001]), "Rack": st.none() | st.just("r")})

    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        version = data.draw(st.sampled_from(list(versions)))
        compiled = codec.body(api_key, "response", version)
        body = data.draw(struct_value(compiled.spec.struct, version, True))
        body["NodeEndpoints"] = data.draw(st.lists(endpoint, min_size=1, max_size=3))
        frame = codec.encode_response(api_key, version, {"CorrelationId": 3}, body)
        spliced, seen = rewrite_response(codec, frame, api_key, version, NODES)
        whole, seen_whole = _rewrite_decoded(codec, frame, api_key, version, NODES)
        assert _joined(spliced) == bytes(whole) and seen == seen_whole
        if type(spliced) is tuple:  # the bytes before the tag section went out as they came, not copied
            assert spliced[0].obj is frame

    check()


def test_node_endpoints_moved_go_out_as_two_pieces_through_the_session(codec):
    fetch = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "NodeEndpoints": ENDPOINTS,
             "Responses": [{"TopicId": b"\x01" * 16, "Partitions": [
                 {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1, "LastStableOffset": 1,
                  "LogStartOffset": 0, "AbortedTransactions": None, "PreferredReadReplica": -1,
                  "Records": b"r" * 5000}]}]}
    frame = codec.encode_response(1, 16, {"CorrelationId": 5}, fetch)
    out, seen = rewrite_response(codec, frame, 1, 16, NODES)
    assert type(out) is tuple and len(out) == 2 and len(out[0]) > 5000  # the records stay in the first piece
    new = codec.decode_response(_joined(out), 1, 16).body
    assert [(e["Host"], e["Port"]) for e in new["NodeEndpoints"]] == [("kinspect.local", 20001), ("kinspect.local", 29999)]
    assert new["Responses"] == codec.decode_response(frame, 1, 16).body["Responses"]
    assert [s[0] for s in seen] == [1, 7]


# ----------------------------------------------------------------------------- ApiVersions capped

def _api_versions(codec: Codec, version: int, ranges: dict[int, tuple[int, int]], error: int = 0) -> bytes:
    body = {"ErrorCode": error, "ThrottleTimeMs": 0,
            "ApiKeys": [{"ApiKey": k, "MinVersion": lo, "MaxVersion": hi} for k, (lo, hi) in ranges.items()]}
    return codec.encode_response(18, version, {"CorrelationId": 9}, body)


def _offered(codec: Codec, frame, version: int) -> dict[int, tuple[int, int]]:
    body = codec.decode_response(_joined(frame), 18, version).body
    return {k["ApiKey"]: (k["MinVersion"], k["MaxVersion"]) for k in body["ApiKeys"]}


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_offer_fetch_up_to_the_cap(codec, version):
    """Fetch v16 added NodeEndpoints: clients offered v15 at most never get a Fetch response to hold."""
    rewrite = AddressRewrite(codec, NODES, fetch_max_version=15)
    broker = {0: (3, 11), 1: (4, 17), 3: (0, 12), 18: (0, 4)}
    frame = _api_versions(codec, version, broker)
    assert rewrite.wants(18, version) and rewrite.wants(1, 16) and not rewrite.wants(1, 15)
    out = rewrite.apply(frame, 18, version)
    assert _offered(codec, out, version) == {**broker, 1: (4, 15)}  # only Fetch's highest version moved
    other = codec.decode_response(_joined(out), 18, version)
    assert other.header == codec.decode_response(frame, 18, version).header
    # a broker that offers no more than the cap: its frame goes on as it came (not even re-encoded)
    within = _api_versions(codec, version, {1: (4, 15), 18: (0, 4)})
    assert rewrite.apply(within, 18, version) is within
    # never below the broker's own lowest version
    assert _offered(codec, rewrite.apply(_api_versions(codec, version, {1: (16, 17)}), 18, version), version) == {
        1: (16, 16)}
    # the same answer on another connection (another correlation id): remembered, not decoded again
    again = frame[:3] + b"\x63" + frame[4:]
    assert rewrite.apply(again, 18, version) == out[:3] + b"\x63" + out[4:]
    assert rewrite.apply(within[:3] + b"\x63" + within[4:], 18, version) == within[:3] + b"\x63" + within[4:]


def test_api_versions_kip511_fallback_body_is_capped_at_v0(codec):
    """A broker that does not know the client's ApiVersions version answers with a v0 body (KIP-511)."""
    rewrite = AddressRewrite(codec, NODES, fetch_max_version=15)
    fallback = _api_versions(codec, 0, {1: (4, 17), 18: (0, 3)}, error=35)  # UNSUPPORTED_VERSION
    out = rewrite.apply(fallback, 18, 4)
    assert _offered(codec, out, 0) == {1: (4, 15), 18: (0, 3)}


def test_no_cap_leaves_api_versions_alone(codec):
    rewrite = AddressRewrite(codec, NODES, fetch_max_version=0)
    assert not rewrite.wants(18, 3) and rewrite.wants(1, 16) and rewrite.version_caps == {}
    with pytest.raises(ValueError, match="fetch_max_version"):
        AddressRewrite(codec, NODES, fetch_max_version=-1)


def test_a_session_sends_the_capped_api_versions_and_reports_the_brokers(codec):
    """The client gets the capped offer; observers see what the broker said."""
    rewrite = AddressRewrite(codec, NODES, fetch_max_version=15)
    session = Session(codec, ConnectionInfo(1, "c:1", "b:1"), plan=Plan(True, rewrite))
    request = codec.encode_request({"RequestApiKey": 18, "RequestApiVersion": 3, "CorrelationId": 9, "ClientId": "x"},
                                   {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"})
    session.client_data(struct.pack(">i", len(request)) + request, 1.0)
    frame = _api_versions(codec, 3, {1: (4, 17), 18: (0, 4)})
    out = session.broker_data(struct.pack(">i", len(frame)) + frame, 1.1)
    sent = b"".join(bytes(chunk) for chunk in out.forward)
    assert struct.unpack_from(">i", sent)[0] == len(sent) - 4
    assert _offered(codec, sent[4:], 3) == {1: (4, 15), 18: (0, 4)}
    responses = [e for e in out.events if type(e).__name__ == "Response"]
    assert len(responses) == 1 and bytes(responses[0].frame) == bytes(frame)


def test_a_brokers_api_versions_answer_is_capped_once(codec, monkeypatch):
    """Every connection gets the broker's same answer: decoded and encoded once, then remembered."""
    from kinspect.session import address_rewrite

    calls = []
    real = address_rewrite.cap_api_versions
    monkeypatch.setattr(address_rewrite, "cap_api_versions", lambda *a: calls.append(a[2]) or real(*a))
    rewrite = AddressRewrite(codec, NODES, fetch_max_version=15)
    frame = _api_versions(codec, 3, {1: (4, 17), 18: (0, 4)})
    sent = [rewrite.apply(struct.pack(">i", n) + frame[4:], 18, 3) for n in range(5)]
    assert [struct.unpack_from(">i", s)[0] for s in sent] == list(range(5))
    assert len({s[4:] for s in sent}) == 1 and _offered(codec, sent[0], 3)[1] == (4, 15)
    assert calls == [3]  # once for the five connections
    rewrite.apply(frame, 18, 4)
    assert calls == [3, 4]  # another version is another answer


def test_a_metadata_answer_given_again_is_rewritten_once(codec, monkeypatch):
    """A client's Metadata refreshes get the same answer: rewritten once, then remembered; every
    answer still tells the proxy the brokers it names (to open their listeners)."""
    from kinspect.session import address_rewrite

    decodes = []
    real = address_rewrite.rewrite_response
    monkeypatch.setattr(address_rewrite, "rewrite_response", lambda *a: decodes.append(a[2]) or real(*a))
    told = []
    rewrite = AddressRewrite(codec, NODES, on_broker=lambda *broker: told.append(broker))
    body = {"ThrottleTimeMs": 0, "Brokers": ENDPOINTS, "ClusterId": "c", "ControllerId": 1, "Topics": []}
    frame = bytes(codec.encode_response(3, 12, {"CorrelationId": 5}, body))
    sent = [rewrite.apply(struct.pack(">i", n) + frame[4:], 3, 12) for n in range(4)]
    assert [struct.unpack_from(">i", s)[0] for s in sent] == list(range(4))
    expected, _ = real(codec, frame, 3, 12, NODES)
    assert all(s[4:] == bytes(expected)[4:] for s in sent)
    assert decodes == [3]  # once for the four answers
    assert told == [(1, "broker-1.internal", 9092), (7, "broker-7.internal", 9093)] * 4
    # an answer that names no broker to move goes on as it came, remembered as such
    plain = bytes(codec.encode_response(3, 12, {"CorrelationId": 5}, {**body, "Brokers": []}))
    assert rewrite.apply(plain, 3, 12) is plain and rewrite.apply(plain, 3, 12) is plain
    assert decodes == [3, 3]
