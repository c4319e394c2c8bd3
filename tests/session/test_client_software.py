"""sanitize()'s fast path for plain ASCII names gives what the character-by-character path gives."""

from kinspect.session.client_software import MAX_CHARS, sanitize


def _slow(text: bytes) -> str:
    return sanitize(bytearray(text))  # not bytes: always the general path


def test_ascii_fast_path_matches_the_general_path():
    cases = [b"", b"apache-kafka-java", b"librdkafka 2.16.0", b"A" * MAX_CHARS, b"A" * (MAX_CHARS + 1),
             b"del\x7f", b"tab\there", b"nl\n", b"esc\x1b[0m", b" spaces ", b"~!@#$%^&*()"]
    cases += [bytes([b]) for b in range(128)]
    for text in cases:
        assert sanitize(text) == _slow(text), text
    assert sanitize(b"A" * (MAX_CHARS + 1)) == "A" * MAX_CHARS + "…"
    assert sanitize(b"del\x7f") == "del\\x7f"
