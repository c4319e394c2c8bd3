"""Every (api, version, direction) of specs/: decode(encode(x)) == x and encode(decode(b)) == b."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import DecodeError
from tests.spec_values import struct_value

CODEC = Codec()
CASES = [
    (key, direction, version)
    for key in CODEC.registry.api_keys()
    for direction in ("request", "response")
    for version in CODEC.registry.versions(key, direction)
]


def _id(case):
    key, direction, version = case
    return f"{CODEC.registry.api_name(key)}-{direction}-v{version}"


def test_every_release_version_is_covered():
    """Versions only 3.9.2 defines (removed by KIP-896) and 4.3.1's newest both decode."""
    versions = {(k, d): CODEC.registry.versions(k, d) for k, d, _ in CASES}
    assert versions[(0, "request")] == list(range(0, 14))  # Produce v0-13
    assert versions[(1, "response")] == list(range(0, 19))  # Fetch v0-18
    for key in (4, 5, 6, 7):  # inter-broker APIs of 3.9.2
        assert versions[(key, "request")], key
    assert CODEC.registry.layer_of(0, "request", 13) == "4.3.1"
    assert CODEC.registry.layer_of(0, "request", 0) == "3.9.2"
    assert CODEC.registry.layer_of(0, "request", 5) == "4.3.1"  # defined in both: the newer wins


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_roundtrip(case, data):
    key, direction, version = case
    compiled = CODEC.body(key, direction, version)
    value = data.draw(struct_value(compiled.spec.struct, version, compiled.flexible))
    encoded = bytes(compiled.encode(value))
    decoded, end = compiled.decode(encoded)
    assert end == len(encoded)
    assert decoded == value
    assert bytes(compiled.encode(decoded)) == encoded
    # Every decoder, fed the message cut short or followed by garbage, says so.
    if encoded:
        cut = data.draw(st.integers(0, len(encoded) - 1))
        with pytest.raises(DecodeError):
            compiled.decode(encoded[:cut])
    with pytest.raises(DecodeError) as info:
        compiled.decode(encoded + b"\x00")
    assert "trailing" in str(info.value)
    # The scanner walks the same bytes to the same end.
    assert compiled.scan(encoded) is not None
