"""Imports Apache Kafka message-definition directories into the project's specs/: facts only.

Every input file is validated with the spec model; what is written keeps the facts the
codec and tools use (names, types, versions, tags, defaults, entity types...) and drops
prose (`about`) and comments. The Apache LICENSE and NOTICE found beside the inputs are
kept in specs/, with the releases and file digests recorded in specs/index.json.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from kinspect.protocol.errors import SpecError
from kinspect.protocol.specs.json_format import load_spec_file
from kinspect.protocol.specs.model import parse_message
from kinspect.protocol.specs.registry import INDEX_FILE, INDEX_FORMAT

_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PROSE_KEYS = frozenset({"about"})


def facts_only(node):
    """A copy of a parsed definition without prose."""
    if isinstance(node, dict):
        return {k: facts_only(v) for k, v in node.items() if k not in PROSE_KEYS}
    if isinstance(node, list):
        return [facts_only(v) for v in node]
    return node


def _find_notice(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory.parent / name):
        if candidate.is_file():
            return candidate
    return None


# Where the input comes from, for the errors that find none.
WHERE_DEFINITIONS_ARE = ("Kafka's message definitions are the *.json files of Apache Kafka's source tree, "
                         "clients/src/main/resources/common/message, at a release tag")


def import_specs(sources: list[tuple[str, Path]], out_dir: Path, *, require_notices: bool = True) -> dict:
    """Import (release, directory) pairs, oldest first, into out_dir; return the index written."""
    out_dir = Path(out_dir)
    layers = []
    license_path = notice_path = None
    for release, directory in sources:
        directory = Path(directory)
        if not _RELEASE.match(release):
            raise SpecError(f"release name {release!r} must be letters, digits, '.', '_' or '-'")
        if not directory.is_dir():
            what = "is not a folder" if directory.exists() else "no such folder"
            raise SpecError(f"{directory}: {what}; {WHERE_DEFINITIONS_ARE}")
        files = sorted(p for p in directory.glob("*.json"))
        if not files:
            raise SpecError(f"{directory}: holds no *.json message definitions; {WHERE_DEFINITIONS_ARE}")
        target = out_dir / release
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        digests = {}
        kinds: dict[str, int] = {}
        for file in files:
            doc = load_spec_file(file)
            msg = parse_message(doc, str(file))  # refuse what the codec could not use
            kinds[msg.kind] = kinds.get(msg.kind, 0) + 1
            (target / file.name).write_text(json.dumps(facts_only(doc), indent=1) + "\n", "utf-8")
            digests[file.name] = hashlib.sha256(file.read_bytes()).hexdigest()
        license_path = _find_notice(directory, "LICENSE") or license_path
        notice_path = _find_notice(directory, "NOTICE") or notice_path
        layers.append(
            {
                "release": release,
                "directory": release,
                "files": len(files),
                "kinds": dict(sorted(kinds.items())),
                "source_sha256": digests,
            }
        )
    if require_notices and (license_path is None or notice_path is None):
        raise SpecError("the Apache LICENSE and NOTICE files were not found beside the input directories")
    if license_path:
        shutil.copyfile(license_path, out_dir / "LICENSE")
    if notice_path:
        notice = notice_path.read_text("utf-8").rstrip("\n")
        releases = ", ".join(layer["release"] for layer in layers)
        notice += (
            "\n\n---\n"
            f"kinspect's specs/ holds facts derived from the Apache Kafka message definitions\n"
            f"(clients/src/main/resources/common/message/) of releases {releases},\n"
            "licensed under the Apache License 2.0 (LICENSE in this directory). They were\n"
            "imported by `kinspect specs import`, which keeps field names, types, versions,\n"
            "tags and defaults and drops the documentation text and comments.\n"
        )
        (out_dir / "NOTICE").write_text(notice, "utf-8")
    index = {"format": INDEX_FORMAT, "layers": layers}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n", "utf-8")
    return index


def parse_source_argument(text: str) -> tuple[str, Path]:
    """`RELEASE=DIR` or a DIR whose name is the release."""
    if "=" in text:
        release, _, directory = text.partition("=")
        return release, Path(directory)
    path = Path(text)
    return path.resolve().name, path
