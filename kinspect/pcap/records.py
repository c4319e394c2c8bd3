"""Session events of a pcap flow to the JSON records of `kinspect decode` (built by offline_decode), plus gaps."""

from __future__ import annotations

from kinspect.offline_decode import DecodeStats, request_record, response_record
from kinspect.session import Exchange, Problem, Request, Response

# Problems that are a frame of their own in the output; the rest (unknown_api, unanswered, ...)
# are notes on a frame or a flow and are listed by the stream summary.
_FRAME_PROBLEMS = ("unpaired_response", "decode_error", "sasl_tokens", "frame_too_large")


class RecordBuilder:
    """Builds decode records; each carries the flow, its connection number and the packet time."""

    def __init__(self, codec, stats: DecodeStats | None = None, roundtrip: bool = False) -> None:
        self.codec = codec
        self.stats = stats if stats is not None else DecodeStats()
        self.roundtrip = roundtrip  # re-encode every whole frame and compare, as `kinspect decode --roundtrip`

    @staticmethod
    def _where(flow, time: float) -> dict:
        return {"flow": flow.name, "connection": flow.id, "time": round(time, 6)}

    def frame_records(self, flow, direction: str, offset: int, time: float, events: list,
                      frame: bytes = b"") -> list[dict]:
        """The records of one frame (its bytes, or its head when over the inspection limit) from its events."""
        records = []
        for event in events:
            kind = type(event)
            if kind is Request:
                roundtrip = self.roundtrip and event.complete
                record = request_record(event, roundtrip, self.stats, offset)
                self._limit(record, event)
            elif kind is Response:
                record = response_record(event, self.roundtrip and event.complete, self.stats, offset)
                self._limit(record, event)
            elif kind is Problem and event.kind in _FRAME_PROBLEMS:
                self.stats.frames += 1
                # An unpaired response is a pairing fact (Tansu answers acks=0), not a decoding failure.
                if event.kind == "unpaired_response":
                    self.stats.unpaired_responses += 1
                elif event.kind != "sasl_tokens":
                    self.stats.decode_errors += 1
                record = {"direction": event.direction, "offset": offset, "size": event.size}
                if event.kind == "unpaired_response" and len(frame) >= 4:
                    record["correlation_id"] = int.from_bytes(frame[:4], "big", signed=True)
                record["error"] = {"reason": event.detail, "kind": event.kind}
            elif kind is Exchange and event.response is not None and records:
                records[-1]["latency"] = round(event.latency, 6)
                continue
            else:
                continue
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
        return [{**self._where(flow, e.time), "direction": e.direction, "unanswered": e.detail}
                for e in events if type(e) is Problem and e.kind == "unanswered"]
