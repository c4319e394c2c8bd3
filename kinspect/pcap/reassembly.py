"""kinspect's TCP reassembly of one direction: segments in any order to in-order bytes and counted gaps."""

from __future__ import annotations

_MASK = 0xFFFFFFFF
_HALF = 1 << 31


class Reassembler:
    """Orders one direction's segments by sequence number; `push` and `flush` call the framer.

    Retransmitted and overlapping bytes are delivered once (the first copy wins); a segment
    ahead of the next expected byte waits until the hole fills. When more than
    max_pending_bytes or max_pending_segments wait, or the flow ends, the hole is given up:
    the framer is told of a gap of that many bytes and delivery goes on past it. Offsets are
    64-bit stream offsets from the first byte (sequence numbers wrap at 2**32).
    """

    __slots__ = ("sink", "isn", "next", "pending", "pending_bytes", "max_pending_bytes", "max_pending_segments",
                 "started_mid", "retransmitted", "gap_bytes", "gaps", "acked", "fin_at")

    def __init__(self, sink, max_pending_bytes: int = 1024 * 1024, max_pending_segments: int = 256) -> None:
        self.sink = sink  # has data(offset, bytes, time) and gap(offset, count, time)
        self.isn: int | None = None  # sequence number of stream offset 0
        self.next = 0
        self.pending: dict[int, tuple[bytes, int, float]] = {}  # offset -> (data, missing, time)
        self.pending_bytes = 0
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_segments = max_pending_segments
        self.started_mid = False  # the SYN was not seen: offset 0 is the first byte captured
        self.retransmitted = 0
        self.gap_bytes = 0
        self.gaps = 0
        self.acked = 0  # the peer acknowledged every byte before this offset
        self.fin_at: int | None = None  # offset of the FIN: the stream's end

    def syn(self, seq: int) -> None:
        if self.isn is None:
            self.isn = (seq + 1) & _MASK

    def _offset(self, seq: int) -> int:
        rel = (seq - self.isn) & _MASK
        off = (self.next & ~_MASK) | rel
        if off - self.next > _HALF:
            off -= 1 << 32
        elif self.next - off > _HALF:
            off += 1 << 32
        return off

    def push(self, seq: int, data: bytes, missing: int, time: float) -> None:
        """One segment's payload as captured; missing: payload bytes the capture cut off its end."""
        if self.isn is None:
            self.isn = seq
            self.started_mid = True
        off = self._offset(seq)
        nxt = self.next
        if off == nxt and not self.pending:  # the common case: in order, nothing waiting
            self._deliver(off, data, missing, time)
            return
        end = off + len(data) + missing
        if end <= nxt:
            self.retransmitted += len(data)
            return
        if off > nxt:
            held = self.pending.get(off)
            if held is None or len(held[0]) + held[1] < len(data) + missing:
                self.pending_bytes += len(data) - (len(held[0]) if held else 0)
                self.pending[off] = (data, missing, time)
            if self.pending_bytes > self.max_pending_bytes or len(self.pending) > self.max_pending_segments:
                self._give_up(time)
            return
        self._deliver(off, data, missing, time)
        self._drain()

    def _deliver(self, off: int, data: bytes, missing: int, time: float) -> None:
        """Deliver a segment that starts at or before next (its already-delivered part is trimmed)."""
        cut = self.next - off
        if cut > 0:
            self.retransmitted += min(cut, len(data))
            if cut >= len(data):
                missing -= cut - len(data)
                data = b""
            else:
                data = data[cut:]
            off = self.next
        if data:
            self.sink.data(off, data, time)
            off += len(data)
        if missing > 0:
            self.gaps += 1
            self.gap_bytes += missing
            self.sink.gap(off, missing, time)
            off += missing
        self.next = off

    def _drain(self) -> None:
        pending = self.pending
        while pending:
            first = min(pending)
            if first > self.next:
                return
            data, missing, time = pending.pop(first)
            self.pending_bytes -= len(data)
            if first + len(data) + missing <= self.next:
                self.retransmitted += len(data)
                continue
            self._deliver(first, data, missing, time)

    def _give_up(self, time: float) -> None:
        """The hole before the first waiting segment will not fill: report it and move on."""
        first = min(self.pending)
        hole = first - self.next
        self.gaps += 1
        self.gap_bytes += hole
        self.sink.gap(self.next, hole, self.pending[first][2])
        self.next = first
        self._drain()

    def ack(self, seq: int) -> None:
        """The peer acknowledged up to seq: those bytes were sent, captured or not."""
        if self.isn is not None:
            off = self._offset(seq)
            if off > self.acked:
                self.acked = off

    def fin(self, seq: int, length: int) -> None:
        if self.isn is not None:
            self.fin_at = self._offset(seq) + length

    def flush(self, time: float) -> None:
        """The flow ended: every hole still open is a gap, up to the FIN or the peer's last ACK."""
        while self.pending:
            self._give_up(time)
        end = self.fin_at if self.fin_at is not None else self.acked
        if end > self.next:  # the last segments were sent (acknowledged) but not captured
            hole = end - self.next
            self.gaps += 1
            self.gap_bytes += hole
            self.sink.gap(self.next, hole, time)
            self.next = end
