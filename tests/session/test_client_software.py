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


def _api_versions_body(name: bytes | None, version: bytes | None) -> bytes:
    def compact(text):
        return b"\x00" if text is None else bytes([len(text) + 1]) + text
    return compact(name) + compact(version) + b"\x00"


def test_software_of_a_repeated_body_is_what_a_fresh_read_gives():
    from kinspect.session import client_software

    bodies = [_api_versions_body(b"librdkafka", b"2.16.0"), _api_versions_body(b"ctl\x1b", b"\xff"),
              _api_versions_body(None, b"1"), b"\x05ab", b"", _api_versions_body(b"x" * 100, b"v")]
    fresh = []
    for body in bodies:
        client_software._last = (None, (None, None))
        fresh.append(client_software.software_of(b"HEADER" + body, 6))
    assert fresh[0] == ("librdkafka", "2.16.0") and fresh[1] == ("ctl\\x1b", "\\xff") and fresh[3] == (None, None)
    for order in (bodies + bodies, [b for b in bodies for _ in range(3)], bodies[::-1] * 2):
        assert [client_software.software_of(b"HDR" + b, 3) for b in order] == \
            [fresh[bodies.index(b)] for b in order]
