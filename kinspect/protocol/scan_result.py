"""What a scan of a frame returns: the facts metrics need, gathered without building values."""

from __future__ import annotations


class ScanResult:
    """Tag sections, tagged fields, error codes, topic names and record-batch summaries.

    `tagged_fields` holds one (struct path, tag, field name or None, data bytes) per
    non-empty tagged field seen; `error_codes` counts the non-zero codes of every
    *ErrorCode field, nested ones included; `records` holds one RecordsSummary per
    records field (None where the records bytes were not a record set).
    """

    __slots__ = ("trailing_bytes", "tag_sections", "tag_section_bytes", "empty_counter", "tagged_fields", "error_codes", "topics", "records")

    def __init__(self) -> None:
        self.tag_sections = 0
        self.trailing_bytes = 0  # bytes after the end of the message (frame-level scans only)
        self.tag_section_bytes = 0
        self.empty_counter = [0]
        self.tagged_fields: list[tuple[str, int, str | None, int]] = []
        self.error_codes: dict[int, int] = {}
        self.topics: set[str] = set()
        self.records: list = []

    def finish(self) -> "ScanResult":
        """Fold the empty tag sections (one byte each) into the totals."""
        empty = self.empty_counter[0]
        self.tag_sections += empty
        self.tag_section_bytes += empty
        self.empty_counter[0] = 0
        return self

    def to_dict(self) -> dict:
        return {
            "trailing_bytes": self.trailing_bytes,
            "tag_sections": self.tag_sections,
            "tag_section_bytes": self.tag_section_bytes,
            "tagged_fields": [
                {"path": p, "tag": t, "name": n, "size": s} for p, t, n, s in self.tagged_fields
            ],
            "error_codes": {str(k): v for k, v in sorted(self.error_codes.items())},
            "topics": sorted(self.topics),
            "records": [r.to_dict() if r is not None else None for r in self.records],
        }
