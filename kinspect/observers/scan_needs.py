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

from kinspect.protocol.codec.codegen import _is_error_code, _uses_topic_name  # what the scanners count
from kinspect.protocol.specs.model import MessageSpec, StructSpec

PRODUCE = 0


def _facts(struct: StructSpec, version: int, out: set, depth: int = 0) -> set:
    """The kinds of scanned facts ("error_code", "records", "topic") the struct's fields hold at this version."""
    if depth > 64:  # specs nest a few levels; a cycle would be a spec bug, not a reason to hang
        return out
    for f in struct.fields:
        if version not in f.versions:
            continue
        if _is_error_code(f):
            out.add("error_code")
        elif f.type == "records":
            out.add("records")
        elif _uses_topic_name(f):
            out.add("topic")
        if f.struct is not None:
            _facts(f.struct, version, out, depth + 1)
    return out


def metrics_scan_needed(spec: MessageSpec | None, api_key: int, version: int, direction: str,
                        topic_bytes: bool) -> bool:
    """True when a scan of such a body can change a metric; False for unknown apis (never scanned)."""
    if spec is None:
        return False
    if version in spec.flexible_versions:
        return True  # tag_section_bytes counts every tag section, the root's included
    facts = _facts(spec.struct, version, set())
    if direction == "response" and "error_code" in facts:
        return True
    if direction == "request" and api_key == PRODUCE and "records" in facts:
        return True
    return topic_bytes and "topic" in facts


def body_can_fail(spec: MessageSpec | None, version: int) -> bool:
    """False when a scan of this version's body reads no byte (no field, no tag section): it cannot fail."""
    if spec is None:
        return False
    return version in spec.flexible_versions or any(version in f.versions for f in spec.struct.fields)


__all__ = ["body_can_fail", "metrics_scan_needed"]
