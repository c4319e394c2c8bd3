"""The README and docs/ tell the truth: config reference, capture schema, metric names and commands match the code."""

from __future__ import annotations

import importlib.util
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kinspect.cli.main import build_parser
from kinspect.config import config_keys
from kinspect.observers.metrics import METRIC_NAMES
from tests.support.proxy_harness import TANSU_NODE_ID, api_versions, metadata, recv_frame
from tests.support.tansu import TansuBroker, free_port
from tests.support.paths import ROOT

# The pages whose commands, keys and metric names are checked here: the README and the reference
# moved out of it. A page joins the list once every command it shows maps to a test (EXERCISED).
PAGES = ["README.md"] + [f"docs/{name}.md" for name in (
    "README", "demo", "commands", "install", "configuration", "metrics", "capture", "codec", "fuzzing",
    "testing", "benchmarks")]
DOCS = {page: (ROOT / page).read_text("utf-8") for page in PAGES}
README = "\n".join(DOCS.values())  # every checked page, as one text
TESTS = {p.name: p.read_text("utf-8") for p in (ROOT / "tests").rglob("test_*.py")}
sys.path.insert(0, str(ROOT / "tools"))
import readme_tables  # noqa: E402


def _extra_metric_names() -> set[str]:
    """Metric families served beside METRIC_NAMES (the capture writer's and the client inventory's collectors)."""
    from kinspect.capture import metrics as capture_metrics
    from kinspect.observers import inventory

    return set(capture_metrics.METRIC_NAMES) | set(inventory.METRIC_NAMES)


def test_generated_tables_are_up_to_date():
    """docs/configuration.md's config reference and docs/capture.md's schema equal what the code generates."""
    for name, (page, table) in readme_tables.regions().items():
        text = page.read_text("utf-8")
        assert readme_tables.render(text, name, table) == text, f"{name}: run python tools/readme_tables.py --write"
    assert readme_tables.main([]) == 0


def test_config_reference_is_generated_from_the_documented_config():
    toml_text = (ROOT / "config" / "kinspect.toml").read_text("utf-8")
    documented = [key for key, _, _ in readme_tables.config_entries(toml_text)]
    assert sorted(documented) == sorted(config_keys()), "config/kinspect.toml's keys differ from the code's keys"
    # The defaults column is the code's: proxy.upstream has none, whatever the example file names.
    page = DOCS["docs/configuration.md"]
    assert "| `proxy.upstream` | `\"\"` |" in page
    assert "| `proxy.listen` | `\"127.0.0.1:19092\"` |" in page and "| `inspect.max_inflight` | `1000` |" in page


def test_capture_schema_table_names_every_column():
    from kinspect.capture.schema import COLUMNS, SCHEMA_VERSION, STRUCTS

    page = DOCS["docs/capture.md"]
    rows = set(re.findall(r"^\| `([a-z_.]+)` \| `[^`]+` \|", page, re.M))
    assert {name for name, _, _ in COLUMNS} <= rows
    assert {f"{s}.{name}" for s, members in STRUCTS.items() for name, _, _ in members} <= rows
    assert f"Schema version {SCHEMA_VERSION}." in page


def test_readme_is_one_screen_and_links_the_reference():
    readme = DOCS["README.md"]
    assert len(readme.splitlines()) <= 90
    for page in ("demo", "commands", "install", "configuration", "metrics", "capture", "analyze", "codec",
                 "fuzzing", "testing", "benchmarks", "performance", "deploy", "pcap", "upgrade", "README"):
        assert f"(docs/{page}.md" in readme or f"({page}.md" in DOCS["docs/README.md"], page
    for page in PAGES[1:]:  # every page the README's index reaches exists
        assert (ROOT / page).is_file()
    # No developer's machine in the sample output.
    for page, text in DOCS.items():
        assert not re.search(r"/work/|/root/|/home/(?!you/)", text), page


def test_every_metric_is_in_the_readme_and_every_name_there_exists():
    known = set(METRIC_NAMES) | _extra_metric_names()
    in_readme = set(re.findall(r"\bkinspect_[a-z_]+[a-z]\b", README))
    # Histogram series names (_bucket/_sum/_count) count as their family.
    in_readme = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in known else n for n in in_readme}
    assert in_readme - known == set(), "README names metrics the code does not serve"
    # A metric may be documented on its topic's page under docs/ rather than in the README.
    docs = "\n".join(p.read_text("utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    in_docs = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in known else n
               for n in re.findall(r"\bkinspect_[a-z_]+[a-z]\b", docs)}
    assert in_docs - known == set(), "docs/ name metrics the code does not serve"
    assert known - in_readme - in_docs == set(), "metrics missing from the README's reference and docs/"


# ----------------------------------------------------------------------------- commands

# Every command the README shows, by its leading words, with the test that runs it. A new
# command in the README fails test_every_readme_command_is_exercised until it is added here.
EXERCISED = {
    "make run": ("test_make_run.py", "test_make_run_from_a_clean_clone"),
    "make analyze": ("test_make_run.py", "test_make_run_from_a_clean_clone"),
    "make test": ("test_readme.py", "test_ci_runs_make_test"),
    "make test-fast": ("test_markers.py", "test_make_test_fast_leaves_out_integration_tests"),
    "make bench": ("test_benchmarks.py", "test_make_bench_runs_every_benchmark"),
    "make specs": ("test_cli.py", "test_specs_import_command"),
    "kinspect demo": ("test_make_run.py", "test_make_run_from_a_clean_clone"),
    "kinspect proxy --config config/kinspect.toml --capture-dir": ("test_capture.py", "test_the_proxy_command_captures_and_flushes_on_sigterm"),
    "kinspect proxy --config": ("test_readme.py", "test_readme_proxy_commands_run"),
    "kinspect proxy --capture-dir": ("test_capture.py", "test_the_proxy_command_captures_and_flushes_on_sigterm"),
    "kinspect proxy --mode rewrite": ("test_readme.py", "test_readme_proxy_commands_run"),
    "kinspect proxy": ("test_proxy_integration.py", "test_kinspect_proxy_command_rewrite_mode_and_sigterm"),
    "kinspect decode": ("test_cli.py", "test_decode_a_recorded_connection"),
    "kinspect decode requests.bin responses.bin": ("test_cli.py", "test_record_a_conversation_with_socat"),
    "socat -r requests.bin": ("test_cli.py", "test_record_a_conversation_with_socat"),
    "python -c \"from confluent_kafka.admin": ("test_cli.py", "test_record_a_conversation_with_socat"),
    "pip install .": ("test_install.py", "test_pip_install_dot_without_a_compiler"),
    "pip install '.[pipeline]'": ("test_install.py", "test_pip_install_dot_pipeline"),
    "pipx install .": ("test_install.py", "test_pipx_install_dot"),
    "python -m build": ("test_install.py", "test_build_makes_an_sdist_and_a_wheel_with_the_c_codec"),
    # The install hints, run as printed where kinspect was installed that way.
    "pip install 'kinspect[": ("test_install.py", "test_wheel_install_runs_the_base_commands_and_hints_the_extras"),
    "pipx inject kinspect": ("test_install.py", "test_pipx_install_dot"),
    ".venv/bin/kinspect analyze": ("test_make_run.py", "test_make_run_from_a_clean_clone"),
    ".venv/bin/python -m pytest": ("test_markers.py", "test_make_test_fast_leaves_out_integration_tests"),
    "kinspect specs list": ("test_cli.py", "test_specs_list_and_show"),
    "kinspect specs show": ("test_cli.py", "test_specs_list_and_show"),
    "kinspect specs codegen": ("test_specs_codegen.py", "test_codegen_prints_a_decoder_with_locals_named_after_fields"),
    "kinspect specs import": ("test_cli.py", "test_specs_import_command"),
    "kinspect analyze": ("test_analyze.py", "test_cli_end_to_end"),
    "pip install -e '.[pipeline]'": ("test_readme.py", "test_ci_runs_make_test"),
    "pip install -e '.[proxy]'": ("test_deploy_manifests.py", None),
    "python tools/readme_tables.py": ("test_readme.py", "test_config_reference_is_generated_from_the_documented_config"),
    "python benchmarks/": ("test_benchmarks.py", "test_make_bench_runs_every_benchmark"),
    "python benchmarks/soak.py": ("test_benchmarks.py", "test_the_soak_command"),
    # No Docker engine here: podman builds and runs the Dockerfile's image.
    "docker build": ("test_container_image.py", "test_image_config"),
    "docker run": ("test_container_image.py", "test_a_real_client_produces_and_consumes_through_the_container"),
    "docker compose": ("test_deploy_manifests.py", None),
    ".venv/bin/pip install -e '.[fuzz]'": ("test_readme.py", "test_fuzz_commands"),
    ".venv/bin/python fuzz/make_corpus.py": ("test_readme.py", "test_fuzz_commands"),
    "nice .venv/bin/python fuzz/fuzz_codec.py": ("test_readme.py", "test_fuzz_commands"),
}
_INLINE = re.compile(r"`((?:make|kinspect|python|pip|pipx|docker|nice|socat|kcat|\.venv/bin/\w+) [^`]*)`")


def readme_commands(blocks_only: bool = False) -> list[str]:
    """Commands in the README's sh blocks (continuations joined, comments cut) and inline ones."""
    commands, block, pending = [], None, ""
    for line in README.splitlines():  # README.md and the docs pages
        stripped = line.strip()
        if stripped.startswith("```"):
            block = stripped[3:] if block is None else None
            continue
        if block == "sh":
            if stripped.startswith("#"):  # a comment line
                continue
            text = pending + re.sub(r"\s+#\s.*$", "", stripped)
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            for part in text.split("&&"):
                if part.strip():
                    commands.append(" ".join(part.split()))
        elif block is None and not blocks_only:
            commands += [m for m in _INLINE.findall(line) if not m.startswith("kinspect analyze:")]
    return commands


def _covering(command: str):
    keys = [k for k in EXERCISED if command.startswith(k)] or [k for k in EXERCISED if k.startswith(command)]
    return EXERCISED[max(keys, key=len)] if keys else None


def test_every_readme_command_is_exercised():
    commands = readme_commands()
    assert any(c.startswith("make run") for c in commands) and len(commands) > 20
    for command in commands:
        covered = _covering(command)
        assert covered is not None, f"README command not exercised by any test: {command!r} (add it to EXERCISED)"
        file, test = covered
        assert file in TESTS, (command, file)
        if test is not None:
            assert re.search(rf"^(async )?def {test}\(", TESTS[file], re.M), (command, file, test)


def test_readme_kinspect_commands_parse():
    parser = build_parser()
    for command in readme_commands(blocks_only=True):
        if not command.startswith("kinspect "):
            continue
        # Optional parts shown in brackets are taken as given; "..." repeats are dropped.
        argv = shlex.split(command.replace("[", "").replace("]", "").replace("DIR...", "").replace("CAPTURES...", "")
                           .replace(" &", ""))
        argv = ["19092" if a == "P" else a for a in argv]  # the placeholder of a number
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"README command does not parse: {command!r} ({exc})")


def test_ci_runs_make_test():
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert re.search(r"^exec make test$", ci, re.M)
    makefile = (ROOT / "Makefile").read_text("utf-8")
    # make test installs every extra the README's commands use (the pipeline for analyze).
    assert "pip install --quiet -e '.[test,proxy,pipeline]'" in makefile
    assert re.search(r"^test: ", makefile, re.M) and "no tests ran" in makefile
    # ... and the system packages: Java for Spark among them (installed as root, else named).
    tools = re.search(r"^SYSTEM_TOOLS := (.*)$", makefile, re.M).group(1).split()
    assert {"promtool:prometheus", "java:openjdk-17-jre-headless", "socat:socat"} <= set(tools)
    assert re.search(r"^test: \$\(STAMP\) \$\(SYSDEPS\)", makefile, re.M)


@pytest.mark.integration
def test_an_edit_of_the_c_codec_reinstalls(tmp_path):
    """The install stamps depend on the C sources: after an edit of _wire.c, make test and make run rebuild it."""
    venv = tmp_path / "venv"
    venv.mkdir()
    for name in (".installed", ".installed-run"):
        stamp = venv / name
        stamp.touch()  # an install newer than every source
        make = ["make", "-n", f"VENV={venv}", str(stamp)]
        unchanged = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert unchanged.returncode == 0 and "pip install" not in unchanged.stdout, unchanged.stdout
        plan = subprocess.run([*make, "-W", "kinspect/protocol/codec/_wire.c"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert plan.returncode == 0, plan.stderr
        assert "pip install --quiet -e '." in plan.stdout, plan.stdout
        # Quietly: setuptools' editable-install notice is silenced for the build.
        assert 'PYTHONWARNINGS="ignore:Editable installation:UserWarning"' in plan.stdout


@pytest.mark.integration
def test_fuzz_commands(tmp_path):
    """The corpus command builds seeds; every seed passes the harness's check (atheris runs it the same way)."""
    out = tmp_path / "corpus"
    result = subprocess.run([sys.executable, str(ROOT / "fuzz" / "make_corpus.py"), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    seeds = sorted(out.iterdir())
    assert len(seeds) > 100
    spec = importlib.util.spec_from_file_location("fuzz_codec_readme", ROOT / "fuzz" / "fuzz_codec.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    for seed in seeds[::7]:  # a seventh of them: the fuzz tests cover the rest of the mutations
        harness.check(seed.read_bytes())
    # The documented -artifact_prefix=fuzz/crashes/ works on a fresh clone: the harness makes the folder.
    crashes = tmp_path / "fuzz" / "crashes"
    harness.prepare_artifact_dirs(["fuzz_codec.py", "corpus", f"-artifact_prefix={crashes}/", "-timeout=10"])
    assert crashes.is_dir()
    assert re.search(r'^fuzz = \["atheris', (ROOT / "pyproject.toml").read_text("utf-8"), re.M)


def _readme_command(prefix: str) -> list[str]:
    (command,) = {c for c in readme_commands() if c.startswith(prefix) and "--capture-dir" not in c}
    return shlex.split(command)


def _run_proxy(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    log = open(tmp_path / f"kinspect-{len(list(tmp_path.iterdir()))}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "kinspect.cli.main", *argv[1:]], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=log)
    log.close()
    return proc


def _started(proc: subprocess.Popen) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(30), "kinspect printed nothing within 30 s"
    line = proc.stdout.readline().decode()
    assert "proxy listening on" in line, line
    return line


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def _exchange(port: int, frame: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame)
        return recv_frame(sock)


@pytest.mark.integration
def test_readme_proxy_commands_run(tmp_path, codec):
    """The README's two `kinspect proxy` lines, run as shown (addresses made local and free)."""
    with TansuBroker() as tansu:
        # 1. The documented config file, its listeners moved to free ports and its upstream to Tansu.
        argv = _readme_command("kinspect proxy --config config/kinspect.toml")
        assert argv[2:] == ["--config", "config/kinspect.toml"]
        port, metrics_port = free_port(), free_port()
        proc = _run_proxy(argv + ["--listen", f"127.0.0.1:{port}", "--upstream", tansu.bootstrap,
                                  "--metrics-listen", f"127.0.0.1:{metrics_port}"], tmp_path)
        try:
            assert "passthrough mode" in _started(proc)
            response = _exchange(port, api_versions(codec, 5))
            decoded = codec.decode_response(response, 18, 3)
            assert decoded.correlation_id == 5 and decoded.body["ErrorCode"] == 0
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=10) as r:
                assert r.status == 200
        finally:
            assert _stop(proc) == 0

        # 2. Rewrite mode from flags: broker:9092 is Tansu, the ports are free ones.
        argv = _readme_command("kinspect proxy --mode rewrite")
        port, base = free_port(), free_port() - TANSU_NODE_ID
        replace = {"127.0.0.1:19092": f"127.0.0.1:{port}", "broker:9092": tansu.bootstrap, "19100": str(base)}
        argv = [replace.get(a, a) for a in argv] + ["--metrics-listen", f"127.0.0.1:{free_port()}"]
        assert argv[2:] == ["--mode", "rewrite", "--listen", f"127.0.0.1:{port}", "--bootstrap-server",
                            tansu.bootstrap, "--node-port-base", str(base), "--metrics-listen", argv[-1]]
        proc = _run_proxy(argv, tmp_path)
        try:
            assert "rewrite mode" in _started(proc)
            response = _exchange(port, metadata(codec, 9))
            brokers = codec.decode_response(response, 3, 12).body["Brokers"]
            assert [(b["NodeId"], b["Host"], b["Port"]) for b in brokers] == \
                [(TANSU_NODE_ID, "127.0.0.1", base + TANSU_NODE_ID)]
            # The node listener kinspect advertised answers, through to Tansu.
            again = codec.decode_response(_exchange(base + TANSU_NODE_ID, metadata(codec, 10)), 3, 12)
            assert again.correlation_id == 10 and again.body["Brokers"] == brokers
        finally:
            assert _stop(proc) == 0
