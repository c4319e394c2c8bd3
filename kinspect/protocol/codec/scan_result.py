"""What a scan of a frame returns: the facts metrics need, gathered without building values."""

from __future__ import annotations

_summarize_spans = None  # codec_runtime.spans_summarizer(), on first use
_frozen_native = None  # the C extension's capture_side, False without it; on first use


def _summarizer():
    global _summarize_spans
    from kinspect.protocol.codec.runtime import spans_summarizer

    _summarize_spans = spans_summarizer()
    return _summarize_spans


def _freezer():
    global _frozen_native
    from kinspect.protocol.codec.wire_program import native_module

    native = native_module()
    _frozen_native = native.capture_side if native is not None and native.SCAN_RESULT_FAST_PATH else False
    return _frozen_native


def batch_fields() -> tuple[int, int, int, int]:
    """Where a BatchSummary keeps magic, record count, compression and batch length (what frozen() takes)."""
    from kinspect.protocol.records import BatchSummary

    return tuple(BatchSummary._fields.index(name) for name in ("magic", "record_count", "compression", "batch_length"))


_BATCH_FIELDS: tuple | None = None  # where frozen() finds a batch's magic, count, compression and length


class ScanResult:
    """Tag sections, tagged fields, error codes, topic names and record-batch summaries.

    `tagged_fields` holds one (struct path, tag, field name or None, data bytes) per
    non-empty tagged field seen; `error_codes` counts the non-zero codes of every
    *ErrorCode field, nested ones included; `records` holds one RecordsSummary per
    non-null records field (None where the records bytes were not a record set).

    The scanners only note where each non-null records field lies: `record_spans` holds
    one `start << 32 | length` per field (see `spans`), offsets into `source`, the
    scanned buffer (CompiledStruct.scan sets it). `records` summarizes them on first
    access and keeps the list; spans a later scan adds are summarized on the next access.

    Capture facts (what a capture row needs, gathered in the same pass; see codegen's
    "capture facts"): `int_stats`, codegen.SLOT_STRIDE int32 counters per entry of
    `int_slots` ((path, int type) of each integer field, the scanned struct's table, known
    tagged fields' values included): an array('i') while scans add to them, their bytes once
    the result is finished (finish(), and every result of scan_fresh), or (buf, pos) where they
    were left for later (codegen.COUNT_LATER: the capture's writer counts them from there); `topic_partitions`,
    topic -> partitions named (a topic listed without partitions counts 0); `compact_delta`,
    for a non-flexible version of an api with flexible versions, the bytes the body would gain
    at the first flexible version's encoding (KIP-482), else None. A result that
    CompiledStruct.scan did not prepare has int_stats None and gathers no integer counters, as
    does a scan of a buffer longer than codegen.COUNTED_BYTES_MAX (its counters could overflow).
    """

    __slots__ = ("trailing_bytes", "tag_sections", "tag_section_bytes", "empty_counter", "tagged_fields",
                 "error_codes", "topics", "record_spans", "source", "_summaries", "int_slots", "int_stats",
                 "topic_partitions", "compact_delta")

    def __init__(self) -> None:
        self.tag_sections = 0
        self.trailing_bytes = 0  # bytes after the end of the message (frame-level scans only)
        self.tag_section_bytes = 0
        self.empty_counter = [0]
        self.tagged_fields: list[tuple[str, int, str | None, int]] = []
        self.error_codes: dict[int, int] = {}
        self.topics: set[str] = set()
        self.record_spans: list[int] = []  # start << 32 | length, one per non-null records field
        self.source: bytes | None = None  # the buffer the spans point into
        self._summaries: list = []  # the summaries of record_spans[:len(_summaries)]
        self.int_slots: tuple = ()
        self.int_stats = None  # array('i') once a struct with integer fields is scanned, its bytes once finished
        self.topic_partitions: dict[str, int] = {}
        self.compact_delta: int | None = None

    @property
    def spans(self) -> list[tuple[int, int]]:
        """(start, length) in `source` of each non-null records field, in wire order."""
        return [(s >> 32, s & 0xFFFFFFFF) for s in self.record_spans]

    @property
    def records(self) -> list:
        """One RecordsSummary per non-null records field, None where RecordsError."""
        if len(self._summaries) < len(self.record_spans):
            self.settle()
        return self._summaries

    def settle(self) -> None:
        """Summarize the spans not yet summarized, from `source`.

        CompiledStruct.scan calls this before scanning another buffer into the same result.
        """
        done = len(self._summaries)
        if done >= len(self.record_spans):
            return
        if self.source is None:
            raise ValueError("ScanResult.source is not set: the records spans point into no buffer")
        (_summarize_spans or _summarizer())(self.source, self.record_spans, self._summaries, done)

    def frozen(self, previous: tuple | None = None) -> tuple:
        """The scan's facts as one tuple of immutable values, which the garbage collector stops tracking
        (what a capture keeps of a scan; see kinspect.capture.facts):

        (tag_section_bytes, tagged_fields, compact_delta, int_slots, int_stats as bytes, (buf, pos) or None,
        topic_partitions' (topic, partitions) items, error_codes' (code, count) items, and per records
        field None or its batches' (magic, record_count, compression, batch_length)); an empty
        collection is (). `previous` itself where the tuple would equal it (the C compares the facts
        where they lie and builds nothing then). Built in C where the extension is; frozen_python() is
        the reference.
        """
        global _BATCH_FIELDS
        native = _frozen_native if _frozen_native is not None else _freezer()
        if native is False:
            return self.frozen_python(previous)
        if _BATCH_FIELDS is None:
            _BATCH_FIELDS = batch_fields()
        return native(self, _BATCH_FIELDS, previous)

    def frozen_python(self, previous: tuple | None = None) -> tuple:
        """frozen(), in Python: built, then `previous` if equal to it (counters left for later, (buf, pos), equal
        where the bytes from pos are: a request's header, its correlation id, differs from the last one's); where
        only those bytes differ, previous's items with this scan's pair."""
        side = self._frozen_python()
        if previous is None:
            return side
        later, kept = side[4], previous[4] if type(previous) is tuple and len(previous) == 8 else None
        if type(later) is tuple and type(kept) is tuple:
            if side[:4] != previous[:4] or side[5:] != previous[5:]:
                return side
            if later[0][later[1]:] == kept[0][kept[1]:]:
                return previous
            return previous[:4] + (later,) + previous[5:]  # alike but for the frame: previous's items, its own frame
        return previous if side == previous else side

    def _frozen_python(self) -> tuple:
        global _BATCH_FIELDS
        if _BATCH_FIELDS is None:
            _BATCH_FIELDS = batch_fields()
        magic, count, compression, length = _BATCH_FIELDS
        stats, topics, tagged, codes = self.int_stats, self.topic_partitions, self.tagged_fields, self.error_codes
        records = ()
        if self.record_spans:
            records = tuple([None if s is None else tuple([(b[magic], b[count], b[compression], b[length])
                                                           for b in s[0]]) for s in self.records])
        return (self.tag_section_bytes, tuple(tagged) if tagged else (), self.compact_delta, self.int_slots,
                stats if stats is None or type(stats) is tuple else bytes(stats), tuple(topics.items()) if topics else (),
                tuple(codes.items()) if codes else (), records)

    def finish(self) -> "ScanResult":
        """Fold the empty tag sections (one byte each) into the totals, and freeze the integer counters as bytes
        (as the C scan_fresh makes them: the capture keeps that object)."""
        stats = self.int_stats
        if stats is not None and type(stats) is not bytes and type(stats) is not tuple:  # a tuple: counted later
            self.int_stats = stats.tobytes()
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
