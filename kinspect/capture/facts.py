"""What the capture ships to its writer thread for one exchange: facts the event loop has, never frames or a codec.

The facts of each direction come from the event's cached scan (the one the metrics read
too; see ScanResult's capture facts): tag sections, tagged fields, error codes, integer
slots, topics with their partition counts, the compact-size delta and the record-batch
summaries. Everything shipped is immutable or never written again after the scan, so
the writer thread reads it without a lock.

One exchange is one flat tuple (cheapest to build on the event loop; the writer thread
transposes a batch of them into columns, capture.batch). Its fields, by index (FIELDS):

    request_time, latency, connection_id, client_address, broker, node_id, client_id,
    api_key, api_name, request_version, request_header_version, correlation_id,
    request_size, request_header_size, request_complete, request_header_tag_bytes,
    request_header_tags, flexible, first_flexible_version, client_software_name,
    client_software_version, REQUEST_SIDE,
    response_time, response_version, response_header_version, response_size,
    response_header_size, response_complete, response_header_tag_bytes,
    response_header_tags, RESPONSE_SIDE          (the response's nine are None without one)

    SIDE = a str (why the body has no facts: not inspected, unknown api, decode error)
           or the event's finished ScanResult, detached from its frame (ScanResult.detached)
"""

from __future__ import annotations

from kinspect.protocol.errors import DecodeError, UnknownApiError
from kinspect.protocol.codec.scan_result import ScanResult

FIELDS = ("request_time", "latency", "connection_id", "client_address", "broker", "node_id", "client_id",
          "api_key", "api_name", "request_version", "request_header_version", "correlation_id",
          "request_size", "request_header_size", "request_complete", "request_header_tag_bytes",
          "request_header_tags", "flexible", "first_flexible_version", "client_software_name",
          "client_software_version", "request_side",
          "response_time", "response_version", "response_header_version", "response_size",
          "response_header_size", "response_complete", "response_header_tag_bytes",
          "response_header_tags", "response_side")
NO_RESPONSE = (None,) * 9

# Bytes one exchange's facts hold in the queue, beside its integer counters (8 bytes each)
# and topics: a fixed estimate of the tuples, the ScanResult objects and their lists.
BASE_BYTES = 1024
TOPIC_BYTES = 120


def _side(event):
    """SIDE of one direction: its detached scan, or why there is none."""
    if not event.complete:
        return f"the {event.size}-byte frame was larger than the inspection limit; only its header was kept"
    try:
        # Record summaries are read now, from the frame (the writer never sees it); the metrics
        # read the same cached summaries.
        return event.scan().detached()
    except UnknownApiError as exc:
        return exc.reason
    except DecodeError as exc:
        return str(exc)


class FactsTaker:
    """Builds EXCHANGE tuples; keeps per (api key, version) what the specs say of the request."""

    def __init__(self, codec) -> None:
        """codec: the one the events scan with; its scans count integer fields from now on."""
        codec.integer_facts = True
        self.registry = codec.registry
        self._versions: dict = {}  # api key << 16 | version -> (flexible, first flexible version)

    def _version_facts(self, key: int) -> tuple:
        api_key, version = key >> 16, key & 0xFFFF
        spec = self.registry.message(api_key, "request", version)
        if spec is None:
            facts = (False, None)
        else:
            flexible = spec.flexible_versions
            facts = (version in flexible, None if flexible.empty else flexible.low)
        self._versions[key] = facts
        return facts

    def take(self, exchange) -> tuple[tuple, int]:
        """(EXCHANGE, bytes it holds) of an Exchange event.

        Written for the event loop, where it runs once per exchange: the header's fields are
        read from the header itself (not through the event's properties), every attribute
        once, and a scan already detached is not detached again (one attribute read).
        """
        request, response = exchange.request, exchange.response
        header = request.header
        api_key, version = header.api_key, header.api_version
        key = api_key << 16 | (version & 0xFFFF)
        spec = self._versions.get(key) or self._version_facts(key)
        held = BASE_BYTES
        complete = request.complete
        req = None
        if complete:
            try:
                req = request.scan()
            except DecodeError:
                pass
            else:
                if req.source is not None:
                    req.detached()
                stats = req.int_stats
                held += (0 if stats is None else len(stats) << 3) + TOPIC_BYTES * len(req.topic_partitions)
        if req is None:
            req = _side(request)
        connection = request.connection
        facts = (request.time, exchange.latency, connection.id, connection.client_address, connection.broker,
                 connection.node_id, header.client_id, api_key, request.api_name, version, header.version,
                 header.correlation_id, request.size, header.size, complete, request.header_tag_bytes,
                 request.header_tags, spec[0], spec[1], connection.client_software_name,
                 connection.client_software_version, req)
        if response is None:
            return facts + NO_RESPONSE, held
        side = None
        complete = response.complete
        if complete:
            try:
                side = response.scan()
            except DecodeError:
                pass
            else:
                if side.source is not None:
                    side.detached()
                stats = side.int_stats
                held += (0 if stats is None else len(stats) << 3) + TOPIC_BYTES * len(side.topic_partitions)
        if side is None:
            side = _side(response)
        return facts + (response.time, response.api_version, response.header_version, response.size,
                        response.header_size, complete, response.header_tag_bytes, response.header_tags,
                        side), held
