"""What the capture ships to its writer thread for one exchange: facts the event loop has, never frames or a codec.

The facts of each direction come from the event's cached scan (the one the metrics read
too; see ScanResult's capture facts): tag sections, tagged fields, error codes, integer
slots, topics with their partition counts, the compact-size delta and the record-batch
summaries. Everything shipped is immutable or never written again after the scan, so
the writer thread reads it without a lock.

One exchange is one flat tuple (cheapest to build on the event loop; the writer thread
transposes a batch of them into columns, capture.batch, and adds what follows from the
specs alone, such as whether the version is flexible). Its fields, by index (FIELDS):

    request_time, latency, connection_id, client_address, broker, node_id, client_id,
    api_key, api_name, request_version, request_header_version, correlation_id,
    request_size, request_header_size, request_complete, request_header_tag_bytes,
    request_header_tags, client_software_name, client_software_version, REQUEST_SIDE,
    response_time, response_version, response_header_version, response_size,
    response_header_size, response_complete, response_header_tag_bytes,
    response_header_tags, RESPONSE_SIDE          (the response's nine are None without one)

    SIDE = a str (why the body has no facts: not inspected, unknown api, decode error)
           or SCAN, the facts of the event's scan (ScanResult.frozen()):
    SCAN = (tag_section_bytes, tagged_fields, compact_delta, int_slots, int_stats,
            topic_partitions, error_codes, RECORDS)
    RECORDS = per records field, None (not a record set) or a tuple of its batches'
            (magic, record count, compression, batch length)
           tuples only (topic_partitions and error_codes as their dicts' (key, value)
           items), and int_stats as the bytes of the scan's int32 counters (None without
           integer fields), or, for a frame scanned whole from bytes, (frame, body start): the
           writer counts those (capture.count_later), off the event loop. The ScanResult and
           its lists stay on the event loop and die with the event.

Why tuples, not the ScanResult: the garbage collector stops tracking a tuple of atomic
values (and of such tuples) once it has seen it; a dict, list or array in it, even an
untracked one, keeps it tracked; bytes are never tracked. Facts
that wait in the queue are then never promoted to the old generation; a ScanResult and
its lists were, ~15 objects an exchange, which made CPython's full collections (tens of
ms holding the GIL, a few per second under load) a large part of the capture's cost.
"""

from __future__ import annotations

from kinspect.protocol.codec.codegen import COUNT_LATER
from kinspect.protocol.errors import DecodeError, UnknownApiError

FIELDS = ("request_time", "latency", "connection_id", "client_address", "broker", "node_id", "client_id",
          "api_key", "api_name", "request_version", "request_header_version", "correlation_id",
          "request_size", "request_header_size", "request_complete", "request_header_tag_bytes",
          "request_header_tags", "client_software_name",
          "client_software_version", "request_side",
          "response_time", "response_version", "response_header_version", "response_size",
          "response_header_size", "response_complete", "response_header_tag_bytes",
          "response_header_tags", "response_side")

_REQUEST_SIDE, _RESPONSE_SIDE = FIELDS.index("request_side"), FIELDS.index("response_side")
assert _RESPONSE_SIDE == len(FIELDS) - 1  # share_alike_sides rebuilds a row with it last
_RECORDS = 7  # a SCAN's record summaries: where two scans of one producer's requests differ when they do
_NOT_STATS = (0, 1, 2, 3, 5, 6, 7)  # a SCAN's items but its integer counters


def share_alike_sides(facts: list) -> list:
    """The exchanges, each SIDE equal in content to the previous row's but another object replaced by that object:
    in C where built (capture._take), else share_alike_sides_python, its reference."""
    native = _batch_functions()
    if native is None or type(facts) is not list:
        return share_alike_sides_python(facts)
    return native[0](facts, _REQUEST_SIDE, _RESPONSE_SIDE, _RECORDS)


def held_total(facts: list) -> int:
    """held_bytes summed over a batch the writer thread takes: in C where built (capture._take)."""
    native = _batch_functions()
    if native is None or type(facts) is not list:
        return sum(map(held_bytes, facts))
    return native[1](facts, BASE_BYTES, TOPIC_BYTES, _REQUEST_SIDE, _RESPONSE_SIDE)


_BATCH: list = []  # [(share_alike_sides, held_total) of capture._take, or None], looked for once


def _batch_functions():
    """capture._take's share_alike_sides and held_total, or None where not built (or built before them)."""
    if not _BATCH:
        from kinspect.protocol.codec.wire_program import optional_extension

        take = optional_extension("kinspect.capture._take")
        _BATCH.append(None if take is None or not hasattr(take, "held_total")
                      else (take.share_alike_sides, take.held_total))
    return _BATCH[0]


def share_alike_sides_python(facts: list) -> list:
    """share_alike_sides in Python, the reference of capture._take's.

    Each side alike its own api's previous SCAN is that SCAN already (the taker's memo, FactsTaker._side): a
    producer's requests, scanned anew each time, came with SCANs of their own before it, each pickled,
    unpickled and worked out anew by the row builder (capture.batch), 10-15 µs a row of the small-request
    benchmark's produce in-process. What is left here is sides alike across apis, mostly requests without
    facts (123 of 774 rows of the recorded traffic): shared, a batch's message holds a side once and the builder
    works it out once (docs/performance.md). Rows whose sides are the previous row's objects cost an
    identity check. A row is rebuilt only if a side changes; the records are compared first, where unlike
    scans usually differ."""
    out = []
    append = out.append
    seen_req = seen_resp = kept_req = kept_resp = None  # the previous row's sides, and the objects kept for them
    for row in facts:
        req, resp = row[_REQUEST_SIDE], row[_RESPONSE_SIDE]
        if req is not seen_req:
            seen_req = req
            if not (type(req) is tuple and type(kept_req) is tuple and req[_RECORDS] == kept_req[_RECORDS]
                    and req == kept_req):
                kept_req = req
        if resp is not seen_resp:
            seen_resp = resp
            if not (type(resp) is tuple and type(kept_resp) is tuple and resp[_RECORDS] == kept_resp[_RECORDS]
                    and resp == kept_resp):
                kept_resp = resp
        if req is kept_req and resp is kept_resp:
            append(row)
        else:
            append(row[:_REQUEST_SIDE] + (kept_req,) + row[_REQUEST_SIDE + 1:_RESPONSE_SIDE] + (kept_resp,))
    return out


# Bytes one exchange's facts hold in the queue, beside its integer counters (4 bytes each) or the frames
# whose counters the writer counts, and topics: a fixed estimate of the tuples, the ScanResult objects and their lists.
BASE_BYTES = 1024
TOPIC_BYTES = 120


def held_bytes(facts: tuple) -> int:
    """The bytes an EXCHANGE holds, as FactsTaker.take counted them (the writer counts them again as it takes it)."""
    held = BASE_BYTES
    for side in (facts[19], facts[28]):
        if type(side) is tuple:
            stats = side[4]
            if stats is not None:
                held += len(stats[0]) if type(stats) is tuple else len(stats)  # a frame to count later, or counters
            held += TOPIC_BYTES * len(side[5])
    return held


def _reason(event) -> str:
    """Why a direction has no SCAN: not inspected whole, or its scan's decode error."""
    if not event.complete:
        return f"the {event.size}-byte frame was larger than the inspection limit; only its header was kept"
    try:
        event.scan()
    except UnknownApiError as exc:
        return exc.reason
    except DecodeError as exc:
        return str(exc)
    raise AssertionError("a scan that succeeded has facts, not a reason")


def _native_taker(fallback, choose_counting):
    """The C taker (capture._take.Taker) calling fallback for what it leaves; None where it is not built or
    the codec's C extension is off (KINSPECT_PURE_PYTHON=1), or the event classes lost their slots."""
    from kinspect.protocol.codec.wire_program import native_module, optional_extension

    native = native_module()
    take = optional_extension("kinspect.capture._take")
    if native is None or not native.SCAN_RESULT_FAST_PATH or take is None:
        return None
    from kinspect.protocol.codec import RequestHeader
    from kinspect.protocol.codec.scan_result import ScanResult, batch_fields
    from kinspect.session.events import ConnectionInfo, Exchange, Request, Response

    try:
        return take.Taker((Exchange, Request, Response, RequestHeader, ConnectionInfo, ScanResult), native.capture_side,
                     batch_fields(), BASE_BYTES, TOPIC_BYTES, fallback, choose_counting)
    except TypeError:  # a class without the slots the taker reads: the Python taker does it all
        return None


class FactsTaker:
    """Builds EXCHANGE tuples from Exchange events."""

    def __init__(self, codec, native: bool = True) -> None:
        """codec: the one the events scan with; its scans gather integer fields from now on (see codegen.COUNT_LATER).

        native: take facts in C (capture._take) where it is built; take_python stays the reference
        and takes what the C taker leaves (a side without facts: it says why)."""
        # Counted later: a frame scanned whole from bytes reaches the writer process as it is, which counts its
        # integer fields there (capture.count_later); frames in pieces are counted on the event loop, and so are
        # the frames of an api whose sides are alike but for their values (choose_counting).
        codec.integer_facts = COUNT_LATER
        self._codec = codec
        # (api key, direction) -> (scan, its SCAN, the bytes it holds) of the latest exchange: events
        # whose body was seen before share one scan (the metrics' memo), so its SCAN is built once.
        self._sides: dict[tuple[int, int], tuple] = {}
        # take(exchange) -> (EXCHANGE, bytes it holds): the C taker, or take_python.
        self.take = (native and _native_taker(self.take_python, self.choose_counting)) or self.take_python

    def choose_counting(self, api_key: int, version: int, request: bool, now: bool) -> None:
        """Count this api version's whole frames in the scan (now) or leave them to the writer.

        Counting later keeps the event loop's part small where bodies are new, but a side whose counters
        are left for later is alike its api's previous one only where the bodies are equal. A producer's
        acknowledgements (new offsets) and a consumer's fetches repeat every fact but their values: counted in
        the scan, their counters come out equal and the side is shared (nothing built on the event loop, one
        side a batch for the writer); left for later, each is a side of its own, counted by the writer (about 5
        µs a row more there). So the taker (_side, capture._take's side_of) asks for counting now when a side
        came out alike but for its frame, and for counting later again when a counted side was not alike a
        counted previous one."""
        self._codec.count_now(api_key, version, request, now)  # nothing done where it is so already

    def _side(self, key: tuple[int, int], scan, version: int) -> tuple[tuple, int]:
        """SCAN of a scan (ScanResult.frozen(), built in C) and the bytes it holds beside BASE_BYTES: the
        previous SCAN of the key itself when equal to it, as capture._take's side_of."""
        last = self._sides.get(key)
        if last is not None and last[0] is scan:
            return last[1], last[2]
        side = scan.frozen(last[1] if last is not None else None)
        if last is not None and side is last[1]:
            self._sides[key] = (scan, side, last[2])
            return side, last[2]
        stats = side[4]
        if last is not None:
            previous = last[1]
            if type(stats) is tuple:
                if all(side[i] is previous[i] for i in _NOT_STATS):  # alike but for its frame
                    self.choose_counting(key[0], version, key[1] == 0, True)
            elif type(stats) is bytes and type(previous[4]) is bytes:  # counted, not alike a counted one: no gain
                self.choose_counting(key[0], version, key[1] == 0, False)
        held = TOPIC_BYTES * len(side[5])
        if stats is not None:
            held += len(stats[0]) if type(stats) is tuple else len(stats)  # a frame to count later, or counters
        if len(self._sides) < 4096 or key in self._sides:
            self._sides[key] = (scan, side, held)
        return side, held

    def take_python(self, exchange) -> tuple[tuple, int]:
        """(EXCHANGE, bytes it holds) of an Exchange event (the reference of the C taker).

        Written for the event loop, where it runs once per exchange: the header's fields are
        read from the header itself (not through the event's properties), every attribute
        once; each side's SCAN is built once per scan (_side), and scans repeat: the metrics'
        memo hands the scan of a body seen before to the events that carry it again.
        """
        request, response = exchange.request, exchange.response
        header = request.header
        api_key, version = header.api_key, header.api_version
        held = BASE_BYTES
        complete = request.complete
        req = None
        if complete:
            try:
                scan = request.scan()  # the metrics' scan, cached on the event
            except DecodeError:
                scan = None
            if scan is not None:
                req, extra = self._side((api_key, 0), scan, version)
                held += extra
        if req is None:
            req = _reason(request)
        connection = request.connection
        if response is None:
            return (request.time, exchange.latency, connection.id, connection.client_address, connection.broker,
                    connection.node_id, header.client_id, api_key, request.api_name, version, header.version,
                    header.correlation_id, request.size, header.size, complete, request.header_tag_bytes,
                    request.header_tags, connection.client_software_name,
                    connection.client_software_version, req, None, None, None, None, None, None, None, None,
                    None), held
        side = None
        if response.complete:
            try:
                scan = response.scan()
            except DecodeError:
                scan = None
            if scan is not None:
                side, extra = self._side((api_key, 1), scan, response.api_version)
                held += extra
        if side is None:
            side = _reason(response)
        return (request.time, exchange.latency, connection.id, connection.client_address, connection.broker,
                connection.node_id, header.client_id, api_key, request.api_name, version, header.version,
                header.correlation_id, request.size, header.size, complete, request.header_tag_bytes,
                request.header_tags, connection.client_software_name,
                connection.client_software_version, req, response.time, response.api_version,
                response.header_version, response.size, response.header_size, response.complete,
                response.header_tag_bytes, response.header_tags, side), held
