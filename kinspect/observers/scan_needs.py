"""Whether a scan of one (api key, version, direction)'s bodies can change a metric, decided once from its spec.

The metrics read from a body scan: the bytes of its tag sections and its tagged fields
(flexible versions only: a flexible body always has at least its root tag section), the
non-zero *ErrorCode fields of responses, the record batches of Produce requests, and,
when topic_bytes is on, the topic names. A version whose spec has none of these (an old
non-flexible request, say) gives the metrics no fact to read: `metrics_scan_needed` is
False, and the pipeline need not keep such bodies for the metrics. A body that is there
is still scanned to count it in decode_failures_total when it is malformed, unless the
version has no field at all (`body_can_fail` False: ApiVersions v0-2 requests), whose
scan reads nothing.
"""

from __future__ import annotations

from kinspect.protocol.codec.scan_kinds import body_can_fail, scanned_kinds
from kinspect.protocol.specs.api_keys import PRODUCE
from kinspect.protocol.specs.model import MessageSpec


def metrics_scan_needed(spec: MessageSpec | None, api_key: int, version: int, direction: str,
                        topic_bytes: bool) -> bool:
    """True when a scan of such a body can change a metric; False for unknown apis (never scanned)."""
    if spec is None:
        return False
    if version in spec.flexible_versions:
        return True  # tag_section_bytes counts every tag section, the root's included
    facts = scanned_kinds(spec.struct, version)
    if direction == "response" and "error_code" in facts:
        return True
    if direction == "request" and api_key == PRODUCE and "records" in facts:
        return True
    return topic_bytes and "topic" in facts


__all__ = ["body_can_fail", "metrics_scan_needed"]
