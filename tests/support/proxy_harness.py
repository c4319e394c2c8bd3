"""Run kinspect's proxy in-process for integration tests, plus the rigs and checks around it.

* `ProxyHarness`: a `ProxyServer` on its own uvloop event loop in a background thread,
  so that blocking Kafka clients can be driven from the test thread. It keeps an
  `EventLog` of everything the proxy's sessions emitted.
* `RewriteRig`: a Tansu broker whose advertised address is unusable (127.0.0.2, where
  nothing listens), kinspect in rewrite mode in front of it, and `RecordingRelay`s on
  both sides of kinspect, so a test can compare what entered kinspect with what left it.
* `check_byte_exact` / `check_event_log`: the comparisons themselves.
* Raw Kafka wire helpers (encode a request with kinspect's codec, read one frame) and
  process-level probes (open file descriptors, kinspect's own TCP sockets, RSS).

Addresses: only loopback. kinspect listens on 127.0.0.3 in the rig so that the front
relays can take the same port numbers on 127.0.0.1, the address kinspect advertises.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import uvloop

from kinspect.app import build_app
from kinspect.config import load_config
from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from kinspect.proxy.observers import Dispatcher
from tests.support.event_log import EventLog
from kinspect.session.address_rewrite import cap_api_versions, carries_addresses
from kinspect.proxy.server import ProxyServer
from kinspect.session import Exchange, Problem, Request, Response
from tests.support.recording_relay import RecordingRelay
from tests.support.tansu import TansuBroker, free_port

TANSU_NODE_ID = 111  # Tansu 0.6.0's broker node id
UNUSABLE_HOST = "127.0.0.2"  # Tansu advertises this host; nothing listens there
KINSPECT_HOST = "127.0.0.3"  # where kinspect itself listens inside a RewriteRig
CLIENT_HOST = "127.0.0.1"  # what clients connect to (front relays), and kinspect's advertised host


# ----------------------------------------------------------------------------- the proxy


class ProxyHarness:
    """kinspect's ProxyServer running in a background thread on its own uvloop loop.

    ``overrides`` are dotted config keys as for `load_config` ({"proxy.mode": ...}).
    """

    def __init__(self, overrides: dict, codec: Codec | None = None, observers: tuple = ()) -> None:
        # Assembled as `kinspect proxy` assembles it; metrics only when a test asks (it brings its own observer).
        # The readiness probe is off: the tests' scripted brokers answer one connection each.
        self.config = load_config(None, {"metrics.enabled": False, "proxy.readiness_probe_interval": 0, **overrides})
        self.codec = codec or Codec()
        self.events = EventLog(keep_frames=True)  # check_event_log compares every request's bytes
        self.app = build_app(self.config, self.codec, extra_observers=[self.events, *observers])
        self.server = self.app.server
        self.dispatcher = self.server.dispatcher
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.leftover_tasks: list[asyncio.Task] = []

    # -- lifecycle (from the test thread)

    def start(self) -> "ProxyHarness":
        if self._thread is not None:
            raise RuntimeError("already started")
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kinspect-proxy", daemon=True)
        self._thread.start()
        try:
            self.call(self.app.start(serve_http=False))
        except BaseException:
            self._stop_loop()
            raise
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self, grace: float = 0.0) -> None:
        """Shut the server down (idempotent), then stop and close the loop and its thread.

        Tasks still pending on the loop after the shutdown are kept in `leftover_tasks`.
        """
        if self._thread is None:
            return
        try:
            if not self.server.stopping:
                self.call(self.app.stop(grace), timeout=grace + 75)
            self.leftover_tasks = self.call(self._settle_tasks())
        finally:
            self._stop_loop()

    async def _settle_tasks(self) -> list:
        # Cancelled tasks (the sweeper) need a few loop iterations to finish.
        for _ in range(20):
            pending = self._tasks_now()
            if not pending:
                break
            await asyncio.sleep(0.01)
        return self._tasks_now()

    def _stop_loop(self) -> None:
        loop, thread = self.loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
        self._thread = None

    def __enter__(self) -> "ProxyHarness":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- reaching into the loop

    def call(self, coro, timeout: float = 30.0):
        """Run a coroutine on the proxy's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable, *args, timeout: float = 30.0):
        """Run a plain function on the proxy's loop (where kinspect's objects may be touched), after the
        reads forwarded so far are inspected, as a scrape of /metrics settles them (inspect.batch_delay_ms)."""

        async def _call():
            self.server.settle()
            return fn(*args)

        return self.call(_call(), timeout)

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> float:
        """Evaluate predicate on the loop until true; return the seconds waited (raises TimeoutError)."""
        started = time.monotonic()
        while True:
            if self.run(predicate):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"condition not met within {timeout} s")
            time.sleep(interval)

    def relay_count(self) -> int:
        return self.run(lambda: len(self.server.relays))

    def wait_idle(self, timeout: float = 10.0) -> float:
        """Wait until no client connection is open in kinspect."""
        return self.wait_until(lambda: not self.server.relays, timeout)

    def _tasks_now(self) -> list:
        current = asyncio.current_task()
        return [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    def kinspect_tasks(self) -> list:
        """Tasks on the proxy's loop other than the server's housekeeping (which lives as long as the server)."""
        housekeeping = self.server.housekeeping_tasks

        async def _tasks():
            await asyncio.sleep(0)
            return [t for t in self._tasks_now() if t not in housekeeping]

        return self.call(_tasks())

    @property
    def bootstrap(self) -> str:
        return f"{self.server.listeners[0].host}:{self.server.bootstrap_port}"

    def listener_ports(self) -> set[int]:
        return self.run(lambda: {listener.port for listener in self.server.listeners})

    # -- events

    def events_of(self, kind) -> list:
        return [e for e in list(self.events.events) if type(e) is kind]


# ----------------------------------------------------------------------------- the rewrite rig



def poll_until(predicate: Callable, timeout: float = 5.0, interval: float = 0.02):
    """Call predicate until it returns something true (returned), or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)

def refuses(host: str, port: int) -> bool:
    """True if nothing accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


class RewriteRig:
    """Tansu (advertising an unusable address) <- back relay <- kinspect (rewrite) <- front relays <- clients.

    Clients bootstrap at `bootstrap` (the front relay of kinspect's bootstrap listener);
    kinspect advertises node 111 as 127.0.0.1:N, where the second front relay listens and
    forwards to kinspect's own node listener at 127.0.0.3:N. kinspect reaches Tansu only
    through the back relay, for the bootstrap servers and (via upstream_map) for the address
    Tansu advertises, 127.0.0.2:P, which refuses connections: a client that ever used the
    broker's own advertisement would fail.

    With ``record=False`` there are no relays: clients use kinspect's listeners directly
    (kinspect then listens on 127.0.0.1) and kinspect reaches Tansu directly.
    """

    def __init__(self, out_dir: Path, record: bool = True, overrides: dict | None = None,
                 codec: Codec | None = None, observers: tuple = ()) -> None:
        self.out_dir = Path(out_dir)
        self.record = record
        self.overrides = overrides or {}
        self.codec = codec
        self.observers = observers
        self.tansu: TansuBroker | None = None
        self.back: RecordingRelay | None = None
        self.front_boot: RecordingRelay | None = None
        self.front_node: RecordingRelay | None = None
        self.proxy: ProxyHarness | None = None
        self.node_port = 0

    def start(self) -> "RewriteRig":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.tansu = TansuBroker(advertised_host=UNUSABLE_HOST).start()
        assert refuses(UNUSABLE_HOST, self.tansu.port), "the broker's advertised address must be unusable"
        if self.record:
            self.back = RecordingRelay("127.0.0.1", self.tansu.port, self.out_dir / "back").start()
            upstream = self.back.address
            # The node's front relay takes a free port on 127.0.0.1; kinspect listens on the same number on 127.0.0.3.
            self.front_node = RecordingRelay(KINSPECT_HOST, 0, self.out_dir / "front_node").start()
            self.node_port = self.front_node.port
            self.front_node.upstream_port = self.node_port
            listen_host = KINSPECT_HOST
        else:
            upstream = self.tansu.bootstrap
            self.node_port = free_port(CLIENT_HOST)
            listen_host = CLIENT_HOST
        overrides = {
            "proxy.mode": "rewrite",
            "proxy.listen": f"{listen_host}:0",
            "proxy.advertised_host": CLIENT_HOST,
            "proxy.bootstrap_servers": [upstream],
            "proxy.node_ports": {str(TANSU_NODE_ID): self.node_port},
            "proxy.upstream_map": {f"{UNUSABLE_HOST}:{self.tansu.port}": upstream},
            "proxy.connect_timeout": 5.0,
            **self.overrides,
        }
        self.proxy = ProxyHarness(overrides, self.codec, self.observers).start()
        if self.record:
            self.front_boot = RecordingRelay(KINSPECT_HOST, self.proxy.server.bootstrap_port,
                                             self.out_dir / "front_boot").start()

    @property
    def bootstrap(self) -> str:
        """What clients are given as bootstrap.servers."""
        if self.front_boot is not None:
            return self.front_boot.address
        return f"{CLIENT_HOST}:{self.proxy.server.bootstrap_port}"

    def quiesce(self, timeout: float = 15.0) -> None:
        """Wait until every relayed connection (front, kinspect, back) has ended."""
        deadline = time.monotonic() + timeout
        for relay in (self.front_boot, self.front_node):
            if relay is not None:
                assert relay.drain(max(0.1, deadline - time.monotonic())), "front relay connections still open"
        self.proxy.wait_idle(max(0.1, deadline - time.monotonic()))
        if self.back is not None:
            assert self.back.drain(max(0.1, deadline - time.monotonic())), "back relay connections still open"

    def stop(self) -> None:
        errors = []
        for part in (self.front_boot, self.front_node, self.proxy, self.back, self.tansu):
            if part is None:
                continue
            try:
                part.stop()
            except Exception as exc:  # keep stopping the rest
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> "RewriteRig":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ----------------------------------------------------------------------------- checks

_PREFIX = struct.Struct(">i")


def frames_of(data: bytes) -> tuple[list[bytes], bytes]:
    """Size-prefixed frames of a byte stream and the bytes left over after the last whole one."""
    frames, pos = [], 0
    while len(data) - pos >= 4:
        (size,) = _PREFIX.unpack_from(data, pos)
        if size < 0 or len(data) - pos - 4 < size:
            break
        frames.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames, data[pos:]


def stream_frames(stream: bytes) -> list[bytes]:
    """A recorded stream of whole frames cut into its frames, size prefixes included."""
    out, pos = [], 0
    while pos < len(stream):
        end = pos + 4 + _PREFIX.unpack_from(stream, pos)[0]
        out.append(stream[pos:end])
        pos = end
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


@dataclass
class Recorded:
    """One relayed connection as recorded: the bytes of each direction."""

    where: str
    number: int
    requests: bytes
    responses: bytes


def recorded(relay: RecordingRelay, where: str) -> list[Recorded]:
    return [
        Recorded(where, c.number, _read(relay.out_dir / f"{c.number:03d}.requests.bin"),
                 _read(relay.out_dir / f"{c.number:03d}.responses.bin"))
        for c in relay.connections
    ]


def broker_structs(value, out: list | None = None) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every struct of a decoded body that names a broker."""
    out = [] if out is None else out
    if isinstance(value, list):
        for item in value:
            broker_structs(item, out)
    elif isinstance(value, dict):
        if "Host" in value and "Port" in value:
            node = next((value[k] for k in ("NodeId", "BrokerId") if isinstance(value.get(k), int)), None)
            if node is not None and node >= 0:
                out.append((node, value["Host"], value["Port"]))
        for item in value.values():
            if isinstance(item, (list, dict)):
                broker_structs(item, out)
    return out


def _with_addresses(value, address: Callable[[int], tuple[str, int]]):
    """A copy of a decoded body with every broker struct's Host/Port replaced by address(node id)."""
    if isinstance(value, list):
        return [_with_addresses(v, address) for v in value]
    if isinstance(value, dict):
        new = {k: _with_addresses(v, address) for k, v in value.items()}
        if "Host" in value and "Port" in value:
            node = next((value[k] for k in ("NodeId", "BrokerId") if isinstance(value.get(k), int)), None)
            if node is not None and node >= 0:
                new["Host"], new["Port"] = address(node)
        return new
    return value


@dataclass
class ByteExactReport:
    connections: int = 0  # matched client<->broker connection pairs
    frames: int = 0  # response frames compared
    rewritten: int = 0  # response frames kinspect changed (decoded and checked)
    address_responses: int = 0  # responses that carried broker addresses to the client
    capped: int = 0  # ApiVersions responses whose versions kinspect capped (proxy.fetch_max_version)
    apis: collections.Counter = field(default_factory=collections.Counter)  # request (api_key, version)
    silent: int = 0  # client connections that sent no request


def check_byte_exact(rig: RewriteRig, codec: Codec) -> ByteExactReport:
    """Every connection: client->kinspect == kinspect->broker bytes, broker->kinspect == kinspect->client
    bytes except the frames kinspect rewrote, which must differ only in broker Host/Port, now kinspect's,
    and the ApiVersions responses, which must offer no api above the proxy's caps (`version_caps`).

    Connections are paired by the hash of their request stream (identical streams are
    interchangeable). Call after `rig.quiesce()`.
    """
    report = ByteExactReport()
    front = recorded(rig.front_boot, "front_boot") + recorded(rig.front_node, "front_node")
    back = recorded(rig.back, "back")
    # kinspect opened one broker connection per client connection it accepted, and no other.
    assert rig.proxy.server.connections_total == len(front), (rig.proxy.server.connections_total, len(front))
    assert len(back) <= len(front)
    by_hash: dict[str, list[Recorded]] = collections.defaultdict(list)
    for b in back:
        by_hash[_sha(b.requests)].append(b)
    kinspect_address = {TANSU_NODE_ID: (CLIENT_HOST, rig.node_port)}
    advertised = {TANSU_NODE_ID: (UNUSABLE_HOST, rig.tansu.port)}
    caps = rig.proxy.server.plan.transform.version_caps
    for f in front:
        candidates = by_hash.get(_sha(f.requests), [])
        if not f.requests and not f.responses and not candidates:
            report.silent += 1  # closed before kinspect reached the broker
            continue
        assert candidates, f"{f.where} connection {f.number}: no broker-side connection carried its requests"
        # Pair with the first candidate whose responses are equivalent.
        failures = []
        for b in candidates:
            try:
                sub = _compare_responses(codec, f, b, kinspect_address, advertised, caps)
            except AssertionError as exc:
                failures.append(str(exc))
                continue
            candidates.remove(b)
            break
        else:
            raise AssertionError(f"{f.where} connection {f.number}: responses differ: {failures[:2]}")
        report.connections += 1
        report.silent += not f.requests
        report.frames += sub.frames
        report.rewritten += sub.rewritten
        report.address_responses += sub.address_responses
        report.capped += sub.capped
        report.apis.update(sub.apis)
    leftover = [b for bs in by_hash.values() for b in bs]
    assert not leftover, f"broker-side connections with no client counterpart: {[b.number for b in leftover]}"
    return report


def _compare_responses(codec: Codec, f: Recorded, b: Recorded, kinspect_address: dict, advertised: dict,
                       caps: dict[int, int]) -> ByteExactReport:
    report = ByteExactReport()
    requests, rest = frames_of(f.requests)
    assert not rest, f"{len(rest)} bytes of a partial request frame"
    asked = {}
    for frame in requests:
        api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
        asked[correlation_id] = (api_key, version)
        report.apis[(api_key, version)] += 1
    sent, sent_rest = frames_of(b.responses)  # broker -> kinspect
    got, got_rest = frames_of(f.responses)  # kinspect -> client
    check_cut_short(sent, sent_rest, got, got_rest, asked)
    for original, delivered in zip(sent, got):
        report.frames += 1
        correlation_id = struct.unpack_from(">i", original, 0)[0]
        assert struct.unpack_from(">i", delivered, 0)[0] == correlation_id, "response order changed"
        api = asked.get(correlation_id)
        if api is not None and api[0] == API_VERSIONS_KEY:
            # the broker's answer with each capped api offered up to its cap, nothing else changed
            # (cap_api_versions' own tests check it against decoded bodies)
            expected = bytes(cap_api_versions(codec, original, api[1], caps)) if caps else original
            assert delivered == expected, f"ApiVersions response {correlation_id}: not the broker's, capped"
            report.capped += delivered != original
            continue
        if api is None or not carries_addresses(*api):
            assert delivered == original, f"response {correlation_id} (api {api}) changed"
            continue
        try:
            before = codec.decode_response(original, *api)
            after = codec.decode_response(delivered, *api)
        except DecodeError as exc:
            raise AssertionError(f"response {correlation_id} api {api} does not decode: {exc}") from None
        nodes_before = broker_structs(before.body)
        nodes_after = broker_structs(after.body)
        if nodes_after:
            report.address_responses += 1
        # The broker advertised its own (unusable) address; the client saw only kinspect's.
        assert all((h, p) == advertised[n] for n, h, p in nodes_before), (api, nodes_before)
        assert all((h, p) == kinspect_address[n] for n, h, p in nodes_after), (api, nodes_after)
        if delivered == original:
            assert not nodes_before, (api, nodes_before)
            continue
        report.rewritten += 1
        assert after.header == before.header and after.trailing == before.trailing
        assert after.body == _with_addresses(before.body, lambda n: kinspect_address[n]), \
            f"response {correlation_id} api {api}: differs in more than broker addresses"
    return report


def check_cut_short(sent: list[bytes], sent_rest: bytes, got: list[bytes], got_rest: bytes, asked: dict) -> None:
    """The client's responses may end early, never differ: its last bytes start what the broker sent next.

    A connection's end can cut the response stream on either leg. The broker may leave a response unfinished
    (the client got a start of it, or none: a response kinspect rewrites is held until whole). And the client
    may leave while kinspect is passing on responses the broker sent whole: the client-side recording then
    stops inside or between them, and the broker-side one holds them all.
    """
    assert len(got) <= len(sent), f"{len(sent)} response frames from the broker, {len(got)} to the client"
    if not got_rest:
        return
    if len(got) < len(sent):
        following = sent[len(got)]
        api = asked.get(struct.unpack_from(">i", following, 0)[0])
        if api is not None and (api[0] == API_VERSIONS_KEY or carries_addresses(*api)):
            # kinspect writes a rewritten response at once, but the relay may have read only its start
            assert got_rest[4:8] == following[: len(got_rest[4:8])], "a cut response with another correlation id"
            return
    remaining = b"".join(_PREFIX.pack(len(frame)) + frame for frame in sent[len(got):]) + sent_rest
    assert remaining.startswith(got_rest), f"different trailing bytes after response frame {len(got)} of {len(sent)}"


API_VERSIONS_KEY = 18


# Problems real traffic may legitimately produce: Tansu answers acks=0 produces (kinspect reports
# the response as unpaired), and a client may close with a request still unanswered (a Fetch long
# poll). Anything else (decode_error, unknown_api...) means kinspect could not follow real traffic.
EXPECTED_PROBLEMS = {"unpaired_response", "unanswered"}


def check_event_log(rig: RewriteRig, log: EventLog | None = None) -> dict:
    """The EventLog against the recorded broker-side bytes, connection by connection.

    - each connection's Request frames are exactly the bytes kinspect sent the broker, and its
      Response frames exactly what the broker sent back;
    - every Request that expects a response has an Exchange carrying a Response, unless the
      broker never answered it (then an "unanswered" Problem names it); acks=0 Produce
      requests have an Exchange without a Response.
    """
    events = list((log or rig.proxy.events).events)
    back = recorded(rig.back, "back")
    streams = collections.defaultdict(list)
    for b in back:
        streams[_sha(b.requests)].append(b)
    by_conn: dict[int, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in events:
        conn = e.request.connection if type(e) is Exchange else e.connection
        by_conn[conn.id][type(e).__name__].append(e)
    problems = collections.Counter(p.kind for p in events if type(p) is Problem)
    unexpected = [(p.kind, p.detail) for p in events if type(p) is Problem and p.kind not in EXPECTED_PROBLEMS]
    assert not unexpected, unexpected
    stats = collections.Counter()
    for conn_id, kinds in by_conn.items():
        requests: list[Request] = kinds["Request"]
        responses: list[Response] = kinds["Response"]
        if not requests and not responses:
            continue
        assert all(r.complete for r in requests + responses)
        request_bytes = b"".join(_PREFIX.pack(r.size) + r.frame for r in requests)
        matches = streams.get(_sha(request_bytes))
        assert matches, f"kinspect connection {conn_id}: its requests match no broker-side byte stream"
        # The Response events are the broker's frames as it sent them (before any rewrite), except
        # Tansu's answers to acks=0 produces, which are reported as unpaired_response Problems.
        acks0 = {r.correlation_id for r in requests if not r.expects_response}
        delivered = [r.frame for r in responses]
        for m in matches:
            recorded_responses = frames_of(m.responses)[0]
            if [fr for fr in recorded_responses if correlation_id(fr) not in acks0] == delivered:
                break
        else:
            raise AssertionError(f"kinspect connection {conn_id}: Response events differ from the broker's bytes")
        unpaired = [p for p in kinds["Problem"] if p.kind == "unpaired_response"]
        assert len(unpaired) == sum(correlation_id(fr) in acks0 for fr in recorded_responses), conn_id
        answered = {correlation_id(fr) for fr in recorded_responses}
        exchanges = {x.request.correlation_id: x for x in kinds["Exchange"]}
        unanswered = {p.detail for p in kinds["Problem"] if p.kind == "unanswered"}
        for r in requests:
            x = exchanges.get(r.correlation_id)
            if not r.expects_response:
                assert x is not None and x.response is None, (conn_id, r.api_name, r.correlation_id)
                stats["acks0"] += 1
            elif r.correlation_id in answered:
                assert x is not None and x.response is not None and x.request is r, (conn_id, r.api_name)
                assert x.response.correlation_id == r.correlation_id and x.response.api_key == r.api_key
                x.response.decode()  # kinspect can decode what the broker sent
                stats["exchanges"] += 1
            else:
                assert x is None, (conn_id, r.api_name)
                assert any(f"correlation id {r.correlation_id} " in d for d in unanswered), (conn_id, r.api_name)
                stats["unanswered"] += 1
            r.decode()  # and what the client sent
    stats.update({f"problem:{k}": n for k, n in problems.items()})
    return dict(stats)


# ----------------------------------------------------------------------------- raw Kafka wire


def request_frame(codec: Codec, api_key: int, version: int, correlation_id: int, body: dict,
                  client_id: str = "kinspect-test") -> bytes:
    header = {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id,
              "ClientId": client_id}
    frame = codec.encode_request(header, body)
    return _PREFIX.pack(len(frame)) + frame


def api_versions(codec: Codec, correlation_id: int) -> bytes:
    return request_frame(codec, 18, 3, correlation_id,
                         {"ClientSoftwareName": "kinspect-test", "ClientSoftwareVersion": "0"})


def metadata(codec: Codec, correlation_id: int, topics: list[str] | None = None) -> bytes:
    return request_frame(codec, 3, 12, correlation_id, {
        "Topics": None if topics is None else [{"TopicId": uuid.UUID(int=0), "Name": t} for t in topics],
        "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False,
    })


def create_topic(codec: Codec, correlation_id: int, name: str, partitions: int = 1) -> bytes:
    return request_frame(codec, 19, 4, correlation_id, {
        "Topics": [{"Name": name, "NumPartitions": partitions, "ReplicationFactor": 1, "Assignments": [],
                    "Configs": []}],
        "TimeoutMs": 10000, "ValidateOnly": False,
    })


def fetch(codec: Codec, correlation_id: int, topic: str, offset: int = 0, max_wait_ms: int = 500,
          max_bytes: int = 1 << 20, version: int = 12, topic_id: uuid.UUID | None = None) -> bytes:
    """Fetch partition 0 of a topic: by name up to v12, by topic id (from Metadata) from v13."""
    if version >= 13 and topic_id is None:
        raise ValueError("Fetch v13+ names topics by id")
    return request_frame(codec, 1, version, correlation_id, {
        "ReplicaId": -1, "MaxWaitMs": max_wait_ms, "MinBytes": 1, "MaxBytes": max_bytes, "IsolationLevel": 0,
        "SessionId": 0, "SessionEpoch": -1,
        "Topics": [{"Topic": topic, "TopicId": topic_id or uuid.UUID(int=0), "Partitions": [{
            "Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": offset, "LastFetchedEpoch": -1,
            "LogStartOffset": -1, "PartitionMaxBytes": max_bytes}]}],
        "ForgottenTopicsData": [], "RackId": "",
    })


def fetch_response(codec: Codec, correlation_id: int, topic: str, records: list[bytes | None], version: int = 12,
                   error_codes: list[int] | None = None, header_tags: bytes = b"") -> bytes:
    """A framed Fetch response: one partition per entry of `records` (its record set, or None), with its error
    code; header_tags: a response header v1's tag section in place of the empty one (b"\\x00")."""
    codes = error_codes or [0] * len(records)
    body = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [{
        "Topic": topic, "TopicId": uuid.UUID(int=7), "Partitions": [{
            "PartitionIndex": p, "ErrorCode": codes[p], "HighWatermark": 1000, "LastStableOffset": 1000,
            "LogStartOffset": 0, "AbortedTransactions": [], "PreferredReadReplica": -1, "Records": records[p]}
            for p in range(len(records))]}]}
    frame = codec.encode_response(1, version, {"CorrelationId": correlation_id}, body)
    if header_tags:
        frame = frame[:4] + header_tags + frame[5:]
    return _PREFIX.pack(len(frame)) + frame


def record_batch(values: list[bytes]) -> bytes:
    """A v2 record batch (no compression), built with kafka-python's record builder."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 30)
    for value in values:
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce(codec: Codec, correlation_id: int, topic: str, values: list[bytes], acks: int = -1) -> bytes:
    return request_frame(codec, 0, 9, correlation_id, {
        "TransactionalId": None, "Acks": acks, "TimeoutMs": 10000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": record_batch(values)}]}],
    })


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(min(n - len(out), 1 << 20))
        if not data:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += data
    return bytes(out)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = _PREFIX.unpack(recv_exact(sock, 4))
    return recv_exact(sock, size)


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Read (and drop) until the peer closes; return the seconds it took (raises socket.timeout)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            sock.settimeout(max(0.001, timeout - (time.monotonic() - started)))
    except (ConnectionResetError, BrokenPipeError):
        pass
    return time.monotonic() - started


def correlation_id(frame: bytes) -> int:
    return struct.unpack_from(">i", frame, 0)[0]


# ----------------------------------------------------------------------------- process probes


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _tcp_table() -> dict[int, tuple[tuple[str, int], tuple[str, int], int]]:
    """socket inode -> (local address, remote address, state) for IPv4 TCP sockets of this netns."""
    table = {}
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            local, remote, state, inode = parts[1], parts[2], int(parts[3], 16), int(parts[9])

            def addr(text: str) -> tuple[str, int]:
                ip, port = text.split(":")
                return socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(port, 16)

            table[inode] = (addr(local), addr(remote), state)
    return table


def own_tcp_sockets() -> list[tuple[tuple[str, int], tuple[str, int], int]]:
    """(local, remote, state) of every TCP socket this process holds open."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    table = _tcp_table()
    return [table[i] for i in inodes if i in table]


TCP_LISTEN = 0x0A


def kinspect_sockets(listen: set[tuple[str, int]], brokers: set[tuple[str, int]]) -> list:
    """This process's connected sockets that belong to kinspect: accepted on one of its listeners
    (local address in ``listen``) or connected to a broker (remote address in ``brokers``)."""
    return [s for s in own_tcp_sockets() if s[2] != TCP_LISTEN and (s[0] in listen or s[1] in brokers)]
