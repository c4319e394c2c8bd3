"""Spec files and config are data: hostile ones are rejected with an error naming the place, or kept as data; no code runs.

Every payload below, if it were ever executed, would set an attribute on the builtins
module and create a file; the tests load, compile, encode, decode and scan with them and
then check that neither happened.
"""

from __future__ import annotations

import builtins
import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect.config import ConfigError, config_keys, load_config
from kinspect.protocol.codec import codegen
from kinspect.protocol.codec import Codec, CompiledStruct
from kinspect.protocol.errors import DecodeError, SpecError
from kinspect.protocol.specs.model import MAX_DEPTH, parse_message
from kinspect.protocol.specs.registry import SpecRegistry, load_directory

pytestmark = pytest.mark.timeout(120)
MARK = "KINSPECT_PWNED"


@pytest.fixture
def marker(tmp_path):
    """The file a payload would create; checked absent (and the builtins flag unset) after the test."""
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "a payload ran: it created its file"
    assert not hasattr(builtins, MARK), "a payload ran: it set a builtins attribute"


def payloads(path: Path) -> list[str]:
    """Strings that run code if pasted into Python source, in the positions code generators paste them."""
    act = f"__import__('builtins').__setattr__('{MARK}', 1) or open({str(path)!r}, 'w')"
    return [
        act,
        f"'); {act}; ('",
        f'"); {act}; ("',
        f"'''\n{act}\n'''",
        f'"""\n{act}\n"""',
        f"\\'\n{act}\n#",
        f"x\n{act}\n",
        f"{{{act}}}",  # an f-string field
        f"%({act})s",
        "{0.__class__.__mro__}",
        "__import__",
        "__class__",
        "\x00\u202e\ufeff",
    ]


def message(fields: list, **top) -> dict:
    doc = {"apiKey": 9100, "type": "request", "name": "HostileRequest", "validVersions": "0-1",
           "flexibleVersions": "1+", "fields": fields}
    doc.update(top)
    return doc


def write_spec(directory: Path, doc, name: str = "HostileRequest.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), "utf-8")
    return path


def exercise(codec: Codec, api_key: int = 9100) -> None:
    """Compile every version's codecs, encode a default value, decode and scan it and some garbage."""
    for version in codec.registry.versions(api_key, "request"):
        compiled = codec.body(api_key, "request", version)
        encoded = bytes(compiled.encode({}))
        value, _ = compiled.decode(encoded)
        assert bytes(compiled.encode(value)) == encoded
        compiled.scan(encoded)
        for garbage in (b"", b"\xff" * 9, encoded[:-1] + b"\x05\x01\x00"):
            try:
                compiled.decode(garbage)
            except DecodeError:
                pass


# ----------------------------------------------------------------------------- specs: rejected, naming the place


@pytest.mark.parametrize("where", ["message name", "field name", "type", "struct name", "entityType",
                                   "common struct", "versions", "encoding key", "tag"])
def test_code_in_a_structural_position_is_a_spec_error(tmp_path, marker, where):
    for i, payload in enumerate(payloads(marker)):
        field = {"name": "Plain", "type": "int32", "versions": "0+"}
        doc = message([field])
        if where == "message name":
            doc["name"] = payload
        elif where == "field name":
            field["name"] = payload
        elif where == "type":
            field["type"] = payload
        elif where == "struct name":
            field.update(type=f"[]{payload}", fields=[{"name": "X", "type": "int8", "versions": "0+"}])
        elif where == "entityType":
            field["entityType"] = payload
        elif where == "common struct":
            field["type"] = "Common"
            doc["commonStructs"] = [{"name": payload, "versions": "0+", "fields": []}]
        elif where == "versions":
            field["versions"] = payload
        elif where == "encoding key":
            field["encoding"] = {payload: "packed32"}
        else:
            field.update(tag=payload, taggedVersions="1+")
        path = write_spec(tmp_path / f"{where.replace(' ', '_')}{i}", doc)
        with pytest.raises(SpecError) as info:
            load_directory(path.parent)
        assert str(path) in str(info.value)  # names the file...
        if where not in ("message name", "common struct"):
            assert "HostileRequest" in str(info.value)  # ...and where in it


@pytest.mark.parametrize("name", ["__class__", "_unknown_tagged_fields", "__import__", "_uv", "a-b", "a b",
                                  "a.b", "1abc", "x" * 129, ""])
def test_names_that_are_not_identifiers(name):
    with pytest.raises(SpecError, match="is not an identifier"):
        parse_message(message([{"name": name, "type": "int8", "versions": "0+"}]), "hostile.json")


@pytest.mark.parametrize("field, problem", [
    ({"name": "N", "type": "int32", "versions": "0+", "default": "2**31"}, "is not an integer"),
    ({"name": "N", "type": "int32", "versions": "0+", "default": "__import__('os')"}, "is not an integer"),
    ({"name": "N", "type": "int64", "versions": "0+", "default": 10**30}, "does not fit"),
    ({"name": "N", "type": "int64", "versions": "0+", "default": "9" * 25}, "is not an integer"),
    ({"name": "N", "type": "bool", "versions": "0+", "default": "True or exit()"}, "is not a boolean"),
    ({"name": "N", "type": "float64", "versions": "0+", "default": "float('inf')"}, "is not a number"),
    ({"name": "N", "type": "bytes", "versions": "0+", "default": "b'x'"}, "cannot have a custom default"),
    ({"name": "N", "type": "[]int32", "versions": "0+", "default": "[1]"}, "cannot have a custom default"),
    ({"name": "N", "type": "int8", "versions": "0+", "tag": 2**31, "taggedVersions": "1+"}, "must be an integer"),
    ({"name": "N", "type": "int8", "versions": "0-99999"}, "versions"),
    ({"name": "N", "type": "int8", "versions": "0+", "__init__": "x"}, "unknown keys"),
    ({"name": "N", "type": "int8", "versions": "0+", "mapKey": "__import__('os')"}, "must be a boolean"),
])
def test_bad_values_are_spec_errors_naming_the_field(field, problem):
    with pytest.raises(SpecError, match=problem) as info:
        parse_message(message([field]), "hostile.json")
    assert str(info.value).startswith("hostile.json: HostileRequest.N")


def nested(depth: int) -> list:
    """Structs nested depth deep, alternating arrays and nullable structs, each level with tagged fields."""
    inner = [{"name": "Leaf", "type": "string", "versions": "0+", "nullableVersions": "0+"},
             {"name": "T", "type": "int32", "versions": "1+", "taggedVersions": "1+", "tag": 0}]
    for i in range(depth):
        kind = f"S{i}" if i % 2 else f"[]S{i}"
        inner = [{"name": f"S{i}", "type": kind, "versions": "0+", "nullableVersions": "0+", "fields": inner},
                 {"name": f"Tag{i}", "type": f"[]X{i}", "versions": "1+", "taggedVersions": "1+", "tag": 1,
                  "fields": [{"name": "Q", "type": "int8", "versions": "0+"}]}]
    return inner


def test_deep_nesting_is_bounded(tmp_path):
    too_deep = write_spec(tmp_path / "deep", message(nested(MAX_DEPTH + 1)))
    with pytest.raises(SpecError, match=f"nested deeper than {MAX_DEPTH}") as info:
        load_directory(too_deep.parent)
    assert str(too_deep) in str(info.value)
    # The deepest nesting allowed compiles in every generator (Python allows 20 nested blocks):
    # a spec that loads never fails later, on first use in the middle of a stream.
    codec = Codec(SpecRegistry.default([write_spec(tmp_path / "ok", message(nested(MAX_DEPTH))).parent]))
    exercise(codec)
    for version in (0, 1):
        codec.body(9100, "request", version).diagnose(b"\x01", 0, ValueError())  # the tracing decoder too
    # JSON nested far deeper than the parser's recursion limit: an error naming the file.
    deep = write_spec(tmp_path / "json", "[" * 200_000 + "]" * 200_000)
    with pytest.raises(SpecError, match="nested too deeply|is not|must be") as info:
        load_directory(deep.parent)
    assert str(deep) in str(info.value)


def test_a_self_containing_common_struct(tmp_path):
    doc = message([{"name": "Loop", "type": "Node", "versions": "0+"}],
                  commonStructs=[{"name": "Node", "versions": "0+", "fields": [
                      {"name": "Next", "type": "Node", "versions": "0+"}]}])
    with pytest.raises(SpecError, match="contains itself"):
        parse_message(doc, "loop.json")


def test_huge_and_broken_files(tmp_path):
    too_big = write_spec(tmp_path / "big", "//" + "x" * (4 * 1024 * 1024 + 1))
    with pytest.raises(SpecError, match="too large") as info:
        load_directory(too_big.parent)
    assert str(too_big) in str(info.value)
    binary = tmp_path / "bin" / "X.json"
    binary.parent.mkdir()
    binary.write_bytes(b"{\xff\xfe}")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_directory(binary.parent)
    for text in ('{"apiKey": NaN, "type": "request", "name": "A", "validVersions": "0", "fields": []}',
                 '{"apiKey": 1e400, "type": "request", "name": "A", "validVersions": "0", "fields": []}',
                 '["not", "an", "object"]', "null"):
        with pytest.raises(SpecError):
            load_directory(write_spec(tmp_path / f"doc{len(text)}", text).parent)


# ----------------------------------------------------------------------------- specs: accepted, kept as data


def test_code_in_defaults_and_about_is_data(tmp_path, marker):
    """String defaults and about texts holding code are accepted and come back as the very strings."""
    texts = payloads(marker)
    fields = [{"name": f"Text{i}", "type": "string", "versions": "0+", "default": t, "about": t}
              for i, t in enumerate(texts)]
    fields.append({"name": "Tagged", "type": "string", "versions": "1+", "taggedVersions": "1+", "tag": 0,
                   "default": texts[1], "about": texts[2]})
    doc = message(fields, about=texts[3])
    codec = Codec(SpecRegistry.default([write_spec(tmp_path / "specs", doc).parent]))
    exercise(codec)
    for version in (0, 1):
        compiled = codec.body(9100, "request", version)
        value, _ = compiled.decode(bytes(compiled.encode({})))
        assert [value[f"Text{i}"] for i in range(len(texts))] == texts  # the defaults, as data
        sources = [codegen.generate_decoder(compiled.spec.struct, version, version == 1, compiled.label).source,
                   codegen.generate_encoder(compiled.spec.struct, version, version == 1, compiled.label).source,
                   codegen.generate_scanner(compiled.spec.struct, version, version == 1, compiled.label).source]
        for source in sources:
            assert MARK not in source and str(marker) not in source  # never pasted into code


@pytest.mark.parametrize("name", ["buf", "pos", "out", "value", "result", "len", "range", "None", "True",
                                  "class", "lambda", "import", "exec", "self", "obj", "end", "n", "i", "x"])
def test_field_names_that_are_python_words_stay_strings(name):
    """Names reach generated code only as string literals: keywords and the generator's own locals work as names."""
    spec = parse_message(message([
        {"name": name, "type": "int32", "versions": "0+"},
        {"name": "Items", "type": "[]Item", "versions": "0+", "fields": [
            {"name": name, "type": "string", "versions": "0+"},
            {"name": "Other", "type": "int16", "versions": "0+"}]},
        {"name": "After", "type": "int8", "versions": "0+"},
    ]), "words.json")
    for version in (0, 1):
        compiled = CompiledStruct(spec, version, version == 1, api="Hostile", api_key=9100, direction="request")
        value = {name: 7, "Items": [{name: "s", "Other": 3}], "After": 1}
        encoded = bytes(compiled.encode(value))
        decoded, _ = compiled.decode(encoded)
        assert {k: v for k, v in decoded.items()} == value
        assert compiled.scan(encoded) is not None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["0+", "1+", "0-1", "none", "int32", "string", "[]int8", "Struct", "null", "__class__"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "type", "versions", "fields", "tag", "taggedVersions", "nullableVersions",
                         "default", "encoding", "commonStructs", "flexibleVersions", "entityType", "about", "bogus"]),
        children, max_size=6),
    max_leaves=20,
)


@st.composite
def spec_documents(draw) -> dict:
    """Documents near the spec format: a real top level with random fields."""
    fields = draw(st.lists(st.fixed_dictionaries(
        {"name": st.sampled_from(["A", "B", "C", "__x", "A"]), "type": _JSON, "versions": _JSON},
        optional={"default": _JSON, "tag": _JSON, "taggedVersions": _JSON, "nullableVersions": _JSON,
                  "fields": st.lists(_JSON, max_size=3), "encoding": _JSON}), max_size=4))
    return message(fields, flexibleVersions=draw(st.sampled_from(["1+", "none", "0+", "x"])))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=spec_documents() | _JSON, garbage=st.binary(max_size=24))
def test_random_documents_are_a_spec_or_a_spec_error(doc, garbage):
    try:
        spec = parse_message(doc, "random.json")
    except SpecError:
        return
    for version in (0, 1):
        if version not in spec.valid_versions:
            continue
        compiled = CompiledStruct(spec, version, version in spec.flexible_versions, api="R", api_key=9100,
                                  direction="request")
        try:
            compiled.decode(garbage)
        except DecodeError:
            pass
    assert not hasattr(builtins, MARK)


# ----------------------------------------------------------------------------- config


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a TOML basic string for these characters


def test_code_in_every_string_setting_is_data_or_a_config_error(tmp_path, marker):
    keys = {k: v for k, v in config_keys().items() if isinstance(v, str) or v is None}
    assert "proxy.listen" in keys and "log.format" in keys
    for payload in payloads(marker):
        if "\x00" in payload:
            continue  # not representable in a TOML basic string as written
        for dotted in keys:
            section, _, key = dotted.rpartition(".")
            path = tmp_path / "kinspect.toml"
            path.write_text(f"[{section}]\n{key} = {_toml_string(payload)}\n", "utf-8")
            try:
                config = load_config(path)
            except ConfigError as exc:
                assert dotted in str(exc) and str(path) in str(exc)
                continue
            value = config_keys(config)[dotted]
            assert value == payload or value.endswith(payload), (dotted, value)  # paths get the file's dir


@pytest.mark.parametrize("text, named", [
    ("[__class__]\nx = 1\n", "__class__"),
    ("[proxy]\n__dict__ = 1\n", "proxy.__dict__"),
    ("[proxy]\n__class__ = 'x'\n", "proxy.__class__"),
    ("[proxy.listen]\nx = 1\n", "proxy.listen"),
    ("[proxy]\nmax_connections = 'os.system(1)'\n", "proxy.max_connections"),
    ("[proxy]\nmax_connections = true\n", "proxy.max_connections"),
    ("[proxy]\nmode = \"__import__('os')\"\n", "proxy.mode"),
    ("[log]\nlevel = \"{0.__class__}\"\n", "log.level"),
    ("[specs]\ndirectories = [1, 2]\n", "specs.directories"),
    ("[proxy]\nnode_ports = { a = 'b' }\n", "proxy.node_ports"),
    ("a.b.c.d.e.f.g = 1\n", "a"),
    ("[proxy\n", "kinspect.toml"),
])
def test_hostile_toml_is_a_config_error_naming_the_key(tmp_path, marker, text, named):
    path = tmp_path / "kinspect.toml"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert named in str(info.value) and str(path) in str(info.value)


def test_unencodable_string_defaults_are_spec_errors():
    """A JSON escape can spell a lone surrogate; such a default could never be encoded (found by this file)."""
    for default, problem in (("a\udcffb", "not valid UTF-8"), ("x" * 40000, "longer than a string can be")):
        with pytest.raises(SpecError, match=problem) as info:
            parse_message(message([{"name": "S", "type": "string", "versions": "0+", "default": default}]), "u.json")
        assert str(info.value).startswith("u.json: HostileRequest.S")


def test_huge_numbers_stay_data(tmp_path):
    path = tmp_path / "kinspect.toml"
    path.write_text(f"[proxy]\nmax_connections = {2**63 - 1}\nconnect_timeout = 1e308\n", "utf-8")
    config = load_config(path)
    assert config.proxy.max_connections == 2**63 - 1 and config.proxy.connect_timeout == 1e308


def test_deeply_nested_toml_is_a_config_error(tmp_path):
    path = tmp_path / "kinspect.toml"
    deep = "x = " + "[" * 5000 + "]" * 5000 + "\n"
    path.write_text(deep, "utf-8")
    with pytest.raises(ConfigError, match="kinspect.toml"):
        load_config(path)


def test_a_hostile_spec_directory_in_the_config(tmp_path, marker):
    """A config naming a spec directory with a crafted file: loading the codec fails with the file named."""
    write_spec(tmp_path / "specs", message([{"name": payloads(marker)[1], "type": "int8", "versions": "0+"}]))
    path = tmp_path / "kinspect.toml"
    path.write_text('[specs]\ndirectories = ["specs"]\n', "utf-8")
    config = load_config(path)
    with pytest.raises(SpecError) as info:
        SpecRegistry.default(config.specs.directories)
    assert "HostileRequest.json" in str(info.value)
    assert "kinspect.protocol.codec.codegen" in sys.modules  # the generator was loaded, yet nothing ran
