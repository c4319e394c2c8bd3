"""Rewrite mode's response transform: broker addresses in responses point at kinspect's own listeners.

These are the only frames whose bytes kinspect changes. A response that may carry
broker addresses (Metadata, FindCoordinator, DescribeCluster, and the KIP-951
NodeEndpoints of Produce, Fetch and the share-group responses) is held by the session
until whole, then rewritten here; every other byte passes at once. ApiVersions responses
are held too when a version cap is set (proxy.fetch_max_version): clients are offered
Fetch only up to the last version before NodeEndpoints, so that the largest responses of
all, record-bearing Fetch responses, stream through instead of being held.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from kinspect.protocol.codec import Codec, CompiledStruct
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.specs.api_keys import (
    API_VERSIONS, DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE, SHARE_ACKNOWLEDGE, SHARE_FETCH,
)
from kinspect.protocol.wire.peek import api_versions_body_version
from kinspect.protocol.wire.primitives import uvarint_size

# api key -> first version whose response can carry broker addresses
ADDRESS_RESPONSES = {
    METADATA: 0,  # Brokers
    FIND_COORDINATOR: 0,  # NodeId/Host/Port, and Coordinators from v4
    DESCRIBE_CLUSTER: 0,  # Brokers
    PRODUCE: 10,  # NodeEndpoints (KIP-951)
    FETCH: 16,  # NodeEndpoints (KIP-951)
    SHARE_FETCH: 0,  # NodeEndpoints
    SHARE_ACKNOWLEDGE: 0,  # NodeEndpoints
}
_NODE_ID_FIELDS = ("NodeId", "BrokerId")


# Responses whose only addresses are KIP-951's NodeEndpoints, in their root tag section at
# the very end of the frame: holding them (a whole Fetch response) costs streaming, so
# proxy.rewrite_node_endpoints can turn it off.
NODE_ENDPOINT_APIS = frozenset({PRODUCE, FETCH, SHARE_FETCH, SHARE_ACKNOWLEDGE})
TAGGED_NODE_ENDPOINT_APIS = frozenset({PRODUCE, FETCH})


def carries_addresses(api_key: int, version: int, node_endpoints: bool = True) -> bool:
    first = ADDRESS_RESPONSES.get(api_key)
    if first is None or version < first:
        return False
    return node_endpoints or api_key not in NODE_ENDPOINT_APIS


@dataclass
class NodeMap:
    """Broker node id -> kinspect port, and what kinspect learnt of each broker's real address."""

    advertised_host: str
    port_base: int | None = None
    ports: dict[int, int] = field(default_factory=dict)
    upstream: dict[int, tuple[str, int]] = field(default_factory=dict)

    def port_for(self, node_id: int) -> int:
        port = self.ports.get(node_id)
        if port is None:
            if self.port_base is None:
                raise KeyError(f"node {node_id} has no port: set proxy.node_port_base or proxy.node_ports")
            port = self.port_base + node_id
            if not 0 < port < 65536:
                raise KeyError(f"node {node_id} maps to port {port}, outside 1-65535")
        return port


def _rewrite_structs(value, nodes: NodeMap, seen: list) -> bool:
    """Rewrite Host/Port of every struct that names a broker; True if anything changed."""
    changed = False
    if isinstance(value, list):
        for item in value:
            changed |= _rewrite_structs(item, nodes, seen)
        return changed
    if not isinstance(value, dict):
        return False
    if "Host" in value and "Port" in value:
        node_id = next((value[k] for k in _NODE_ID_FIELDS if isinstance(value.get(k), int)), None)
        if node_id is not None and node_id >= 0:
            seen.append((node_id, value["Host"], value["Port"]))
            new = (nodes.advertised_host, nodes.port_for(node_id))
            if (value["Host"], value["Port"]) != new:
                value["Host"], value["Port"] = new
                changed = True
    for item in value.values():
        if isinstance(item, (list, dict)):
            changed |= _rewrite_structs(item, nodes, seen)
    return changed


# (codec, api key, version) -> the decoder/encoder of a Produce/Fetch response's root tag section alone
_ROOT_TAGS: dict[tuple[int, int, int], tuple[Codec, CompiledStruct]] = {}


def _root_tags(codec: Codec, api_key: int, version: int) -> CompiledStruct:
    """The response body's struct cut down to its tagged fields: it reads and writes the root tag section."""
    key = (id(codec), api_key, version)
    known = _ROOT_TAGS.get(key)
    if known is None or known[0] is not codec:
        body = codec.body(api_key, "response", version)
        struct = body.spec.struct
        tagged = tuple(f for f in struct.fields if version in f.tagged_versions)
        spec = dataclasses.replace(body.spec, struct=dataclasses.replace(struct, fields=tagged))
        known = _ROOT_TAGS[key] = (codec, CompiledStruct(spec, version, True, api=body.api, api_key=api_key,
                                                        direction="response"))
    return known[1]


def _root_tag_section_start(frame, facts) -> int | None:
    """Where a Produce/Fetch response's root tag section starts: it ends the frame, and the scan
    listed its fields (tag and size each), so its length follows; None when the scan cannot say."""
    if facts.trailing_bytes:
        return None
    root = [(tag, size) for path, tag, _, size in facts.tagged_fields if path == ""]
    length = uvarint_size(len(root)) + sum(uvarint_size(tag) + uvarint_size(size) + size for tag, size in root)
    return len(frame) - length if length <= len(frame) else None


def _splice_node_endpoints(codec: Codec, frame, facts, api_key: int, version: int, nodes: NodeMap):
    """Rewrite only the root tag section of a Produce/Fetch response, after the scan that found
    NodeEndpoints there: (pieces to send, seen), or None to fall back to the whole decode.
    The records before the tag section are neither decoded nor copied (a memoryview of them goes out)."""
    start = _root_tag_section_start(frame, facts)
    if start is None:
        return None
    tags = _root_tags(codec, api_key, version)
    try:
        values, _ = tags.decode(frame, start)
    except DecodeError:
        return None
    if "NodeEndpoints" not in values:
        return None
    seen: list = []
    if not _rewrite_structs(values, nodes, seen):
        return frame, seen
    return (memoryview(frame)[:start], bytes(tags.encode(values))), seen


# Answers remembered by AddressRewrite, rewritten: at most this many, each at most this long
_REMEMBERED = 64
_REMEMBERED_BYTES = 64 * 1024
# The answers it remembers: a broker gives the same ones again and again (its ApiVersions on every
# connection, a client's Metadata at each refresh), and a decode and an encode cost 50-100 µs.
# Not Produce or Fetch: record-bearing, never alike, and only scanned.
_REMEMBERED_APIS = frozenset({API_VERSIONS, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})


def cap_api_versions(codec: Codec, frame: bytes, version: int, caps: dict[int, int]):
    """An ApiVersions response offering each api of `caps` up to that version at most (never
    below the broker's own minimum for it); the frame itself when nothing is above its cap."""
    body_version = api_versions_body_version(frame, version, 4)  # its header is v0 at every version
    decoded = codec.decode_response(frame, API_VERSIONS, body_version)
    changed = False
    for entry in decoded.body["ApiKeys"]:
        cap = caps.get(entry["ApiKey"])
        if cap is not None and entry["MaxVersion"] > cap:
            entry["MaxVersion"] = max(cap, entry["MinVersion"])
            changed = True
    if not changed:
        return frame
    return codec.encode_response(API_VERSIONS, body_version, decoded.header, decoded.body, decoded.trailing)


def rewrite_response(codec: Codec, frame: bytes, api_key: int, version: int, nodes: NodeMap):
    """Return (frame to send, [(node id, real host, real port)]); the frame unchanged if nothing moved.

    The frame to send is bytes, or for a Produce/Fetch response whose NodeEndpoints moved, a
    tuple of pieces (the unchanged bytes before the root tag section, then the new section).
    """
    if api_key in TAGGED_NODE_ENDPOINT_APIS:
        # Most Produce/Fetch responses carry no NodeEndpoints (a tagged field there): a scan
        # says so without decoding. In the share-group responses it is a plain field.
        facts = codec.scan_response(frame, api_key, version)
        if not any(name == "NodeEndpoints" for _, _, name, _ in facts.tagged_fields):
            return frame, []
        spliced = _splice_node_endpoints(codec, frame, facts, api_key, version, nodes)
        if spliced is not None:
            return spliced
    return _rewrite_decoded(codec, frame, api_key, version, nodes)


def _rewrite_decoded(codec: Codec, frame: bytes, api_key: int, version: int, nodes: NodeMap):
    """The whole response decoded, rewritten and encoded again (the reference the splice is tested against)."""
    decoded = codec.decode_response(frame, api_key, version)
    seen: list = []
    if not _rewrite_structs(decoded.body, nodes, seen):
        return frame, seen
    return codec.encode_response(api_key, version, decoded.header, decoded.body, decoded.trailing), seen


class AddressRewrite:
    """The ResponseTransform of rewrite mode: each broker named in a response gets kinspect's address.

    `on_broker(node_id, host, port)` is told every broker a response names with its real
    address (the proxy opens a listener for it); it runs before the response is sent on.
    """

    def __init__(self, codec: Codec, nodes: NodeMap, node_endpoints: bool = True,
                 on_broker: Callable[[int, str, int], None] | None = None, fetch_max_version: int = 0) -> None:
        self.codec = codec
        self.nodes = nodes
        self.node_endpoints = node_endpoints
        self.on_broker = on_broker
        if fetch_max_version < 0:
            raise ValueError(f"proxy.fetch_max_version must be 0 (no cap) or a Fetch version, not {fetch_max_version}")
        # api key -> the highest version clients are offered (ApiVersions responses rewritten). 15,
        # the default, is the last Fetch version without NodeEndpoints: v16 added them (KIP-951), and
        # v17 and v18 change only what followers send (KIP-853, KIP-1166). Produce is not capped: its
        # responses are small, holding them costs nothing, and its v11+ carry KIP-890's transactions.
        self.version_caps = {FETCH: fetch_max_version} if fetch_max_version else {}
        # (api key, version, a response after its correlation id) -> (the same rewritten after its
        # correlation id, or None if unchanged; the brokers it named): see _REMEMBERED_APIS
        self._remembered: dict[tuple[int, int, bytes], tuple[bytes | None, list]] = {}

    def wants(self, api_key: int, version: int) -> bool:
        if api_key == API_VERSIONS:
            return bool(self.version_caps)
        return carries_addresses(api_key, version, self.node_endpoints)

    def apply(self, frame: bytes, api_key: int, version: int):
        if api_key not in _REMEMBERED_APIS or len(frame) > _REMEMBERED_BYTES:
            new, seen = self._rewritten(frame, api_key, version)
        else:
            key = (api_key, version, bytes(frame[4:]))
            known = self._remembered.get(key)
            if known is None:
                new, seen = self._rewritten(frame, api_key, version)
                known = (None if new is frame else bytes(new)[4:], seen)
                if len(self._remembered) >= _REMEMBERED:
                    self._remembered.clear()
                self._remembered[key] = known
            rest, seen = known
            new = frame if rest is None else bytes(frame[:4]) + rest
        if self.on_broker is not None:
            for node_id, host, port in seen:
                self.on_broker(node_id, host, port)
        return new

    def _rewritten(self, frame: bytes, api_key: int, version: int):
        """(the frame to send, the brokers it names as (node id, real host, real port))."""
        if api_key == API_VERSIONS:
            return cap_api_versions(self.codec, frame, version, self.version_caps), []
        return rewrite_response(self.codec, frame, api_key, version, self.nodes)
