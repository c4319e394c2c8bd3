"""The integer counters the event loop left for later (codegen.COUNT_LATER), counted in the capture's writer.

A capture's scans on the event loop do not count the integer fields of a frame scanned whole from bytes (but
for the apis the taker chose to count in the scan, capture.facts.FactsTaker.choose_counting): the SCAN carries
(frame, body start) instead, and the writer (its own process by default) counts them here, before the batch's
columns are built. Counting there and not on the event loop took the counters' allocation, zeroing
and adding out of the proxy's per-exchange work (docs/performance.md, nineteenth section). A side several rows
share is counted once and stays shared.
"""

from __future__ import annotations

from kinspect.protocol.codec.codec import DECODE_FAILURES
from kinspect.protocol.codec.wire_program import optional_extension
from kinspect.protocol.errors import DecodeError

REQUEST_SIDE, RESPONSE_SIDE, _FIELDS = 19, 28, 29  # capture.facts.FIELDS: request_side, response_side, their number
_API_KEY, _REQUEST_VERSION, _RESPONSE_VERSION = 7, 9, 21


# Bodies of at most this many bytes are remembered with their counters, CACHED_BODIES of them in all (at most 16
# MiB of bodies, then the cache starts again): most bodies but a producer's and a consumer's repeat (ApiVersions,
# Metadata, a group's heartbeats), and the event loop counted each of them once (the metrics' memo shares a repeated
# body's scan). A body is looked up by a fingerprint of its api version's scan and of it (in C a hash of the body,
# in Python its size and last bytes), then compared whole where it lies, with the scan: far less than its scan.
CACHED_BODY_BYTES = 16 * 1024
CACHED_BODIES = 1024


class LaterCounter:
    """Counts the integer fields of the sides whose counters were left for later, with a codec of its own."""

    def __init__(self, registry=None, native: bool = True) -> None:
        self.registry = registry  # None: the built-in specs
        self._codec = None  # made at the first side to count: a writer that never sees one never compiles
        # (api key, version, is request) -> (the C scan or None, its zeroed counters, its integer slots, the struct)
        self._scans: dict = {}
        # The bodies counted before: a fingerprint -> (their scan's entry above, the body, (int_slots, int_stats));
        # C's fingerprints and Python's differ.
        self._cache: dict = {}
        module = optional_extension("kinspect.capture._count_later") if native else None
        self._native = getattr(module, "count", None)

    def count(self, facts: list) -> list:
        """`facts` with every SCAN whose int_stats is (frame, pos) replaced by one holding the counters (or None
        and no slots where they cannot be counted); `facts` itself when there is none. In C where built
        (capture._count_later), else count_python, its reference."""
        native = self._native
        if native is None or type(facts) is not list:
            return self.count_python(facts)
        return native(facts, self._scans, self._scan_of, self._cache, CACHED_BODY_BYTES, CACHED_BODIES)

    def count_python(self, facts: list) -> list:
        """count(), in Python: the reference of capture._count_later (change both)."""
        done: dict = {}  # (id(side), api key, version) -> its counted side; the sides live in `facts` throughout
        out = None
        for i, row in enumerate(facts):
            if type(row) is not tuple or len(row) != _FIELDS:
                continue  # not an EXCHANGE: the builder says so
            req, resp = row[REQUEST_SIDE], row[RESPONSE_SIDE]
            new_req = new_resp = None
            if type(req) is tuple and type(req[4]) is tuple:
                key = (id(req), row[_API_KEY], row[_REQUEST_VERSION])  # as the row reads it, in facts made up too
                new_req = done.get(key)
                if new_req is None:
                    new_req = done[key] = self._counted(req, row[_API_KEY], row[_REQUEST_VERSION], True)
            if type(resp) is tuple and type(resp[4]) is tuple:
                key = (id(resp), row[_API_KEY], row[_RESPONSE_VERSION])
                new_resp = done.get(key)
                if new_resp is None:
                    new_resp = done[key] = self._counted(resp, row[_API_KEY], row[_RESPONSE_VERSION], False)
            if new_req is not None or new_resp is not None:
                if out is None:
                    out = list(facts)
                out[i] = (row[:REQUEST_SIDE] + (new_req if new_req is not None else req,)
                          + row[REQUEST_SIDE + 1:RESPONSE_SIDE] + (new_resp if new_resp is not None else resp,))
        return facts if out is None else out

    def _counted(self, side: tuple, api_key: int, version: int, request: bool) -> tuple:
        frame, pos = side[4]
        scan = self._scans.get((api_key, version, request))
        if scan is None:
            scan = self._scan_of(api_key, version, request)
        fresh, template, slots, compiled = scan
        if fresh is None and compiled is None:
            return side[:3] + ((), None) + side[5:]  # no integer fields, or an api the specs do not know
        key = None
        size = len(frame) - pos
        cache = self._cache
        if size <= CACHED_BODY_BYTES:
            # Found by its scan, size and last bytes, then compared whole where it lies (no copy, no hash of it all).
            key = (id(scan), size, frame[-8:])
            hit = cache.get(key)
            if hit is not None and hit[0] is scan and frame.endswith(hit[1]):
                return side[:3] + hit[2] + side[5:]
        try:
            if fresh is not None:
                result = fresh(frame, pos, template, slots)
            elif compiled is not None:
                result = compiled.scan_fresh(frame, pos, True)
            else:
                result = None
        except (DecodeError, *DECODE_FAILURES):  # it scanned well on the event loop: not expected
            result = None
        counted = ((), None) if result is None or result.int_stats is None else (result.int_slots, result.int_stats)
        if key is not None:
            if len(cache) >= CACHED_BODIES:
                cache.clear()  # a client making up bodies does not grow it without bound
            cache[key] = (scan, frame[pos:], counted)  # the entry keeps the scan alive: its id is no other's
        return side[:3] + counted + side[5:]

    def _scan_of(self, api_key: int, version: int, request: bool) -> tuple:
        if self._codec is None:
            from kinspect.protocol.codec import Codec
            from kinspect.protocol.specs.registry import SpecRegistry

            self._codec = Codec(self.registry or SpecRegistry.default())
        try:
            compiled = self._codec.body(api_key, "request" if request else "response", version)
        except DecodeError:
            compiled = None
        if compiled is None or not compiled.int_slots:
            scan = (None, None, (), None)
        else:
            scan = (compiled._scan_fresh, compiled._zero_stats, compiled.int_slots, compiled)
        if len(self._scans) < 4096:
            self._scans[(api_key, version, request)] = scan
        return scan
