"""Targets come from the specs: validVersions per api, and the record format floor."""

from __future__ import annotations

import json
import shutil

import pytest

from kinspect.protocol.errors import SpecError
from kinspect.upgrade.targets import incompatible, load_target
from tests.support.paths import ROOT


def _valid(release: str, file: str) -> tuple[int, int]:
    text = (ROOT / "specs" / release / file).read_text("utf-8")
    raw = json.loads("\n".join(line.split("//")[0] for line in text.splitlines()))["validVersions"]
    low, _, high = raw.partition("-")
    return int(low), int(high or low)


def test_shipped_releases_read_their_own_valid_versions():
    new, old = load_target("4.3.1"), load_target("3.9.2")
    assert new.name == "4.3.1" and old.name == "3.9.2"
    for api_key, file in ((0, "ProduceRequest.json"), (1, "FetchRequest.json"), (18, "ApiVersionsRequest.json")):
        assert new.accepted[api_key] == _valid("4.3.1", file)
        assert old.accepted[api_key] == _valid("3.9.2", file)
    # Kafka 4.0 dropped Produce v0-2 (KIP-896) and with them magic 0/1 batches (KIP-724).
    assert new.accepted[0][0] == 3 and new.min_record_magic == 2
    assert old.accepted[0][0] == 0 and old.min_record_magic == 0


def test_incompatible_reasons():
    new, old = load_target("4.3.1"), load_target("3.9.2")
    assert incompatible(new, 0, 2) == "api version removed"
    assert incompatible(old, 0, 2) is None
    assert incompatible(new, 0, 9, magics=(1, 2)) == "record format v0/v1 removed"
    assert incompatible(new, 0, 9, magics=(2,)) is None
    assert incompatible(old, 0, 9, magics=(0, 1)) is None
    assert incompatible(new, 1, 3) == "api version removed"
    assert incompatible(new, 1, new.accepted[1][1]) is None
    assert incompatible(new, 18, new.accepted[18][1] + 1) == "api version too new"
    assert incompatible(new, 30000, 0) == "api removed"
    # ControlledShutdown (7) was a ZooKeeper-era api: 3.9.2 has it, 4.3.1 does not.
    assert 7 in old.accepted and incompatible(new, 7, 1) == "api removed"


def test_a_user_spec_directory_is_a_target(tmp_path):
    mine = tmp_path / "custom-4.9"
    mine.mkdir()
    text = (ROOT / "specs" / "4.3.1" / "ProduceRequest.json").read_text("utf-8")
    (mine / "ProduceRequest.json").write_text(text.replace('"validVersions": "3-13"', '"validVersions": "5-13"'))
    shutil.copy(ROOT / "specs" / "4.3.1" / "ProduceResponse.json", mine)
    by_name = load_target("custom-4.9", [str(mine)])
    by_path = load_target(str(mine))
    assert by_name.accepted == by_path.accepted == {0: (5, 13)}
    assert incompatible(by_name, 0, 4) == "api version removed"
    assert incompatible(by_name, 3, 12) == "api removed"


def test_an_unknown_target_is_a_one_line_error():
    with pytest.raises(SpecError, match=r"unknown upgrade target '9\.9\.9'.*known: 3\.9\.2, 4\.3\.1"):
        load_target("9.9.9")
