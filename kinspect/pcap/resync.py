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


def _printable(data: bytes) -> bool:
    return all(0x20 <= b < 0x7F for b in data)


class HeaderCheck:
    """Says whether a frame header can start at a position: a size in range, then a header the codec accepts.

    Requests: an api key and version the specs know, a plausible client id, a header the
    codec decodes and a body that decodes. Responses: the correlation id of an outstanding
    request and a body that decodes as its answer. The whole frame is waited for (None
    until then), so a candidate can be at most whole_check_bytes long.
    """

    def __init__(self, codec: Codec, max_frame_bytes: int, whole_check_bytes: int = 1024 * 1024) -> None:
        self.codec = codec
        self.registry = codec.registry
        self.max_frame_bytes = max_frame_bytes
        # A candidate frame is only accepted once it is whole and its body decodes: a header alone
        # matches by chance inside record data too often. Larger frames cannot be candidates (a
        # stretch without sync is discarded up to the next frame of at most this size).
        self.whole_check_bytes = whole_check_bytes

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
        if size > self.whole_check_bytes:
            return False
        have = min(end - pos - 4, size)
        if have < size:
            return None
        frame = bytes(buf[pos + 4 : pos + 4 + size])
        try:
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
        if size > self.whole_check_bytes:
            return False
        if end - pos - 4 < size:
            return None
        api_key, version = request
        if self.registry.message(api_key, "response", version) is not None:
            try:
                self.codec.decode_response(bytes(buf[pos + 4 : pos + 4 + size]), api_key, version)
            except DecodeError:
                return False
            except Exception:
                return False
        return True


def _confirmed(buf, pos: int, limit: int) -> bool:
    """A candidate whose next frame's size prefix is already at hand must have a size in range there too."""
    after = pos + 4 + _SIZE.unpack_from(buf, pos)[0]
    if after + 4 > len(buf):
        return True
    return 0 <= _SIZE.unpack_from(buf, after)[0] <= limit


class Resync:
    """Looks for the next plausible frame header in a growing buffer, examining each position once.

    Positions that cannot be decided yet (too few bytes: a header cut by the end, or a
    candidate frame not whole yet) are kept and looked at again as bytes arrive; the first
    position that proves to be a frame wins, even over an undecided one before it (a whole,
    decoded frame is better evidence than a header that may sit inside a record).
    """

    __slots__ = ("check", "direction", "outstanding", "scanned", "undecided")

    def __init__(self, check: HeaderCheck, direction: str, outstanding: dict) -> None:
        self.check = check
        self.direction = direction
        self.outstanding = outstanding
        self.scanned = 0  # every position before this was examined
        self.undecided: list[int] = []

    def reset(self) -> None:
        self.scanned = 0
        self.undecided = []

    def _test(self, buf, pos: int):
        if self.direction == "request":
            return self.check.request_at(buf, pos)
        return self.check.response_at(buf, pos, self.outstanding)

    def _positions(self, buf, start: int):
        end = len(buf)
        if self.direction == "request" or len(self.outstanding) > 32:
            return range(start, end)
        # A response starts with a correlation id in flight: look for those four bytes only.
        hits = set()
        for cid in self.outstanding:
            needle = cid.to_bytes(4, "big", signed=True)
            at = buf.find(needle, start + 4)
            while at >= 0:
                hits.add(at - 4)
                at = buf.find(needle, at + 1)
        hits.update(range(max(start, end - 7), end))  # too short to tell yet
        return sorted(hits)

    def find(self, buf) -> tuple[int | None, int]:
        """(position of a frame, or None; the first byte still worth keeping)."""
        limit = self.check.max_frame_bytes
        still: list[int] = []
        for pos in self.undecided:
            verdict = self._test(buf, pos)
            if verdict is None:
                still.append(pos)
            elif verdict and _confirmed(buf, pos, limit):
                return pos, pos
        for pos in self._positions(buf, self.scanned):
            verdict = self._test(buf, pos)
            if verdict is None:
                still.append(pos)
            elif verdict and _confirmed(buf, pos, limit):
                return pos, pos
        self.scanned = len(buf)
        self.undecided = still
        return None, (still[0] if still else len(buf))

    def dropped(self, count: int) -> None:
        """The buffer lost its first count bytes."""
        self.scanned = max(0, self.scanned - count)
        self.undecided = [p - count for p in self.undecided if p >= count]
