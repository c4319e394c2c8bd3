"""The Docker image recipe and the deploy/ manifests, proved without a Docker engine.

- Dockerfile: parsed and held to the rules (two stages on a slim base, numeric non-root USER,
  EXPOSE, a HEALTHCHECK on /healthz that needs only Python, the config at a mounted path, only
  the `proxy` extra installed, .dockerignore sending what COPY needs). The image itself is
  built and run with podman in tests/deploy/test_container_image.py; the wheel's contents are
  checked in tests/project/test_install.py.
- deploy/kubernetes: every core manifest validates (strict) against the Kubernetes schemas
  bundled by kubernetes-validate; the PodMonitor against the prometheus-operator CRD models of
  cloudcoil-models-prometheus-operator; the ConfigMap's config loads with load_config, and
  the probes, ports, annotations and PodMonitor agree with it.
- deploy/compose: compose.yaml validates against the Compose specification's schema (vendored
  by check-jsonschema); its mounts exist; Prometheus's config passes promtool as mounted;
  Grafana's provisioning reaches the dashboard; the kinspect config loads and its ports are
  published; the Tansu settings are ones the Tansu binary of the tests accepts.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

import pytest
import yaml

from kinspect.config import load_config
from tests.support.tansu import free_port, tansu_binary
from tests.deploy.test_deploy import run_promtool
from tests.support.extensions import c_extensions
from tests.support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
K8S_DIR = ROOT / "deploy" / "kubernetes"
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "kinspect-dashboard.json"
TANSU_NODE_ID = 111  # Tansu's fixed broker node id
KUBERNETES_VERSIONS = ("1.29", "1.37")  # native sidecars (restartable init containers) .. newest bundled
BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------ Dockerfile model


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, backslash continuations joined."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"unterminated instruction: {buf!r}"
    return out


def dockerfile_stages(text: str) -> list[dict]:
    """Stages: {"base", "name", "instructions"}; ARGs declared before the first FROM expanded."""
    args: dict[str, str] = {}
    stages: list[dict] = []
    for word, rest in dockerfile_instructions(text):
        if word == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            for name, value in args.items():
                rest = rest.replace("${" + name + "}", value).replace("$" + name, value)
            parts = rest.split()
            base = parts[0]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append({"base": base, "name": name, "instructions": []})
        else:
            assert stages, f"{word} before the first FROM"
            stages[-1]["instructions"].append((word, rest))
    return stages


def of(stage: dict, word: str) -> list[str]:
    return [rest for w, rest in stage["instructions"] if w == word]


def exec_form(rest: str) -> list[str]:
    """The JSON array of an exec-form instruction (after any --flags)."""
    start = rest.index("[")
    value = json.loads(rest[start:])
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), rest
    return value


def copy_args(rest: str) -> tuple[dict[str, str], list[str], str]:
    """COPY [--flag=value...] SRC... DEST -> (flags, sources, dest)."""
    words = shlex.split(rest)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words[:-1], words[-1]


def env_of(stage: dict) -> dict[str, str]:
    env = {}
    for rest in of(stage, "ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="module")
def stages() -> list[dict]:
    return dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def runtime(stages) -> dict:
    return stages[-1]


@pytest.fixture(scope="module")
def builder(stages) -> dict:
    (stage,) = [s for s in stages if s["name"] == "builder"]
    return stage


def image_config_path(runtime: dict) -> str:
    cmd = exec_form(of(runtime, "CMD")[-1])
    assert cmd[0] == "--config", cmd
    return cmd[1]


def image_default_config(runtime: dict) -> Path:
    """The repository file the runtime stage copies to the --config path."""
    target = image_config_path(runtime)
    for rest in of(runtime, "COPY"):
        flags, sources, dest = copy_args(rest)
        if "from" not in flags and dest == target:
            (source,) = sources
            return ROOT / source
    pytest.fail(f"the runtime stage copies no default config to {target}")


# ------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(excludes, pattern) in order: Docker's rules, the last matching line wins."""
    rules = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        rules.append((not negate, _pattern_regex(pattern.strip("/"))))
    return rules


def ignored(rel: str, rules) -> bool:
    """A path is excluded when the last rule matching it or one of its parent dirs excludes."""
    parts = PurePosixPath(rel).parts
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for excludes, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            result = excludes
    return result


# ------------------------------------------------------------------------ Dockerfile tests


def test_two_stages_on_a_slim_base(stages, builder, runtime):
    assert len(stages) >= 2
    for stage in stages:
        assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", stage["base"]), stage["base"]
    assert runtime is not builder
    assert runtime["base"] == builder["base"], "the copied venv needs the same interpreter path"
    runtime_runs = " ".join(of(runtime, "RUN"))
    for tool in ("gcc", "apt-get install", "pip install", "build-essential"):
        assert tool not in runtime_runs, f"the runtime stage must not run {tool}"
    froms = [copy_args(r) for r in of(runtime, "COPY") if "--from" in r]
    assert [(f["from"], s, d) for f, s, d in froms] == [("builder", ["/opt/venv"], "/opt/venv")]
    assert "gcc" in " ".join(of(builder, "RUN"))


def test_only_the_proxy_extra_is_installed(builder):
    runs = " ".join(of(builder, "RUN"))
    installs = re.findall(r"pip install [^&]*", runs)
    assert installs, runs
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in runs
    for line in installs:
        assert "pyspark" not in line and "pipeline" not in line and "test" not in line, line
    assert any("[proxy]" in line for line in installs), installs
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"]
    assert not any(d.lower().startswith("pyspark") for d in extras["proxy"]), extras["proxy"]
    assert "import kinspect.protocol.codec._wire" in runs, "a missing compiler must fail the build"


def test_the_build_fails_without_any_c_extension(builder):
    """setup.py marks every extension optional: the builder's import check is what fails the image's build where
    one did not compile, so it names each of them."""
    (check,) = re.findall(r'python -P -c "import ([^"]+)"', " ".join(of(builder, "RUN")))
    assert sorted(m.strip() for m in check.split(",")) == sorted(c_extensions())


def test_runs_as_a_numeric_non_root_user(runtime):
    user = of(runtime, "USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, user
    assert not gid or (gid.isdigit() and int(gid) != 0), user
    runs = " ".join(of(runtime, "RUN"))
    assert f"--uid {uid}" in runs, "the user exists in /etc/passwd too"
    # Every instruction after USER runs unprivileged: nothing may need root there.
    words = [w for w, _ in runtime["instructions"]]
    assert "RUN" not in words[words.index("USER"):]


def test_ports_healthcheck_and_entrypoint(runtime):
    config = load_config(image_default_config(runtime))
    metrics_port = int(config.metrics.listen.rsplit(":", 1)[1])
    listen_port = int(config.proxy.listen.rsplit(":", 1)[1])
    exposed = {int(p.split("/")[0]) for rest in of(runtime, "EXPOSE") for p in rest.split()}
    assert {metrics_port, listen_port} <= exposed, exposed
    assert exec_form(of(runtime, "ENTRYPOINT")[-1]) == ["kinspect", "proxy"]
    (health,) = of(runtime, "HEALTHCHECK")
    argv = exec_form(health.partition(" CMD ")[2])
    assert argv[:2] == ["python", "-c"] and "urllib.request" in argv[2], argv
    assert not re.search(r"\b(curl|wget)\b", health)
    url = env_of(runtime)["KINSPECT_HEALTHZ_URL"]
    assert url == f"http://127.0.0.1:{metrics_port}/healthz", url
    assert "PYTHONDONTWRITEBYTECODE" in env_of(runtime)  # read-only root filesystems
    assert env_of(runtime)["PATH"].startswith("/opt/venv/bin:")


def test_config_is_read_from_a_mounted_path(runtime):
    path = image_config_path(runtime)
    assert path == "/etc/kinspect/kinspect.toml"
    volume = f":{path}:ro"
    text = DOCKERFILE.read_text("utf-8")
    assert re.search(r"-v \S+" + re.escape(volume), text), "the Dockerfile documents the -v mount"
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"-v \S+" + re.escape(volume), section), "README ## Deploying shows the mount"
    # The default copied there is the sidecar config, and it loads.
    assert image_default_config(runtime) == ROOT / "deploy" / "config" / "kinspect-sidecar.toml"
    assert load_config(image_default_config(runtime)).metrics.listen.startswith("0.0.0.0:")


def test_dockerignore_sends_what_copy_needs_and_nothing_else(stages, tmp_path):
    rules = dockerignore_rules()
    for stage in stages:
        for rest in of(stage, "COPY"):
            flags, sources, _ = copy_args(rest)
            if "from" in flags:
                continue
            for source in sources:
                assert (ROOT / source).exists(), source
                assert not ignored(source, rules), f"{source} is copied but .dockerignore drops it"
    for rel in (".venv/bin/python", "tests/test_cli.py", ".git/HEAD", "build/x",
                "kinspect/protocol/codec/_wire.cpython-311-x86_64-linux-gnu.so",
                "kinspect/__pycache__/config.cpython-311.pyc", "benchmarks/bench_codec.py",
                "deploy/compose/compose.yaml"):
        assert ignored(rel, rules), rel
    for rel in ("kinspect/protocol/codec/_wire.c", "specs/index.json", "setup.py"):
        assert not ignored(rel, rules), rel


# ------------------------------------------------------------------------------ Kubernetes


def k8s_docs() -> list[tuple[Path, dict]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if doc is not None:
                docs.append((path, doc))
    return docs


def k8s_kind(kind: str) -> dict:
    (doc,) = [d for _, d in k8s_docs() if d["kind"] == kind]
    return doc


def validate_k8s(doc: dict, version: str) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, version, strict=True)


def sidecar() -> tuple[dict, dict]:
    """(pod spec, kinspect container): a restartable init container or a plain container."""
    pod = k8s_kind("Deployment")["spec"]["template"]["spec"]
    found = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "kinspect"]
    assert len(found) == 1, "one container named kinspect"
    return pod, found[0]


def configmap_config(tmp_path: Path):
    """The ConfigMap's kinspect.toml, loaded by kinspect's own load_config."""
    data = k8s_kind("ConfigMap")["data"]
    path = tmp_path / "kinspect.toml"
    path.write_text(data["kinspect.toml"], encoding="utf-8")
    return load_config(path)


def test_manifests_validate_against_the_kubernetes_schemas():
    docs = [(p, d) for p, d in k8s_docs() if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for _, d in docs} == {"ConfigMap", "Deployment"}
    for version in KUBERNETES_VERSIONS:
        for path, doc in docs:
            validate_k8s(doc, version)  # raises with the failing path


def test_the_schema_check_is_strict():
    """The validator catches a misspelt field, a wrong type and a bad enum value."""
    import kubernetes_validate

    deployment = k8s_kind("Deployment")
    broken = []
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["initContainers"][0]["livenesProbe"] = {}
    broken.append(d)
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["initContainers"][0]["ports"][0]["containerPort"] = "9464"
    broken.append(d)
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = "yes"
    broken.append(d)
    for doc in broken:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_k8s(doc, KUBERNETES_VERSIONS[-1])


def validate_podmonitor(doc: dict) -> None:
    """Against prometheus-operator's CRD (as cloudcoil's generated models); unknown keys fail too."""
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor

    model = PodMonitor.model_validate(doc)
    # The models ignore unknown keys; a round trip that loses one shows it.
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc


def test_podmonitor_validates_against_the_operator_crd():
    doc = k8s_kind("PodMonitor")
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    validate_podmonitor(doc)
    bad = copy.deepcopy(doc)
    bad["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(Exception, match="interval"):
        validate_podmonitor(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["podMetricEndpoints"] = bad["spec"].pop("podMetricsEndpoints")
    with pytest.raises(AssertionError):
        validate_podmonitor(bad)


def test_configmap_config_loads_and_fits_a_pod(tmp_path):
    config = configmap_config(tmp_path)
    assert config.proxy.mode == "rewrite"
    # The application's side: loopback only, and every broker rewritten to loopback too.
    assert config.proxy.listen == "127.0.0.1:9092"
    assert config.proxy.advertised_host == "127.0.0.1"
    assert config.proxy.node_port_base > 0 and config.proxy.bootstrap_servers
    assert config.metrics.enabled and config.metrics.listen.startswith("0.0.0.0:")
    # Node ports must not land on the other listeners for node ids up to 1000.
    node_ports = range(config.proxy.node_port_base, config.proxy.node_port_base + 1001)
    for address in (config.proxy.listen, config.metrics.listen):
        assert int(address.rsplit(":", 1)[1]) not in node_ports


def test_sidecar_wiring_matches_the_config(tmp_path, runtime):
    config = configmap_config(tmp_path)
    metrics_port = int(config.metrics.listen.rsplit(":", 1)[1])
    pod, kinspect = sidecar()
    if kinspect in pod.get("initContainers", []):
        assert kinspect.get("restartPolicy") == "Always", "an init container that never ends must be a sidecar"
    ports = {p["name"]: p["containerPort"] for p in kinspect["ports"]}
    assert ports == {"metrics": metrics_port}

    def probe_target(probe: dict) -> tuple[str, int]:
        get = probe["httpGet"]
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        return get["path"], port

    assert probe_target(kinspect["livenessProbe"]) == ("/healthz", metrics_port)
    assert probe_target(kinspect["readinessProbe"]) == ("/readyz", metrics_port)
    assert probe_target(kinspect["startupProbe"]) == ("/readyz", metrics_port)
    # The config reaches the image's --config path.
    config_path = PurePosixPath(image_config_path(runtime))
    assert kinspect["args"] == ["--config", str(config_path)]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in kinspect["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    assert volumes[mount["name"]]["configMap"]["name"] == k8s_kind("ConfigMap")["metadata"]["name"]
    assert config_path.name in k8s_kind("ConfigMap")["data"]
    # Hardening.
    sc = kinspect["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert f"{sc['runAsUser']}:{sc['runAsGroup']}" == of(runtime, "USER")[-1]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in pod["containers"] + pod.get("initContainers", []):
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), (container["name"], kind)
    # The application bootstraps from kinspect.
    (client,) = pod["containers"]
    env = {e["name"]: e["value"] for e in client.get("env", [])}
    assert config.proxy.listen in env.values(), env
    # Scraping: annotations on the pod, and the PodMonitor selecting the same pods and port.
    template = k8s_kind("Deployment")["spec"]["template"]["metadata"]
    notes = template["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(metrics_port)
    assert notes.get("prometheus.io/path", "/metrics") == "/metrics"
    monitor = k8s_kind("PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= template["labels"].items()
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert ports[endpoint["port"]] == metrics_port and endpoint["path"] == "/metrics"
    assert re.fullmatch(r"kinspect.*", next(r["replacement"] for r in endpoint["relabelings"]
                                             if r["targetLabel"] == "job"))


# --------------------------------------------------------------------------------- compose


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text("utf-8"))


def bind_mounts(service: dict) -> list[tuple[Path, str]]:
    """(host path resolved from the compose dir, container path) of a service's bind mounts."""
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        assert source.startswith((".", "/")), f"{volume}: a named volume, expected a bind mount"
        out.append(((COMPOSE_DIR / source).resolve(), target))
    return out


def materialise(service: dict, root: Path) -> Path:
    """Lay a service's bind mounts out under root as the container sees them."""
    for source, target in bind_mounts(service):
        dest = root / target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            shutil.copy2(source, dest)
    return root


def published(service: dict) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port)."""
    out = {}
    for spec in service.get("ports", []):
        ip, host, container = str(spec).split(":")
        out[int(container)] = (ip, int(host))
    return out


def compose_kinspect_config(stack: dict):
    (source, _), = [m for m in bind_mounts(stack["services"]["kinspect"]) if m[1].endswith(".toml")]
    return load_config(source)


@pytest.mark.integration
def test_compose_validates_against_the_compose_spec(tmp_path):
    checker = BIN / "check-jsonschema"
    r = subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", COMPOSE_FILE],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = compose()
    bad["services"]["kinspect"]["volumess"] = bad["services"]["kinspect"].pop("volumes")
    bad_file = tmp_path / "compose.yaml"
    bad_file.write_text(yaml.safe_dump(bad), encoding="utf-8")
    r = subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", bad_file],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "volumess" in r.stdout + r.stderr, r.stdout


def test_compose_mounts_and_build_exist(runtime):
    stack = compose()
    assert set(stack["services"]) == {"tansu", "kinspect", "prometheus", "grafana"}
    for name, service in stack["services"].items():
        for source, _ in bind_mounts(service):
            assert source.exists(), f"{name} mounts {source}, which is not in the repository"
            assert ROOT in source.parents, source
        for ip, _ in published(service).values():
            assert ip == "127.0.0.1", f"{name} publishes beyond loopback"
    kinspect = stack["services"]["kinspect"]
    context = (COMPOSE_DIR / kinspect["build"]["context"]).resolve()
    assert context == ROOT and (context / kinspect["build"]["dockerfile"]) == DOCKERFILE
    targets = [t for _, t in bind_mounts(kinspect)]
    assert image_config_path(runtime) in targets
    assert "tansu" in stack["services"]["tansu"]["image"]


def test_compose_kinspect_config_and_ports():
    stack = compose()
    config = compose_kinspect_config(stack)
    services = stack["services"]
    assert config.proxy.mode == "rewrite"
    (bootstrap,) = config.proxy.bootstrap_servers
    host, port = bootstrap.rsplit(":", 1)
    tansu_env = services["tansu"]["environment"]
    assert host in services and host == "tansu"
    assert tansu_env["ADVERTISED_LISTENER_URL"] == f"tcp://{bootstrap}"
    assert tansu_env["LISTENER_URL"].endswith(f":{port}")
    assert tansu_env["STORAGE_ENGINE"].startswith("memory://")
    # What clients on the host are told (advertised_host) is where compose publishes.
    ports = published(services["kinspect"])
    listen = int(config.proxy.listen.rsplit(":", 1)[1])
    node = config.proxy.node_port_base + TANSU_NODE_ID
    metrics = int(config.metrics.listen.rsplit(":", 1)[1])
    for container_port in (listen, node, metrics):
        assert ports.get(container_port) == (config.proxy.advertised_host, container_port), container_port
    assert config.proxy.listen.startswith("0.0.0.0:") and config.metrics.listen.startswith("0.0.0.0:")


@pytest.mark.integration
def test_compose_prometheus_config_passes_promtool_as_mounted(tmp_path):
    stack = compose()
    prometheus = stack["services"]["prometheus"]
    root = materialise(prometheus, tmp_path)
    (config_flag,) = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    config_file = root / config_flag.split("=", 1)[1].lstrip("/")
    r = run_promtool("check", "config", str(config_file))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout + r.stderr
    mounted_alerts = [s for s, _ in bind_mounts(prometheus) if s.name == "alerts.yml"]
    assert mounted_alerts == [ROOT / "deploy" / "prometheus" / "alerts.yml"]
    scrape = yaml.safe_load(config_file.read_text("utf-8"))["scrape_configs"]
    metrics = int(compose_kinspect_config(stack).metrics.listen.rsplit(":", 1)[1])
    (job,) = scrape
    assert re.fullmatch(r"kinspect.*", job["job_name"])  # what alerts.yml's up{job=~...} matches
    assert job["static_configs"][0]["targets"] == [f"kinspect:{metrics}"]


def test_compose_grafana_provisioning_reaches_the_dashboard(tmp_path):
    stack = compose()
    grafana = stack["services"]["grafana"]
    root = materialise(grafana, tmp_path)
    provisioning = root / "etc" / "grafana" / "provisioning"
    (datasources,) = (provisioning / "datasources").glob("*.yaml")
    (source,) = yaml.safe_load(datasources.read_text("utf-8"))["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == f"http://prometheus:{published(stack['services']['prometheus'])[9090][1]}"
    (providers,) = (provisioning / "dashboards").glob("*.yaml")
    (provider,) = yaml.safe_load(providers.read_text("utf-8"))["providers"]
    assert provider["type"] == "file"
    folder = root / provider["options"]["path"].lstrip("/")
    dashboards = sorted(folder.glob("*.json"))
    assert [d.read_bytes() for d in dashboards] == [DASHBOARD.read_bytes()]
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert variable["query"] == source["type"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (root / home.lstrip("/")).read_bytes() == DASHBOARD.read_bytes()


@pytest.mark.integration
def test_compose_tansu_settings_are_tansu_options():
    """The environment compose gives Tansu names options of the Tansu the tests run."""
    r = subprocess.run([str(tansu_binary()), "broker", "--help"], check=False, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    env = compose()["services"]["tansu"]["environment"]
    for name in env:
        if name != "RUST_LOG":  # the Rust logger's own variable
            assert f"[env: {name}=" in r.stdout, name


@pytest.mark.integration
def test_compose_kinspect_config_proxies_tansu_as_advertised_in_compose(tmp_path):
    """Tansu advertising tansu:9092 as in compose, kinspect on compose's config: a client on the
    host produces through kinspect alone. Only what Docker provides is stood in for: loopback
    ports for the published ones, and upstream_map for the compose network's name `tansu`."""
    from confluent_kafka import Producer

    from tests.support.tansu import TansuBroker

    stack = compose()
    config = compose_kinspect_config(stack)
    (source, _), = [m for m in bind_mounts(stack["services"]["kinspect"]) if m[1].endswith(".toml")]
    advertised = stack["services"]["tansu"]["environment"]["ADVERTISED_LISTENER_URL"]
    host, port = advertised.removeprefix("tcp://").rsplit(":", 1)
    metrics_port, listen_port, node_port = free_port(), free_port(), free_port()
    with TansuBroker(advertised_host=host, advertised_port=int(port)) as tansu:
        argv = [BIN / "kinspect", "proxy", "--config", source,
                "--listen", f"127.0.0.1:{listen_port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                "--bootstrap-server", tansu.bootstrap,
                "--node-port-base", str(node_port - TANSU_NODE_ID),
                "--upstream-map", f"{host}:{port}={tansu.bootstrap}"]
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2):
                        break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "kinspect did not start"
                    time.sleep(0.1)
            delivered = []
            producer = Producer({"bootstrap.servers": f"{config.proxy.advertised_host}:{listen_port}",
                                 "broker.address.family": "v4", "message.timeout.ms": 15000})
            producer.produce("compose-demo", b"hello", on_delivery=lambda err, msg: delivered.append(err))
            assert producer.flush(20) == 0
            assert delivered == [None], delivered
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                metrics = r.read().decode()
            assert re.search(r'kinspect_requests_total\{api="Produce",version="\d+"\} 1\.0', metrics)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        # The client was sent to the node listener that kinspect opened for Tansu's node 111.
        assert f"127.0.0.1:{node_port}" in out, out[-3000:]
        # On glibc the proxy serves its reads from the heap (kinspect.proxy.allocator), and says so.
        assert "malloc: blocks under 32 MiB from the heap" in out, out[-3000:]
