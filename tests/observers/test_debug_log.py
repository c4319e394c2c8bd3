"""The structlog setup and the debug log of decoded messages: what it shows, and what it never shows.

Secrets are searched for in every captured line (the structlog stream) in every form
they could leak in: raw text, hex (either case), base64 at each of the three byte
alignments, and Python's escaped repr.

Tansu 0.6.0 without --authentication answers SaslHandshake with error 33, and its users
live in its storage (not shareable with memory://), so a real SASL/PLAIN login cannot
complete: the SASL frames are built with kinspect's codec, sent through the proxy to
Tansu over a raw socket, and fed through a Session for the response-side secrets.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import random
import socket
import struct
import time
import uuid

import pytest

from kinspect.logs import configure_logging, connection_fields, reset_logging
from kinspect.observers.debug_log import DebugLog
from kinspect.observers.redaction import SECRET_FIELDS, Redactor
from kinspect.protocol.codec import Codec
from kinspect.proxy.problem_log import ProblemLog
from kinspect.session import Problem, Request
from kinspect.session import Session
from kinspect.session.events import ConnectionInfo
from tests.support.proxy_harness import ProxyHarness, recv_frame, request_frame
from tests.support.tansu import TansuBroker, free_port

SECRET_VALUE = b"TOP-SECRET-VALUE-4711"
SECRET_KEY = b"TOP-SECRET-KEY-0815"
PASSWORD = b"P4ssw0rd-xyz"
SASL_PLAIN = b"\x00alice\x00" + PASSWORD
SALT = b"SALT-s3cr3t-5a1t"
SALTED = b"SALTED-PASSWORD-91b2c"
HMAC = b"HMAC-deadbeef-token"
TOKEN_ID = "TOKEN-ID-q7w8e9"
CONFIG_PASSWORD = "keystore-pa55-!"
TIMEOUT = 20.0

_PREFIX = struct.Struct(">i")


# ----------------------------------------------------------------------------- helpers


def leak_forms(secret: bytes | str) -> list[str]:
    """Every form in which a secret could show up in a text log."""
    raw = secret.encode() if isinstance(secret, str) else secret
    forms = {raw.decode("latin-1"), raw.hex(), raw.hex().upper(), repr(raw)[2:-1]}
    for pad in range(3):
        enc = base64.b64encode(b"\x00" * pad + raw).decode()
        forms.add(enc[4:-4])  # the characters that only the secret's bytes determine
        forms.add(base64.urlsafe_b64encode(b"\x00" * pad + raw).decode()[4:-4])
    # Long enough not to match by chance.
    return [f for f in forms if len(f) >= 8]


def assert_never_logged(text: str, *secrets) -> None:
    assert text.strip(), "nothing was logged"
    for secret in secrets:
        for form in leak_forms(secret):
            assert form not in text, f"{secret!r} leaked as {form!r}"


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def events(lines: list[dict], event: str, api: str | None = None) -> list[dict]:
    return [d for d in lines if d.get("event") == event and (api is None or d.get("api") == api)]


@pytest.fixture
def log_stream():
    stream = io.StringIO()
    configure_logging("json", "DEBUG", stream)
    yield stream
    reset_logging()


def framed(frame: bytes) -> bytes:
    return _PREFIX.pack(len(frame)) + frame


class Wire:
    """A Session fed with frames built by kinspect's codec, its events handed to observers."""

    def __init__(self, codec: Codec, *observers, client_id: str = "wire-test") -> None:
        self.codec = codec
        self.conn = ConnectionInfo(7, "127.0.0.1:40000", "127.0.0.1:9092", node_id=111)
        self.session = Session(codec, self.conn)
        self.observers = observers
        self.client_id = client_id
        self.correlation = 0
        self.now = 0.0

    def _dispatch(self, evs: list) -> list:
        for e in evs:
            for o in self.observers:
                o.on_event(e)
        return evs

    def request(self, api: str, version: int, body: dict) -> int:
        self.correlation += 1
        self.now += 0.001
        key = self.codec.registry.api_key_of(api)
        frame = request_frame(self.codec, key, version, self.correlation, body, client_id=self.client_id)
        self._dispatch(self.session.client_data(frame, self.now).events)
        return self.correlation

    def response(self, api: str, version: int, correlation: int, body: dict) -> None:
        self.now += 0.001
        key = self.codec.registry.api_key_of(api)
        frame = self.codec.encode_response(key, version, {"CorrelationId": correlation}, body)
        self._dispatch(self.session.broker_data(framed(frame), self.now).events)

    def exchange(self, api: str, version: int, request: dict, response: dict) -> None:
        self.response(api, version, self.request(api, version, request), response)


# ----------------------------------------------------------------------------- configure_logging


def test_json_lines_route_stdlib_and_structlog(log_stream):
    import structlog

    conn = ConnectionInfo(3, "127.0.0.1:5000", "127.0.0.1:9092", node_id=111, client_id="cid")
    structlog.get_logger("kinspect.test").info("hello", **connection_fields(conn), n=1)
    logging.getLogger("kinspect.inspect").warning("plain %s line", "stdlib")
    logging.getLogger("kinspect.inspect").debug("debug line")
    lines = json_lines(log_stream)
    assert len(lines) == 3
    first, second, third = lines
    assert first["event"] == "hello" and first["level"] == "info" and first["logger"] == "kinspect.test"
    assert first["connection_id"] == 3 and first["client_address"] == "127.0.0.1:5000"
    assert first["client_id"] == "cid" and first["broker"] == "127.0.0.1:9092" and first["node_id"] == 111
    assert first["timestamp"].endswith("Z") and "T" in first["timestamp"]
    assert second == {**second, "event": "plain stdlib line", "level": "warning", "logger": "kinspect.inspect"}
    assert third["level"] == "debug"


def test_level_filters_and_reconfigure():
    a, b = io.StringIO(), io.StringIO()
    try:
        configure_logging("json", "WARNING", a)
        logging.getLogger("kinspect.x").info("dropped")
        logging.getLogger("kinspect.x").error("kept")
        configure_logging("json", "INFO", b)  # replaces the first handler
        logging.getLogger("kinspect.x").info("second")
    finally:
        reset_logging()
    assert [d["event"] for d in json_lines(a)] == ["kept"]
    assert [d["event"] for d in json_lines(b)] == ["second"]
    with pytest.raises(ValueError):
        configure_logging("xml")
    with pytest.raises(ValueError):
        configure_logging("json", "LOUD")


def test_problem_log_lines_are_json(log_stream):
    conn = ConnectionInfo(9, "127.0.0.1:1", "127.0.0.1:2")
    ProblemLog().on_event(Problem(conn, 0.0, "decode_error", "request", "bad bytes", api_key=3, api_version=1))
    (line,) = json_lines(log_stream)
    assert line["level"] == "warning" and line["logger"] == "kinspect.inspect"
    assert "decode_error" in line["event"] and "connection 9" in line["event"]


def test_console_format_is_readable(codec):
    stream = io.StringIO()
    try:
        configure_logging("console", "INFO", stream)
        wire = Wire(codec, DebugLog())
        wire.request("CreateTopics", 4, {"Topics": [{"Name": "console.topic", "NumPartitions": 1,
                                                     "ReplicationFactor": 1, "Assignments": [], "Configs": []}],
                                        "timeoutMs": 1000, "validateOnly": False})
        logging.getLogger("kinspect.proxy").warning("a stdlib warning")
    finally:
        reset_logging()
    text = stream.getvalue()
    lines = text.splitlines()
    assert len(lines) == 2
    assert "kafka.request" in lines[0] and "api=CreateTopics" in lines[0] and "console.topic" in lines[0]
    assert "connection_id=7" in lines[0] and "client_id=wire-test" in lines[0]
    assert "info" in lines[0] and "warning" in lines[1] and "a stdlib warning" in lines[1]
    assert not lines[0].lstrip().startswith("{")
    assert "\x1b[" not in text  # no colours on a non-terminal


# ----------------------------------------------------------------------------- real traffic


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_real_traffic_shows_fields_never_records(log_stream):
    """kafka-python through kinspect to Tansu: CreateTopics, Produce (a secret key and value), Fetch."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    topic = "dl.secret-topic"
    listen_port = free_port()
    debug = DebugLog(responses=True)
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}, observers=(debug, ProblemLog())).start()
        try:
            bootstrap = f"127.0.0.1:{listen_port}"
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="dl-admin", request_timeout_ms=10000)
            try:
                admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
            finally:
                admin.close()
            producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="dl-producer", linger_ms=5)
            try:
                producer.send(topic, key=SECRET_KEY, value=SECRET_VALUE,
                              headers=[("h", b"HEADER-SECRET-123")]).get(TIMEOUT)
                producer.flush(TIMEOUT)
            finally:
                producer.close()
            consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="dl-consumer",
                                     auto_offset_reset="earliest", enable_auto_commit=False)
            try:
                tp = TopicPartition(topic, 0)
                consumer.assign([tp])
                consumer.seek(tp, 0)
                got = []
                deadline = time.monotonic() + TIMEOUT
                while not got and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=200).values():
                        got.extend(records)
            finally:
                consumer.close()
            assert [(r.key, r.value) for r in got] == [(SECRET_KEY, SECRET_VALUE)]
            proxy.wait_idle()
            # The secret did cross kinspect (so the test means something): it is in the Produce frame.
            produce_frames = [e.frame for e in proxy.events_of(Request) if e.api_name == "Produce"]
            assert any(SECRET_VALUE in f and SECRET_KEY in f for f in produce_frames)
        finally:
            proxy.stop()

    text = log_stream.getvalue()
    lines = json_lines(log_stream)
    # Decoded fields appear.
    (create,) = events(lines, "kafka.request", "CreateTopics")
    assert json.loads(create["body"])["Topics"][0]["Name"] == topic
    assert create["client_id"] == "dl-admin" and create["connection_id"] >= 1
    assert create["client_address"].startswith("127.0.0.1:") and create["broker"] == tansu.bootstrap
    assert create["version"] >= 0 and create["correlation_id"] >= 0 and create["size"] > 0
    produces = events(lines, "kafka.request", "Produce")
    assert produces
    body = json.loads(produces[0]["body"])
    (topic_data,) = body["TopicData"]
    assert topic_data["Name"] == topic
    records = topic_data["PartitionData"][0]["Records"]
    assert records["record_count"] == 1 and records["batch_count"] == 1 and records["total_bytes"] > 0
    assert produces[0]["client_id"] == "dl-producer"
    produce_responses = events(lines, "kafka.response", "Produce")
    assert produce_responses and "latency_ms" in produce_responses[0]
    fetch_records = [
        p["Records"]
        for line in events(lines, "kafka.response", "Fetch")
        for r in json.loads(line["body"])["Responses"] for p in r["Partitions"]
        if p["Records"] and p["Records"]["record_count"]
    ]
    assert fetch_records, "no Fetch response carrying records was logged"
    assert {d["api"] for d in events(lines, "kafka.request")} >= {"ApiVersions", "Metadata", "CreateTopics",
                                                                    "Produce", "Fetch"}
    assert debug.logged["decode_failed"] == 0
    # Never a record key, value or header.
    assert_never_logged(text, SECRET_VALUE, SECRET_KEY, b"HEADER-SECRET-123")


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_sasl_through_proxy_never_logs_password(log_stream, codec):
    """SaslHandshake v1 and SaslAuthenticate v2 with a PLAIN password, through kinspect to Tansu."""
    listen_port = free_port()
    debug = DebugLog(responses=True)
    with TansuBroker(advertised_port=listen_port) as tansu:
        proxy = ProxyHarness({"proxy.mode": "passthrough", "proxy.listen": f"127.0.0.1:{listen_port}",
                              "proxy.upstream": tansu.bootstrap}, observers=(debug, ProblemLog())).start()
        try:
            with socket.create_connection(("127.0.0.1", listen_port), timeout=10) as sock:
                sock.sendall(request_frame(codec, 17, 1, 1, {"Mechanism": "PLAIN"}, client_id="sasl-client"))
                handshake = codec.decode_response(recv_frame(sock), 17, 1)
                sock.sendall(request_frame(codec, 36, 2, 2, {"AuthBytes": SASL_PLAIN}, client_id="sasl-client"))
                try:
                    sock.settimeout(5)
                    recv_frame(sock)  # Tansu may answer or hang up: the request crossed kinspect either way
                except (EOFError, OSError):
                    pass
            proxy.wait_idle()
            auth_frames = [e.frame for e in proxy.events_of(Request) if e.api_name == "SaslAuthenticate"]
            assert len(auth_frames) == 1 and PASSWORD in auth_frames[0]
        finally:
            proxy.stop()
    lines = json_lines(log_stream)
    (hs,) = events(lines, "kafka.request", "SaslHandshake")
    assert json.loads(hs["body"]) == {"Mechanism": "PLAIN"}
    assert events(lines, "kafka.response", "SaslHandshake")
    assert handshake.body["Mechanisms"] is not None
    (auth,) = events(lines, "kafka.request", "SaslAuthenticate")
    assert json.loads(auth["body"]) == {"AuthBytes": f"[redacted {len(SASL_PLAIN)} bytes]"}
    assert auth["client_id"] == "sasl-client"
    assert_never_logged(log_stream.getvalue(), PASSWORD, SASL_PLAIN)


# ----------------------------------------------------------------------------- every credential rule


def test_every_credential_rule_redacted(log_stream, codec):
    debug = DebugLog(responses=True)
    wire = Wire(codec, debug)
    wire.request("SaslHandshake", 1, {"Mechanism": "SCRAM-SHA-256"})
    wire.response("SaslHandshake", 1, 1, {"ErrorCode": 0, "Mechanisms": ["SCRAM-SHA-256", "PLAIN"]})
    wire.exchange("SaslAuthenticate", 2, {"AuthBytes": SASL_PLAIN},
                  {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"server-final-" + PASSWORD,
                   "SessionLifetimeMs": 0})
    wire.exchange("AlterUserScramCredentials", 0, {
        "Deletions": [],
        "Upsertions": [{"Name": "alice", "Mechanism": 1, "Iterations": 4096, "Salt": SALT, "SaltedPassword": SALTED}],
    }, {"Results": [{"User": "alice", "ErrorCode": 0, "ErrorMessage": None}]})
    wire.exchange("DescribeUserScramCredentials", 0, {"Users": [{"Name": "alice"}]}, {
        "ErrorCode": 0, "ErrorMessage": None, "Results": [{"User": "alice", "ErrorCode": 0, "ErrorMessage": None,
                                                           "CredentialInfos": [{"Mechanism": 1, "Iterations": 4096}]}]})
    wire.exchange("CreateDelegationToken", 3, {
        "OwnerPrincipalType": "User", "OwnerPrincipalName": "alice", "Renewers": [], "MaxLifetimeMs": -1,
    }, {"ErrorCode": 0, "PrincipalType": "User", "PrincipalName": "alice", "TokenRequesterPrincipalType": "User",
        "TokenRequesterPrincipalName": "alice", "IssueTimestampMs": 1, "ExpiryTimestampMs": 2,
        "MaxTimestampMs": 3, "TokenId": TOKEN_ID, "Hmac": HMAC, "ThrottleTimeMs": 0})
    wire.exchange("DescribeDelegationToken", 3, {"Owners": None}, {
        "ErrorCode": 0, "ThrottleTimeMs": 0, "Tokens": [{
            "PrincipalType": "User", "PrincipalName": "alice", "TokenRequesterPrincipalType": "User",
            "TokenRequesterPrincipalName": "alice", "IssueTimestamp": 1, "ExpiryTimestamp": 2, "MaxTimestamp": 3,
            "TokenId": TOKEN_ID, "Hmac": HMAC, "Renewers": []}]})
    wire.exchange("RenewDelegationToken", 2, {"Hmac": HMAC, "RenewPeriodMs": 1000},
                  {"ErrorCode": 0, "ExpiryTimestampMs": 5, "ThrottleTimeMs": 0})
    wire.exchange("ExpireDelegationToken", 2, {"Hmac": HMAC, "ExpiryTimePeriodMs": -1},
                  {"ErrorCode": 0, "ExpiryTimestampMs": 5, "ThrottleTimeMs": 0})
    wire.request("AlterConfigs", 2, {"Resources": [{"ResourceType": 4, "ResourceName": "1", "Configs": [
        {"Name": "listener.name.sasl_ssl.ssl.keystore.password", "Value": CONFIG_PASSWORD}]}],
        "ValidateOnly": False})
    wire.request("IncrementalAlterConfigs", 1, {"Resources": [{"ResourceType": 4, "ResourceName": "1", "Configs": [
        {"Name": "ssl.key.password", "ConfigOperation": 0, "Value": CONFIG_PASSWORD}]}], "ValidateOnly": False})
    lines = json_lines(log_stream)
    assert debug.logged["decode_failed"] == 0
    logged = {(d["event"].split(".")[1], d["api"]) for d in lines if d["event"].startswith("kafka.")}
    for (api, direction) in SECRET_FIELDS:
        assert (direction, api) in logged, (api, direction)

    def body(event, api):
        (line,) = events(lines, event, api)
        return json.loads(line["body"])

    assert body("kafka.request", "SaslAuthenticate")["AuthBytes"] == f"[redacted {len(SASL_PLAIN)} bytes]"
    assert body("kafka.response", "SaslAuthenticate")["AuthBytes"].startswith("[redacted ")
    (up,) = body("kafka.request", "AlterUserScramCredentials")["Upsertions"]
    assert up == {"Name": "alice", "Mechanism": 1, "Iterations": 4096, "Salt": f"[redacted {len(SALT)} bytes]",
                  "SaltedPassword": f"[redacted {len(SALTED)} bytes]"}
    described = body("kafka.response", "DescribeUserScramCredentials")["Results"][0]
    assert described["CredentialInfos"] == [{"Mechanism": 1, "Iterations": 4096}]  # no secrets: shown as is
    created = body("kafka.response", "CreateDelegationToken")
    assert created["Hmac"] == f"[redacted {len(HMAC)} bytes]" and created["TokenId"] == "[redacted]"
    assert created["PrincipalName"] == "alice"
    (token,) = body("kafka.response", "DescribeDelegationToken")["Tokens"]
    assert token["Hmac"].startswith("[redacted") and token["TokenId"] == "[redacted]"
    assert body("kafka.request", "RenewDelegationToken")["Hmac"].startswith("[redacted")
    assert body("kafka.request", "ExpireDelegationToken")["Hmac"].startswith("[redacted")
    (cfg,) = body("kafka.request", "AlterConfigs")["Resources"][0]["Configs"]
    assert cfg == {"Name": "listener.name.sasl_ssl.ssl.keystore.password", "Value": "[redacted]"}
    (icfg,) = body("kafka.request", "IncrementalAlterConfigs")["Resources"][0]["Configs"]
    assert icfg["Name"] == "ssl.key.password" and icfg["Value"] == "[redacted]"
    assert_never_logged(log_stream.getvalue(), PASSWORD, SASL_PLAIN, SALT, SALTED, HMAC, TOKEN_ID, CONFIG_PASSWORD)


def test_other_bytes_redacted_by_default_and_allow_list(codec):
    join = {"GroupId": "g", "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 10000, "MemberId": "",
            "GroupInstanceId": None, "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": b"USERDATA-private-77"}], "Reason": None}
    spec = codec.body(11, "request", 9).spec.struct
    body, _ = Redactor().render(join, spec, "JoinGroup", "request")
    assert body["Protocols"][0]["Metadata"] == "[redacted 19 bytes]" and body["GroupId"] == "g"
    allowed = Redactor([("JoinGroup", "request", "Protocols.Metadata"), ("SaslAuthenticate", "request", "AuthBytes")])
    body, _ = allowed.render(join, spec, "JoinGroup", "request")
    assert body["Protocols"][0]["Metadata"] == base64.b64encode(b"USERDATA-private-77").decode()
    # An allow-list never overrides a credential rule.
    auth, _ = allowed.render({"AuthBytes": SASL_PLAIN}, codec.body(36, "request", 2).spec.struct,
                             "SaslAuthenticate", "request")
    assert auth == {"AuthBytes": f"[redacted {len(SASL_PLAIN)} bytes]"}
    # Unknown tagged fields: tag and size, never their bytes.
    unknown_body = {"AuthBytes": b"x", "_unknown_tagged_fields": [(9, b"TAGGED-SECRET-1")]}
    auth, unknown = Redactor().render(unknown_body, codec.body(36, "request", 2).spec.struct,
                                      "SaslAuthenticate", "request")
    assert unknown == [{"path": "", "tag": 9, "size": 15}] and "_unknown_tagged_fields" not in auth


def test_request_unknown_tagged_fields_logged_by_size(log_stream, codec):
    wire = Wire(codec, DebugLog())
    key = codec.registry.api_key_of("SaslAuthenticate")
    frame = codec.encode_request(
        {"RequestApiKey": key, "RequestApiVersion": 2, "CorrelationId": 1, "ClientId": "c",
         "_unknown_tagged_fields": [(5, b"HEADER-TAG-SECRET")]},
        {"AuthBytes": SASL_PLAIN, "_unknown_tagged_fields": [(7, b"BODY-TAG-SECRET")]})
    for e in wire.session.client_data(framed(frame), 0.0).events:
        wire.observers[0].on_event(e)
    (line,) = events(json_lines(log_stream), "kafka.request", "SaslAuthenticate")
    assert line["header_tagged_fields"] == [{"path": "", "tag": 5, "size": 17}]
    assert line["unknown_tagged_fields"] == [{"path": "", "tag": 7, "size": 15}]
    assert_never_logged(log_stream.getvalue(), b"HEADER-TAG-SECRET", b"BODY-TAG-SECRET", PASSWORD)


# ----------------------------------------------------------------------------- selection, sampling, truncation


def metadata_body(topics: list[str] | None) -> dict:
    return {"Topics": None if topics is None else [{"TopicId": uuid.UUID(int=0), "Name": t} for t in topics],
            "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False}


def test_include_and_exclude(log_stream, codec):
    api_versions = {"ClientSoftwareName": "t", "ClientSoftwareVersion": "0"}
    for include, exclude, want in [
        (None, (), {"ApiVersions", "Metadata", "FindCoordinator"}),
        (["Metadata"], (), {"Metadata"}),
        (["metadata", 18], (), {"Metadata", "ApiVersions"}),  # names case-insensitive, keys as ints
        (None, ["ApiVersions", "10"], {"Metadata"}),
        (["Metadata", "ApiVersions"], ["ApiVersions"], {"Metadata"}),
    ]:
        log_stream.seek(0)
        log_stream.truncate()
        wire = Wire(codec, DebugLog(include=include, exclude=exclude))
        wire.request("ApiVersions", 3, api_versions)
        wire.request("Metadata", 12, metadata_body(["a"]))
        wire.request("FindCoordinator", 4, {"KeyType": 0, "CoordinatorKeys": ["grp"]})
        assert {d["api"] for d in events(json_lines(log_stream), "kafka.request")} == want, (include, exclude)


def test_sampling_is_seeded_and_responses_follow_requests(log_stream, codec):
    n, rate = 400, 0.25
    debug = DebugLog(sample_rate=rate, responses=True, rng=random.Random(1234))
    wire = Wire(codec, debug)
    for i in range(n):
        wire.exchange("FindCoordinator", 4, {"KeyType": 0, "CoordinatorKeys": [f"g{i}"]},
                      {"ThrottleTimeMs": 0, "Coordinators": [{"Key": f"g{i}", "NodeId": 1, "Host": "h", "Port": 1,
                                                              "ErrorCode": 0, "ErrorMessage": None}]})
    draws = random.Random(1234)
    expected = [i for i in range(n) if draws.random() < rate]
    lines = json_lines(log_stream)
    requests = [json.loads(d["body"])["CoordinatorKeys"][0] for d in events(lines, "kafka.request")]
    responses = [json.loads(d["body"])["Coordinators"][0]["Key"] for d in events(lines, "kafka.response")]
    assert requests == [f"g{i}" for i in expected]
    assert responses == requests  # a response is logged exactly when its request was
    assert 0.15 * n < len(requests) < 0.35 * n
    assert debug.logged["sampled_out"] == n - len(requests)
    # The extremes draw nothing.
    assert DebugLog(sample_rate=0.0)._sampled() is False and DebugLog(sample_rate=1.0)._sampled() is True
    with pytest.raises(ValueError):
        DebugLog(sample_rate=1.5)


def test_truncation(log_stream, codec):
    wire = Wire(codec, DebugLog(max_body_chars=200))
    topics = [f"topic-{i:04d}" for i in range(200)]
    wire.request("Metadata", 12, metadata_body(topics))
    wire.request("Metadata", 12, metadata_body(["short"]))
    long_line, short_line = events(json_lines(log_stream), "kafka.request", "Metadata")
    assert long_line["truncated"] is True and len(long_line["body"]) == 200
    assert long_line["body_chars"] > 200 * len("topic-0000")
    assert long_line["body"].startswith('{"Topics":[{"TopicId":"00000000-0000-0000-0000-000000000000","Name":"topic-0000"')
    assert short_line["truncated"] is False and "body_chars" not in short_line
    assert json.loads(short_line["body"])["Topics"][0]["Name"] == "short"


def test_decode_failure_logs_a_warning(log_stream, codec):
    debug = DebugLog()
    wire = Wire(codec, debug)
    key = codec.registry.api_key_of("SaslAuthenticate")
    frame = codec.encode_request({"RequestApiKey": key, "RequestApiVersion": 2, "CorrelationId": 5, "ClientId": "c"},
                                 {"AuthBytes": SASL_PLAIN})
    cut = frame[:-8]  # the AuthBytes length says more than is there
    for e in wire.session.client_data(framed(cut), 0.0).events:
        debug.on_event(e)
    (line,) = events(json_lines(log_stream), "kafka.decode_failed")
    assert line["level"] == "warning" and line["api"] == "SaslAuthenticate" and line["direction"] == "request"
    assert line["correlation_id"] == 5 and line["reason"] and line["connection_id"] == 7
    assert "offset" in line and "path" in line
    assert debug.logged == {**debug.logged, "request": 0, "decode_failed": 1}
    assert_never_logged(log_stream.getvalue(), PASSWORD[:8])
