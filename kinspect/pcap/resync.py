"""Finding the next plausible Kafka frame header in a byte stream whose framing was lost (a gap, a mid-stream start)."""

from __future__ import annotations

import struct

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError

_SIZE = struct.Struct(">i")
_REQUEST_PREFIX = struct.Struct(">ihhih")  # size, api key, api version, correlation id, client id length
_RESPONSE_PREFIX = struct.Struct(">ii")  # size, correlation id
MAX_CLIENT_ID = 1024  # longer client ids are legal but not plausible enough to regain sync on
MIN_REQUEST = 10  # api key, version, correlation id, client id length
FOUND, NEED_MORE = "found", "need_more"


def _printable(data: bytes) -> bool:
    return all(0x20 <= b < 0x7F for b in data)


class HeaderCheck:
    """Says whether a frame header can start at a position: a size in range, then a header the codec accepts.

    Requests: an api key and version the specs know, a plausible client id, a header the
    codec decodes and, when the whole frame is at hand, a body that decodes. Responses: the
    correlation id of an outstanding request, and a body that decodes as its answer when
    the whole frame is at hand.
    """

    def __init__(self, codec: Codec, max_frame_bytes: int) -> None:
        self.codec = codec
        self.registry = codec.registry
        self.max_frame_bytes = max_frame_bytes

    def request_at(self, buf, pos: int) -> bool | None:
        """True/False, or None when the buffer ends before the header does."""
        end = len(buf)
        if end - pos < 14:
            return None
        size, api_key, version, _, client_len = _REQUEST_PREFIX.unpack_from(buf, pos)
        if size < MIN_REQUEST or size > self.max_frame_bytes or api_key < 0 or version < 0:
            return False
        if self.registry.message(api_key, "request", version) is None:
            return False
        if client_len < -1 or client_len > MAX_CLIENT_ID or client_len > size - MIN_REQUEST:
            return False
        if client_len > 0:
            if end - pos < 14 + client_len:
                return None
            if not _printable(bytes(buf[pos + 14 : pos + 14 + client_len])):
                return False
        have = min(end - pos - 4, size)
        frame = bytes(buf[pos + 4 : pos + 4 + have])
        try:
            self.codec.decode_request_header(frame)
            if have == size:
                self.codec.decode_request(frame)
        except DecodeError:
            return False
        except Exception:  # a header the codec cannot read at all is no header
            return False
        return True

    def response_at(self, buf, pos: int, outstanding: dict) -> bool | None:
        """outstanding maps correlation id -> (api key, api version) of requests not yet answered."""
        end = len(buf)
        if end - pos < 8:
            return None
        size, correlation_id = _RESPONSE_PREFIX.unpack_from(buf, pos)
        if size < 4 or size > self.max_frame_bytes:
            return False
        request = outstanding.get(correlation_id)
        if request is None:
            return False
        if end - pos - 4 >= size:
            api_key, version = request
            if self.registry.message(api_key, "response", version) is not None:
                try:
                    self.codec.decode_response(bytes(buf[pos + 4 : pos + 4 + size]), api_key, version)
                except DecodeError:
                    return False
                except Exception:
                    return False
        return True


def scan(check: HeaderCheck, buf, start: int, direction: str, outstanding: dict) -> tuple[str | None, int]:
    """The first plausible header at or after start: (FOUND, pos), (NEED_MORE, pos) or (None, len(buf)).

    NEED_MORE: the bytes from pos on may start a header but the buffer ends too soon to tell.
    A candidate whose next frame's size prefix is already in the buffer must have a size in
    range there too, which rules out most chance matches inside a body.
    """
    end = len(buf)
    limit = check.max_frame_bytes
    if direction == "response" and len(outstanding) <= 32:
        return _scan_responses(check, buf, start, outstanding)
    test = check.request_at if direction == "request" else (lambda b, p: check.response_at(b, p, outstanding))
    pos = start
    while pos < end:
        verdict = test(buf, pos)
        if verdict is None:
            return NEED_MORE, pos
        if verdict and _confirmed(buf, pos, limit):
            return FOUND, pos
        pos += 1
    return None, end


def _confirmed(buf, pos: int, limit: int) -> bool:
    after = pos + 4 + _SIZE.unpack_from(buf, pos)[0]
    if after + 4 > len(buf):
        return True
    return 0 <= _SIZE.unpack_from(buf, after)[0] <= limit


def _scan_responses(check: HeaderCheck, buf, start: int, outstanding: dict) -> tuple[str | None, int]:
    """Responses start with a known correlation id: look for those four bytes rather than try every offset."""
    end = len(buf)
    data = bytes(buf) if not isinstance(buf, bytes) else buf
    needles = [cid.to_bytes(4, "big", signed=True) for cid in outstanding]
    pos = start
    while True:
        hits = [h for h in (data.find(n, pos + 4) for n in needles) if h >= 0]
        if not hits:
            # A header may straddle the end: keep the last 7 bytes undecided.
            tail = max(start, end - 7)
            return (NEED_MORE, tail) if tail < end else (None, end)
        pos = min(hits) - 4
        verdict = check.response_at(data, pos, outstanding)
        if verdict is None:
            return NEED_MORE, pos
        if verdict and _confirmed(data, pos, check.max_frame_bytes):
            return FOUND, pos
        pos += 1
