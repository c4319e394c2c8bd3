"""Capture rows from the facts the event loop shipped (capture.facts), in the writer thread, with no codec.

A row is a dict keyed by schema.COLUMNS. Its nested columns hold what is cheapest to
turn into Arrow a batch at a time (capture.columns): tuples in the struct members'
order, and for integer_fields the scans' raw (location, slots, counters). Nothing of a
record's key, value or headers was ever read (records are summarized from their batch
headers), and no bytes field reaches a row.
"""

from __future__ import annotations

from kinspect.capture.schema import SCHEMA_VERSION
from kinspect.protocol.codec.scan_result import ScanResult
from kinspect.protocol.specs.api_keys import PRODUCE
from kinspect.protocol.codec import response_header_version
from kinspect.protocol.error_codes import error_name

_LOG_OVERHEAD = 12  # a batch's offset and length fields, not counted in its batch_length


class RowBuilder:
    """Turns EXCHANGE fact tuples into capture rows; `wall_offset` maps the events' monotonic times to UTC."""

    def __init__(self, wall_offset: float) -> None:
        self.wall_offset = wall_offset

    def build(self, facts: tuple) -> dict:
        (request_time, latency, connection_id, client_address, broker, node_id, client_id, api_key, api_name,
         version, header_version, correlation_id, size, header_size, complete, header_tag_bytes, header_tags,
         flexible, first_flexible, req, resp, software_name, software_version) = facts
        offset = self.wall_offset
        tagged = [("request_header", "", tag, None, n, False) for tag, n in header_tags]
        request_tag_bytes = header_tag_bytes
        compact = error = None
        ints = []
        topics = {}
        summaries = ()
        row_magics = []
        if type(req) is ScanResult:
            request_tag_bytes += req.tag_section_bytes
            tagged += [("request_body", p, t, n, s, n is not None) for p, t, n, s in req.tagged_fields]
            if req.compact_delta is not None:
                # The header at its flexible version: ClientId keeps its int16 length, plus a tag section.
                flexible_header = 11 + (len(client_id.encode("utf-8")) if client_id is not None else 0)
                compact = size + req.compact_delta + flexible_header - header_size
            if req.int_stats is not None:
                ints.append(("request", req.int_slots, req.int_stats))
            topics = req.topic_partitions
            summaries = req.records
            if api_key == PRODUCE and summaries:
                # Distinct magics of the request's batches, ascending (0/1: KIP-724's removed formats).
                row_magics = sorted({b.magic for s in summaries if s is not None for b in s.batches})
        else:
            error = req
        row = {
            "schema_version": SCHEMA_VERSION,
            "request_time": round((request_time + offset) * 1_000_000),
            "response_time": None,
            "latency_us": None if latency is None else round(latency * 1_000_000),
            "connection_id": connection_id,
            "client_address": client_address,
            "client_id": client_id,
            "broker": broker,
            "node_id": node_id,
            "api_key": api_key,
            "api_name": api_name,
            "request_version": version,
            "response_version": None,
            "request_header_version": header_version,
            "response_header_version": None,
            "flexible": flexible,
            "correlation_id": correlation_id,
            "request_size": size,
            "response_size": None,
            "request_header_size": header_size,
            "response_header_size": None,
            "request_inspected": complete,
            "response_inspected": None,
            "request_decode_error": error,
            "response_decode_error": None,
            "request_tag_section_bytes": request_tag_bytes,
            "response_tag_section_bytes": None,
            "first_flexible_version": first_flexible,
            "request_compact_size": compact,
            "response_compact_size": None,
            "tagged_fields": tagged,
            "error_codes": [],
            "integer_fields": ints,
            "client_software_name": software_name,
            "client_software_version": software_version,
            "record_magics": row_magics,
        }
        if resp is not None:
            (response_time, response_version, response_header_version_, response_size, response_header_size,
             response_complete, response_tag_bytes, response_header_tags, side) = resp
            tagged += [("response_header", "", tag, None, n, False) for tag, n in response_header_tags]
            compact = error = None
            if type(side) is ScanResult:
                response_tag_bytes += side.tag_section_bytes
                tagged += [("response_body", p, t, n, s, n is not None) for p, t, n, s in side.tagged_fields]
                if side.error_codes:
                    row["error_codes"] = [(code, error_name(code), count)
                                          for code, count in sorted(side.error_codes.items())]
                if side.int_stats is not None:
                    ints.append(("response", side.int_slots, side.int_stats))
                if side.topic_partitions:
                    if topics:  # a topic named by both directions counts the larger number of partitions
                        merged = dict(topics)
                        for topic, n in side.topic_partitions.items():
                            if merged.get(topic, -1) < n:
                                merged[topic] = n
                        topics = merged
                    else:
                        topics = side.topic_partitions
                if side.record_spans:
                    summaries = [*summaries, *side.records]
                if side.compact_delta is not None:
                    grows = response_header_version(api_key, True) > response_header_version_  # v0 -> v1: +1 tag byte
                    compact = response_size + side.compact_delta + (1 if grows else 0)
            else:
                error = side
            row.update({
                "response_time": round((response_time + offset) * 1_000_000),
                "response_version": response_version,
                "response_header_version": response_header_version_,
                "response_size": response_size,
                "response_header_size": response_header_size,
                "response_inspected": response_complete,
                "response_decode_error": error,
                "response_tag_section_bytes": response_tag_bytes,
                "response_compact_size": compact,
            })
        row["topic_partitions"] = sorted(topics.items()) if topics else []
        batches = records = 0
        compression = []
        if summaries:
            codecs: dict[str, list[int]] = {}
            for summary in summaries:
                if summary is None:
                    continue
                for batch in summary.batches:
                    batches += 1
                    count = max(batch.record_count, 0)
                    records += count
                    acc = codecs.get(batch.compression)
                    if acc is None:
                        acc = codecs[batch.compression] = [0, 0, 0]
                    acc[0] += 1
                    acc[1] += count
                    acc[2] += batch.batch_length + _LOG_OVERHEAD
            compression = [(c, a[0], a[1], a[2]) for c, a in sorted(codecs.items())]
        row["record_batches"] = batches
        row["record_count"] = records
        row["compression"] = compression
        return row
