"""One direction's reassembled bytes to Kafka frames, across gaps: keeps sync where it can, resyncs where it must."""

from __future__ import annotations

import struct

from kinspect.pcap.resync import HeaderCheck, Resync

_SIZE = struct.Struct(">i")
# A direction that has not yielded one frame in this many bytes is not Kafka (TLS, another
# protocol): its bytes are counted as discarded without being searched any more.
NOT_KAFKA_BYTES = 1024 * 1024


class StreamFramer:
    """Frames one direction of a flow; emits tuples to `out`.

    ("frame", offset, size, data, complete, time): data is the whole frame when complete,
    else its first head_bytes (the frame was larger than keep_limit);
    ("gap", offset, missing, time): bytes the capture does not have;
    ("discarded", offset, count, time): bytes seen but not framed while regaining sync;
    ("resync", offset, time): framing found again at offset.
    A frame cut by a gap is never emitted; one whose head was emitted stays emitted.
    """

    __slots__ = ("direction", "check", "outstanding", "max_frame_bytes", "keep_limit", "head_bytes", "out",
                 "synced", "_buf", "_buf_offset", "_skip", "_resync", "frames", "discarded", "abandoned",
                 "_ignored")

    def __init__(self, direction: str, check: HeaderCheck, outstanding: dict, out: list, *, synced: bool,
                 keep_limit: int, head_bytes: int = 512) -> None:
        self.direction = direction
        self.check = check
        self.outstanding = outstanding  # shared with the other direction: correlation id -> (api key, version)
        self.max_frame_bytes = check.max_frame_bytes
        self.keep_limit = keep_limit
        self.head_bytes = head_bytes
        self.out = out
        self.synced = synced
        self._buf = bytearray()
        self._buf_offset = 0  # stream offset of _buf[0]
        self._skip = 0  # bytes of a large frame (head already emitted) still to pass over
        self._resync = Resync(check, direction, outstanding)
        self.frames = 0
        self.discarded = 0
        self.abandoned = False
        self._ignored = None  # [offset, count, time] of the bytes passed over since abandoning

    def data(self, offset: int, data: bytes, time: float) -> None:
        if self.abandoned:  # reported once, as one stretch, when the flow ends
            self.discarded += len(data)
            if self._ignored is None:
                self._ignored = [offset, 0, time]
            self._ignored[1] += len(data)
            self._ignored[2] = time
            return
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            offset += n
            data = data[n:]
            if not data:
                return
        if not self._buf:
            self._buf_offset = offset
        self._buf += data
        if self.synced:
            self._frames(time)
        else:
            self._regain(time)

    def gap(self, offset: int, missing: int, time: float) -> None:
        self.out.append(("gap", offset, missing, time))
        if self.abandoned:
            return
        if self._skip >= missing:  # inside a large frame already reported: sync holds
            self._skip -= missing
            return
        if self._skip:
            missing -= self._skip
            offset += self._skip
            self._skip = 0
        buf = self._buf
        if self.synced and len(buf) >= 4:
            # The gap may fall inside the frame being collected: drop that frame, keep sync after it.
            size = _SIZE.unpack_from(buf, 0)[0]
            frame_end = self._buf_offset + 4 + size
            if offset + missing <= frame_end:
                self._drop(len(buf), time)
                self._skip = frame_end - offset - missing
                return
        self._drop(len(buf), time)
        self.synced = False
        self._resync.reset()

    def finish(self, time: float) -> None:
        """The flow ended: whatever is held is an incomplete frame or unsynced bytes."""
        self._drop(len(self._buf), time)
        if self._ignored is not None:
            self.out.append(("discarded", self._ignored[0], self._ignored[1], self._ignored[2]))
            self._ignored = None

    # ------------------------------------------------------------------ internals

    def _drop(self, count: int, time: float) -> None:
        if count:
            self.out.append(("discarded", self._buf_offset, count, time))
            self.discarded += count
            del self._buf[:count]
            self._buf_offset += count
            self._resync.dropped(count)

    def _frames(self, time: float) -> None:
        buf, out = self._buf, self.out
        pos, end = 0, len(buf)
        unpack = _SIZE.unpack_from
        outstanding, requests = self.outstanding, self.direction == "request"
        base = self._buf_offset
        while end - pos >= 4:
            size = unpack(buf, pos)[0]
            if size < 0 or size > self.max_frame_bytes:
                # Not a Kafka size: framing is lost here (non-Kafka bytes, or a gap we did not see).
                self.synced = False
                self._resync.reset()
                break
            if size > self.keep_limit:
                head = min(self.head_bytes, size)
                if end - pos - 4 < head:
                    break
                frame = bytes(buf[pos + 4 : pos + 4 + head])
                have = min(end - pos - 4, size)
                out.append(("frame", base + pos, size, frame, False, time))
                self.frames += 1
                self._note(frame, requests, outstanding)
                pos += 4 + have
                if have < size:
                    self._skip = size - have
                    break
                continue
            if end - pos - 4 < size:
                break
            frame = bytes(buf[pos + 4 : pos + 4 + size])
            out.append(("frame", base + pos, size, frame, True, time))
            self.frames += 1
            self._note(frame, requests, outstanding)
            pos += 4 + size
        if pos:
            del buf[:pos]
            self._buf_offset += pos
        if not self.synced:
            self._regain(time)

    @staticmethod
    def _note(frame: bytes, requests: bool, outstanding: dict) -> None:
        """Track correlation ids in flight: responses can only regain sync on one of them."""
        if requests:
            if len(frame) >= 8:
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
                outstanding[correlation_id] = (api_key, version)
                if len(outstanding) > 1024:
                    del outstanding[next(iter(outstanding))]
        elif len(frame) >= 4:
            outstanding.pop(_SIZE.unpack_from(frame, 0)[0], None)

    def _regain(self, time: float) -> None:
        found, keep_from = self._resync.find(self._buf)
        if found is None and not self.frames and self.discarded + keep_from > NOT_KAFKA_BYTES:
            self._drop(len(self._buf), time)
            self.abandoned = True
            return
        if found is None:
            # Keep at most one candidate frame's worth of bytes waiting for a decision.
            self._drop(max(keep_from, len(self._buf) - self.check.whole_check_bytes - 64), time)
            return
        self._drop(found, time)
        self._resync.reset()
        self.synced = True
        self.out.append(("resync", self._buf_offset, time))
        self._frames(time)
