"""Session events of a pcap flow to the JSON records of `kinspect decode` (built by offline_decode), plus gaps."""

from __future__ import annotations

from kinspect.offline_decode import DecodeStats, problem_record, request_record, response_record
from kinspect.session import Exchange, Problem, Request, Response

ACKS_ZERO_KEPT = 1024  # acks=0 Produce correlation ids remembered per flow (a broker may answer them anyway)


class RecordBuilder:
    """Builds decode records; each carries the flow, its connection number and the packet time.

    `offset` is the frame's offset in its direction of the flow as captured (the session's
    own count skips what a gap lost).
    """

    def __init__(self, codec, stats: DecodeStats | None = None, roundtrip: bool = False) -> None:
        self.codec = codec
        self.stats = stats if stats is not None else DecodeStats()
        self.roundtrip = roundtrip  # re-encode every whole frame and compare, as `kinspect decode --roundtrip`
        self.acks_zero: dict[int, dict[int, int]] = {}  # flow id -> correlation id -> Produce version

    @staticmethod
    def _where(flow, time: float) -> dict:
        return {"flow": flow.name, "connection": flow.id, "time": round(time, 6)}

    def frame_records(self, flow, direction: str, offset: int, time: float, events: list,
                      frame: bytes = b"") -> list[dict]:
        """The records of one frame (its bytes, or its head when over the inspection limit) from its events."""
        records = []
        stats = self.stats
        for event in events:
            kind = type(event)
            if kind is Request:
                record = request_record(event, self.roundtrip and event.complete, stats)
                if not event.expects_response:
                    acks = self.acks_zero.setdefault(flow.id, {})
                    acks[event.correlation_id] = event.api_version
                    if len(acks) > ACKS_ZERO_KEPT:
                        del acks[next(iter(acks))]
                self._limit(record, event)
            elif kind is Response:
                record = response_record(event, self.roundtrip and event.complete, stats)
                self._limit(record, event)
            elif kind is Problem:
                record = problem_record(self.codec, event, self.acks_zero.get(flow.id, {}), self.roundtrip, stats)
                if record is None:
                    continue
                if event.kind == "unpaired_response" and "warning" not in record:
                    # Counted as unpaired, not as a decoding failure: in a capture its request
                    # may simply have been lost (a gap, a capture started mid-stream).
                    stats.decode_errors -= 1
            elif kind is Exchange and event.response is not None and records:
                records[-1]["latency"] = round(event.latency, 6)
                continue
            else:
                continue
            record["offset"] = offset
            records.append({**self._where(flow, time), **record})
        return records

    def _limit(self, record: dict, event) -> None:
        if not event.complete and record.get("error") is not None:
            self.stats.decode_errors -= 1  # not a decoding failure: the frame was over the inspection limit
            record["error"] = {"reason": f"the {event.size}-byte frame was larger than the inspection limit; "
                                         "only its header was kept"}
            record.pop("body", None)

    def note_record(self, flow, direction: str, item: tuple) -> dict:
        kind, offset = item[0], item[1]
        record = {**self._where(flow, item[-1]), "direction": direction, "offset": offset}
        if kind == "gap":
            record["gap"] = item[2]
        elif kind == "discarded":
            record["discarded"] = item[2]
        else:
            record["resync"] = True
        return record

    def close_records(self, flow, events: list) -> list[dict]:
        self.acks_zero.pop(flow.id, None)
        return [{**self._where(flow, e.time), "direction": e.direction, "unanswered": e.detail}
                for e in events if type(e) is Problem and e.kind == "unanswered"]
