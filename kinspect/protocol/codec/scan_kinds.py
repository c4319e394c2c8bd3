"""What a scan of a message can report, read once from its spec: error codes, record sets, topic names."""

from __future__ import annotations

from kinspect.protocol.codec.codegen import _is_error_code, _uses_topic_name  # what the scanners count
from kinspect.protocol.specs.model import MessageSpec, StructSpec


def scanned_kinds(struct: StructSpec, version: int, out: set | None = None, depth: int = 0) -> set:
    """The kinds of scanned facts ("error_code", "records", "topic") the struct's fields hold at this version."""
    out = set() if out is None else out
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
            scanned_kinds(f.struct, version, out, depth + 1)
    return out


def body_can_fail(spec: MessageSpec | None, version: int) -> bool:
    """False when a scan of this version's body reads no byte (no field, no tag section): it cannot fail."""
    if spec is None:
        return False
    return version in spec.flexible_versions or any(version in f.versions for f in spec.struct.fields)


__all__ = ["body_can_fail", "scanned_kinds"]
