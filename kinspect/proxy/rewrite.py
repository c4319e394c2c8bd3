"""Rewrite mode: broker addresses in responses point at kinspect's own per-broker listeners.

These are the only frames whose bytes kinspect changes. A response that may carry
broker addresses (Metadata, FindCoordinator, DescribeCluster, and the KIP-951
NodeEndpoints of Produce, Fetch and the share-group responses) is held until whole,
decoded, rewritten and re-encoded with the same codec; every other byte passes at once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable

from kinspect.protocol.codec import Codec

# api key -> first version whose response can carry broker addresses
ADDRESS_RESPONSES = {
    3: 0,  # Metadata: Brokers
    10: 0,  # FindCoordinator: NodeId/Host/Port, and Coordinators from v4
    60: 0,  # DescribeCluster: Brokers
    0: 10,  # Produce: NodeEndpoints (KIP-951)
    1: 16,  # Fetch: NodeEndpoints (KIP-951)
    78: 0,  # ShareFetch: NodeEndpoints
    79: 0,  # ShareAcknowledge: NodeEndpoints
}
_NODE_ID_FIELDS = ("NodeId", "BrokerId")
_PREFIX = struct.Struct(">ii")


# Responses whose only addresses are KIP-951's NodeEndpoints, in their root tag section at
# the very end of the frame: holding them (a whole Fetch response) costs streaming, so
# proxy.rewrite_node_endpoints can turn it off.
NODE_ENDPOINT_APIS = frozenset({0, 1, 78, 79})
TAGGED_NODE_ENDPOINT_APIS = frozenset({0, 1})


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


def rewrite_response(codec: Codec, frame: bytes, api_key: int, version: int, nodes: NodeMap):
    """Return (frame to send, [(node id, real host, real port)]); the frame unchanged if nothing moved."""
    if api_key in TAGGED_NODE_ENDPOINT_APIS:
        # Most Produce/Fetch responses carry no NodeEndpoints (a tagged field there): a scan
        # says so without decoding. In the share-group responses it is a plain field.
        facts = codec.scan_response(frame, api_key, version)
        if not any(name == "NodeEndpoints" for _, _, name, _ in facts.tagged_fields):
            return frame, []
    decoded = codec.decode_response(frame, api_key, version)
    seen: list = []
    if not _rewrite_structs(decoded.body, nodes, seen):
        return frame, seen
    return codec.encode_response(api_key, version, decoded.header, decoded.body, decoded.trailing), seen


class ResponseRewriter:
    """The broker-to-client byte stream in rewrite mode (sans-IO).

    `expect(correlation_id, api_key, version)` marks a response to hold; `feed(data)`
    returns the chunks to send to the client. Frames not marked pass through as their
    bytes arrive (after their 8-byte size and correlation id prefix).
    """

    def __init__(self, rewrite: Callable[[bytes, int, int], bytes], max_frame_bytes: int,
                 node_endpoints: bool = True) -> None:
        self._rewrite = rewrite
        self.node_endpoints = node_endpoints
        self._max = max_frame_bytes
        self._expected: dict[int, tuple[int, int]] = {}
        self._buffer = bytearray()
        self._passing = 0  # bytes of a passed-through frame still to come
        self._holding: tuple[int, int, int] | None = None  # (size, api_key, version) of a held frame
        self.failed = False
        self.errors: list[str] = []

    def expect(self, correlation_id: int, api_key: int, version: int) -> None:
        self._expected[correlation_id] = (api_key, version)

    def feed(self, data: bytes) -> list[bytes]:
        if self.failed:
            return [data]
        out: list[bytes] = []
        view = memoryview(data)
        while len(view):
            if self._passing:
                n = min(self._passing, len(view))
                out.append(bytes(view[:n]))
                self._passing -= n
                view = view[n:]
                continue
            self._buffer += view
            view = memoryview(b"")
            while True:
                if self._holding is not None:
                    size, api_key, version = self._holding
                    if len(self._buffer) < 4 + size:
                        break
                    with memoryview(self._buffer) as held:
                        frame = bytes(held[4 : 4 + size])  # one copy
                    del self._buffer[: 4 + size]
                    self._holding = None
                    out.append(self._rewritten(frame, api_key, version))
                    continue
                if len(self._buffer) < 8:
                    break
                size, correlation_id = _PREFIX.unpack_from(self._buffer, 0)
                if size < 4 or size > self._max:
                    # Not Kafka framing (or too large): stop rewriting, pass everything on.
                    self.failed = True
                    self.errors.append(f"response frame size {size} out of range; rewriting stopped")
                    out.append(bytes(self._buffer))
                    self._buffer.clear()
                    break
                wanted = self._expected.pop(correlation_id, None)
                if wanted is not None and carries_addresses(*wanted, self.node_endpoints):
                    self._holding = (size, *wanted)
                    continue
                take = min(len(self._buffer), 4 + size)
                out.append(bytes(self._buffer[:take]))
                self._passing = 4 + size - take
                del self._buffer[:take]
                if self._passing:
                    break
        return out

    def _rewritten(self, frame: bytes, api_key: int, version: int) -> bytes:
        try:
            new = self._rewrite(frame, api_key, version)
        except Exception as exc:  # nothing may break the stream: the response goes on unchanged
            self.errors.append(f"could not rewrite a response of api {api_key} v{version}: "
                               f"{type(exc).__name__}: {exc}")
            new = frame
        return struct.pack(">i", len(new)) + new
