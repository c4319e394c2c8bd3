"""User spec directories: KIP-482's FooResponse (apiKey 9000), KAFKA-9927 encodings, overrides."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.errors import DecodeError, SpecError
from kinspect.protocol.wire.primitives import write_uvarint, zigzag_encode
from kinspect.protocol.specs.registry import SpecRegistry, builtin_specs_dir, load_builtin_layers
from tests.support.paths import CUSTOM_SPECS

CUSTOM = CUSTOM_SPECS


@pytest.fixture(scope="module")
def custom() -> Codec:
    return Codec(SpecRegistry.default([CUSTOM / "kip482", CUSTOM / "varint", CUSTOM / "override"]))


def test_custom_api_is_listed_with_builtins(custom):
    assert custom.registry.api_name(9000) == "Foo"
    assert custom.registry.api_name(0) == "Produce"
    assert custom.registry.versions(9000, "response") == list(range(10))


def test_kip482_foo_response_v9_tagged_fields_by_hand(custom):
    # v9 is flexible: Foos is a compact array; UserAgent (tag 0) sits in the root tag section
    # after Foos; each Foo has Baz then its own tag section holding Bar (tag 0).
    frame = bytearray()
    frame += b"\x02"  # compact array: 1 element
    frame += b"\x00\x07"  # Baz = 7
    frame += b"\x01" + b"\x00" + b"\x03" + b"\x03hi"  # 1 tagged field: tag 0, 3 bytes, compact "hi"
    frame += b"\x02"  # 2 tagged fields at the root:
    frame += b"\x00" + b"\x04" + b"\x04ua!"  # tag 0 UserAgent = "ua!" (4 bytes: length 3+1, "ua!")
    frame += b"\x05" + b"\x02" + b"\xbe\xef"  # tag 5: unknown, kept as raw bytes
    compiled = custom.body(9000, "response", 9)
    value, end = compiled.decode(bytes(frame))
    assert end == len(frame)
    assert value == {"Foos": [{"Baz": 7, "Bar": "hi"}], "UserAgent": "ua!", UNKNOWN_TAGS: [(5, b"\xbe\xef")]}
    assert bytes(compiled.encode(value)) == bytes(frame)
    scan = compiled.scan(bytes(frame)).finish()
    assert sorted(scan.tagged_fields) == [("", 0, "UserAgent", 4), ("", 5, None, 2), ("Foos", 0, "Bar", 3)]
    assert scan.tag_sections == 2


def test_kip482_foo_response_v0_has_no_tag_sections(custom):
    compiled = custom.body(9000, "response", 0)
    value, _ = compiled.decode(b"\x00\x00\x00\x01\x00\x2a")
    assert value == {"Foos": [{"Baz": 42}]}


def test_a_tagged_field_must_fill_its_declared_length(custom):
    compiled = custom.body(9000, "response", 9)
    # Bar declares 4 bytes but its compact string takes 3.
    frame = b"\x02\x00\x07" + b"\x01\x00\x04\x03hi\x00" + b"\x00"
    with pytest.raises(DecodeError, match="declares 4 bytes"):
        compiled.decode(frame)


def _uv(value: int) -> bytes:
    out = bytearray()
    write_uvarint(value, out)
    return bytes(out)


def test_varint_encodings_by_hand(custom):
    v0 = custom.body(9001, "request", 0)
    v1 = custom.body(9001, "request", 1)
    v2 = custom.body(9001, "request", 2)
    value = {"LeaderId": 300, "Delta": -3, "Wide": -2, "Partitions": [{"Index": 5}]}
    fixed = (300).to_bytes(4, "big") + (-3).to_bytes(8, "big", signed=True) + (-2).to_bytes(4, "big", signed=True)
    fixed += b"\x00\x00\x00\x01" + b"\x00\x00\x00\x05"
    assert bytes(v0.encode(value)) == fixed
    assert v0.decode(fixed)[0] == value
    # v1: upacked32 300 = ac 02; packed64 -3 = zig-zag 5; Wide now fixed64; compact array; tag sections.
    packed = b"\xac\x02" + b"\x05" + (-2).to_bytes(8, "big", signed=True) + b"\x02" + b"\x05" + b"\x00" + b"\x00"
    assert _uv(300) == b"\xac\x02" and zigzag_encode(-3, 64) == 5
    assert bytes(v1.encode(value)) == packed
    assert v1.decode(packed)[0] == value
    # Negative values in an unsigned varint take the full 5 bytes (two's complement).
    negative = dict(value, LeaderId=-1)
    data = bytes(v1.encode(negative))
    assert data.startswith(b"\xff\xff\xff\xff\x0f")
    assert v1.decode(data)[0] == negative
    # packed16 on an int16.
    small = dict(value, Small=-32768)
    data = bytes(v2.encode(small))
    assert v2.decode(data)[0] == small
    assert _uv(zigzag_encode(-32768, 16)) in data


def test_varint_range_and_length_are_enforced(custom):
    v1 = custom.body(9001, "request", 1)
    with pytest.raises(DecodeError, match="longer than 5 bytes"):
        v1.decode(b"\xff\xff\xff\xff\xff\x01" + b"\x00" * 20)
    v0 = custom.body(9001, "request", 0)
    from kinspect.protocol.errors import EncodeError

    with pytest.raises(EncodeError):
        v0.encode({"LeaderId": 0, "Delta": 0, "Wide": 2**40, "Partitions": []})  # fixed32 on an int64 field


def test_varint_response_error_code(custom):
    compiled = custom.body(9001, "response", 1)
    value = {"ErrorCode": -1}
    data = bytes(compiled.encode(value))
    assert data == b"\x01\x00"
    assert compiled.scan(data).error_codes == {-1: 1}


def test_override_replaces_one_version_only(custom):
    v5 = custom.body(18, "request", 5)
    v4 = custom.body(18, "request", 4)
    assert custom.registry.layer_of(18, "request", 5) == "override"
    assert custom.registry.layer_of(18, "request", 4) == "4.3.1"
    data = b"\x04kin\x02\x31" + b"\x01\x07\x01\x02"
    assert v5.decode(data)[0] == {"ClientSoftwareName": "kin", "ClientSoftwareVersion": "1", "Preference": 2}
    # The built-in v4 does not know tag 7: it is kept as an unknown tagged field.
    assert v4.decode(data)[0][UNKNOWN_TAGS] == [(7, b"\x02")]


@pytest.mark.parametrize(
    "encoding, problem",
    [
        ('{"0-9": "fixed32", "10+": "unsigned32"}', "is not (fixed|packed|upacked)"),  # the proposal's own typo
        ('{"0-3": "fixed32", "3+": "packed32"}', "overlap"),
        ('{"0-3": "fixed32"}', "do not cover"),
        ('"zigzag32"', "is not (fixed|packed|upacked)"),
    ],
)
def test_bad_encodings_are_spec_errors(tmp_path, encoding, problem):
    (tmp_path / "BadRequest.json").write_text(
        '{"apiKey": 9100, "type": "request", "name": "BadRequest", "validVersions": "0+", "flexibleVersions": "none",'
        f' "fields": [{{"name": "LeaderId", "type": "int32", "versions": "0+", "encoding": {encoding}}}]}}'
    )
    with pytest.raises(SpecError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        SpecRegistry.default([tmp_path])


def test_encoding_only_on_integers(tmp_path):
    (tmp_path / "BadRequest.json").write_text(
        '{"apiKey": 9100, "type": "request", "name": "BadRequest", "validVersions": "0", "flexibleVersions": "none",'
        ' "fields": [{"name": "Name", "type": "string", "versions": "0+", "encoding": "packed32"}]}'
    )
    with pytest.raises(SpecError, match="only allowed on int16, int32 and int64"):
        SpecRegistry.default([tmp_path])


def test_builtin_layers_are_parsed_once_until_their_index_changes(tmp_path):
    """Every Codec of a process shares one parse of the built-in layers; an index rewritten (the
    importer adding a release) is read afresh."""
    specs = Path(shutil.copytree(builtin_specs_dir(), tmp_path / "specs"))
    first, again = load_builtin_layers(specs), load_builtin_layers(specs)
    assert [layer.name for layer in first] == [layer.name for layer in again] and len(first) >= 2
    assert all(a.messages is b.messages for a, b in zip(first, again))
    first.pop()  # each caller gets its own list: changing it changes nobody else's
    assert len(load_builtin_layers(specs)) == len(again)

    index = specs / "index.json"
    index.write_text(index.read_text("utf-8") + "\n", "utf-8")
    changed = load_builtin_layers(specs)
    assert [layer.name for layer in changed] == [layer.name for layer in again]
    assert not any(a.messages is b.messages for a, b in zip(changed, again))
    assert changed[0].messages == again[0].messages  # parsed again, to the same definitions
