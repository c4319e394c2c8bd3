"""The importer writes facts only, keeps the Apache notices, and refuses hostile spec files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.errors import SpecError
from kinspect.protocol.specs.importer import import_specs
from kinspect.protocol.specs.json_format import load_spec_file
from kinspect.protocol.specs.model import parse_message
from kinspect.protocol.specs.registry import SpecRegistry, builtin_specs_dir
from tests.support.paths import ROOT, SHARED_SPECS

SHARED = SHARED_SPECS
SPECS = ROOT / "specs"


def test_builtin_specs_are_facts_only():
    assert builtin_specs_dir().resolve() in (SPECS.resolve(), builtin_specs_dir().resolve())
    for path in SPECS.glob("*/*.json"):
        text = path.read_text()
        assert '"about"' not in text and "//" not in text, path
        assert "Licensed to the Apache Software Foundation" not in text
    notice = (SPECS / "NOTICE").read_text()
    assert "Apache Kafka" in notice and "The Apache Software Foundation" in notice
    assert "3.9.2, 4.3.1" in notice
    assert "Apache License" in (SPECS / "LICENSE").read_text()
    index = json.loads((SPECS / "index.json").read_text())
    assert [layer["release"] for layer in index["layers"]] == ["3.9.2", "4.3.1"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="the Apache inputs live beside the checkout")
def test_builtin_specs_are_what_the_importer_makes(tmp_path):
    """specs/ is reproducible from the Apache inputs: re-import and compare file by file."""
    import_specs([("3.9.2", SHARED / "3.9.2"), ("4.3.1", SHARED / "4.3.1")], tmp_path)
    made = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    ours = {p.relative_to(SPECS): p.read_bytes() for p in SPECS.rglob("*") if p.is_file() and p.suffix != ".py"}
    assert made == ours


@pytest.mark.skipif(not SHARED.is_dir(), reason="the Apache inputs live beside the checkout")
def test_facts_survive_the_import():
    """Every definition parses to the same model from the upstream file and from specs/."""
    for release in ("3.9.2", "4.3.1"):
        for upstream in (SHARED / release).glob("*.json"):
            a = parse_message(load_spec_file(upstream))
            b = parse_message(load_spec_file(SPECS / release / upstream.name))
            assert (a.struct, a.common_structs, a.valid_versions, a.flexible_versions) == (
                b.struct, b.common_structs, b.valid_versions, b.flexible_versions)


def _write(tmp_path: Path, doc: dict | str) -> Path:
    (tmp_path / "X.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return tmp_path


def _request(fields, **extra) -> dict:
    return {"apiKey": 9100, "type": "request", "name": "XRequest", "validVersions": "0-1",
            "flexibleVersions": "1+", "fields": fields, **extra}


@pytest.mark.parametrize(
    "doc, problem",
    [
        (_request([{"name": "__import__('os').system('x')", "type": "int32", "versions": "0+"}]), "not an identifier"),
        (_request([{"name": "A", "type": "int32); import os #", "versions": "0+"}]), "not a valid type"),
        (_request([{"name": "A", "type": "int32", "versions": "0+", "exec": 1}]), "unknown keys"),
        (_request([{"name": "A", "type": "int32", "versions": "zero+"}]), "not a version range"),
        (_request([{"name": "A", "type": "int32", "versions": "0+", "nullableVersions": "0+"}]), "cannot be nullable"),
        (_request([{"name": "A", "type": "int16", "versions": "0+", "default": "70000"}]), "does not fit"),
        (_request([{"name": "A", "type": "[]Missing", "versions": "0+"}]), "not a common struct"),
        (_request([{"name": "A", "type": "Loop", "versions": "0+"}],
                  commonStructs=[{"name": "Loop", "versions": "0+", "fields": [
                      {"name": "B", "type": "Loop", "versions": "0+"}]}]), "contains itself"),
        (_request([{"name": "A", "type": "int32", "versions": "0+", "tag": 1, "taggedVersions": "1+"},
                   {"name": "B", "type": "int32", "versions": "0+", "tag": 1, "taggedVersions": "1+"}]), "tag 1 is used twice"),
        (_request([{"name": "A", "type": "int32", "versions": "0+"}, {"name": "A", "type": "int8", "versions": "0+"}]),
         "defined twice"),
        ({"apiKey": 99999, "type": "request", "name": "XRequest", "validVersions": "0", "fields": []}, "apiKey"),
        ("{ not json", "line 1"),
    ],
)
def test_hostile_or_broken_specs_are_refused(tmp_path, doc, problem):
    with pytest.raises(SpecError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        SpecRegistry.default([_write(tmp_path, doc)])


def test_a_valid_custom_spec_never_runs_code(tmp_path):
    """Names reach generated code only as string literals: a field named like code is just a key."""
    doc = _request([{"name": "os_system", "type": "string", "versions": "0+",
                     "default": "'); raise SystemExit('pwned') #"}])
    codec = Codec(SpecRegistry.default([_write(tmp_path, doc)]))
    compiled = codec.body(9100, "request", 0)
    encoded = bytes(compiled.encode({}))  # the default is a value, never source
    assert compiled.decode(encoded)[0] == {"os_system": "'); raise SystemExit('pwned') #"}


def test_importer_needs_the_notices(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "XRequest.json").write_text(json.dumps(_request([])))
    with pytest.raises(SpecError, match="LICENSE and NOTICE"):
        import_specs([("x", src)], tmp_path / "out")
    index = import_specs([("x", src)], tmp_path / "out2", require_notices=False)
    assert index["layers"][0]["files"] == 1


def test_the_api_key_table_is_generated_from_the_specs():
    """kinspect/protocol/specs/api_keys.py is what the shipped specs give (make specs writes it)."""
    from kinspect.protocol.specs import api_key_table

    committed = (ROOT / "kinspect" / "protocol" / "specs" / "api_keys.py").read_text("utf-8")
    assert committed == api_key_table.render()
    from kinspect.protocol.specs import api_keys

    assert api_keys.PRODUCE == 0 and api_keys.API_VERSIONS == 18 and api_keys.DESCRIBE_CLUSTER == 60
    assert api_keys.API_NAMES[3] == "Metadata"
