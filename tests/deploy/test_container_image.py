"""The container image, built from the Dockerfile and run with podman on this machine.

No image registry is reachable, so the Dockerfile's base (ARG PYTHON_IMAGE) is a local image
made from Debian packages (tests/deploy/container_base.py: mmdebstrap, cached per user). The
build runs on the host network (apt-get and pip need Debian's mirror and PyPI). The image is
checked (non-root user, HEALTHCHECK kept, entrypoint, ports; no compiler, every C extension, the
proxy's packages and no PySpark, pytest or pip), then run on the host network with
a read-only root filesystem in front of a Tansu broker on loopback: its HEALTHCHECK passes
(`podman healthcheck run`) and fails when pointed at a closed port, a real confluent-kafka
client produces and consumes through it, and its /metrics shows the traffic, the native codec,
uvloop and the process's RSS and descriptors.

podman, runc and mmdebstrap come from Debian packages (the Makefile's SYSDEPS installs them);
a missing one fails these tests, it does not skip them.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

from tests.deploy.container_base import BaseImageError, base_image
from tests.deploy.test_deploy_manifests import DOCKERFILE, dockerfile_stages, exec_form, of
from tests.support.extensions import c_extensions
from tests.support.paths import ROOT
from tests.support.tansu import TansuBroker, free_port

pytestmark = pytest.mark.integration

IMAGE = "localhost/kinspect-test:latest"
# Debian 12's crun refuses hosts whose cgroup v2 hierarchy carries controllers beside cgroup v1
# ("cgroups in hybrid mode not supported"); runc runs on those and on pure cgroup v2 alike.
RUNTIME = "runc"
TANSU_NODE_ID = 111  # Tansu's fixed broker node id
TOPIC = "container-demo"
RECORDS = 20
C_EXTENSIONS = c_extensions()
RUNTIME_PACKAGES = ("uvloop", "prometheus_client", "structlog", "pyarrow", "numpy")  # the core and the proxy extra
ABSENT_PACKAGES = ("pyspark", "pytest", "pip")  # no pipeline extra, no test tools, no installer


def require(binary: str) -> None:
    if shutil.which(binary) is None and not os.access(f"/usr/sbin/{binary}", os.X_OK):
        pytest.fail(f"{binary} not found: `make test` installs it (Debian package {binary})")


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", "--runtime", RUNTIME, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {r.returncode}:\n{(r.stdout + r.stderr)[-4000:]}")
    return r


def ulimits() -> list[str]:
    """The host's own open-file and process limits for the containers.

    podman's defaults (nofile 1048576, nproc 4194304) are above what a host without
    CAP_SYS_RESOURCE lets it set (the OCI runtime then fails with "setrlimit: operation not
    permitted"); nproc is also capped at kernel.pid_max, the most processes there can be.
    """
    def value(limit: int) -> int:
        return -1 if limit == resource.RLIM_INFINITY else limit

    nofile = value(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    nproc = value(resource.getrlimit(resource.RLIMIT_NPROC)[0])
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    nproc = pid_max if nproc < 0 else min(nproc, pid_max)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def image_id(name: str) -> str | None:
    r = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


@dataclass
class Built:
    name: str
    inspect: dict
    build_seconds: float


@pytest.fixture(scope="module")
def image() -> Built:
    for binary in ("podman", RUNTIME, "mmdebstrap"):
        require(binary)
    try:
        base = base_image()
    except BaseImageError as exc:
        pytest.fail(str(exc))
    previous = image_id(IMAGE)
    args = ["build", "--format", "docker",  # the OCI format has no HEALTHCHECK field
            "--network", "host", "--pull=never", *ulimits(),
            "--build-arg", f"PYTHON_IMAGE={base}", "-t", IMAGE, "-f", str(DOCKERFILE)]
    # pip in the build trusts what pip on this host trusts (a TLS-intercepting proxy's CA).
    cert = os.environ.get("PIP_CERT")
    if cert and os.path.isfile(cert):
        args += ["-v", f"{cert}:/run/build-ca.crt:ro", "--build-arg", "BUILD_CA_BUNDLE=/run/build-ca.crt"]
    started = time.monotonic()
    podman(*args, str(ROOT), timeout=1200)
    seconds = time.monotonic() - started
    new = image_id(IMAGE)
    if previous and previous != new:
        podman("rmi", previous, check=False)  # the last run's image, now untagged (its layers may stay cached)
    (inspect,) = json.loads(podman("image", "inspect", IMAGE).stdout)
    return Built(IMAGE, inspect, seconds)


def test_image_config(image):
    config = image.inspect["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["kinspect", "proxy"]
    assert config["Cmd"] == ["--config", "/etc/kinspect/kinspect.toml"]
    assert {"19092/tcp", "9464/tcp"} <= set(config["ExposedPorts"])
    (healthcheck,) = of(dockerfile_stages(DOCKERFILE.read_text("utf-8"))[-1], "HEALTHCHECK")
    assert image.inspect["Healthcheck"]["Test"] == ["CMD", *exec_form(healthcheck.partition(" CMD ")[2])]
    assert image.inspect["Healthcheck"]["Interval"] == 15 * 10**9  # nanoseconds: --interval=15s
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["KINSPECT_HEALTHZ_URL"] == "http://127.0.0.1:9464/healthz"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert image.inspect["Size"] < 1024 ** 3, image.inspect["Size"]


def test_image_has_no_compiler_and_only_the_proxy_runtime(image):
    """The runtime stage: no compiler, kinspect from /opt/venv with every C extension loading, the
    proxy's packages, and no PySpark, pytest or pip."""
    packages = (*RUNTIME_PACKAGES, *ABSENT_PACKAGES)
    probe = (f"import importlib, importlib.util, json, kinspect; [importlib.import_module(m) for m in {C_EXTENSIONS!r}]; "
             f"print(json.dumps([kinspect.__file__, {{m: importlib.util.find_spec(m) is not None for m in {packages!r}}}]))")
    r = podman("run", "--rm", *ulimits(), "--entrypoint", "sh", image.name, "-c",
               f'command -v gcc cc; python -P -c "{probe}" && kinspect --help >/dev/null', check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()  # `command -v` printed nothing: no compiler
    where, found = json.loads(line)
    assert where == "/opt/venv/lib/python3.11/site-packages/kinspect/__init__.py", where
    assert found == {m: m in RUNTIME_PACKAGES for m in packages}, found


@dataclass
class Running:
    name: str
    listen: int
    metrics: int
    healthcheck: list[str]


@pytest.fixture(scope="module")
def container(image):
    """The image run on the host network in rewrite mode in front of Tansu on loopback.

    Ports are free loopback ports passed as flags (the image's default config stays in place
    otherwise); the healthcheck's URL follows the metrics port. --health-interval disable: no
    systemd timer; the test runs the healthcheck itself.
    """
    listen, metrics, node = free_port(), free_port(), free_port()
    name = f"kinspect-test-{uuid.uuid4().hex[:8]}"
    with TansuBroker() as tansu:
        podman("run", "-d", "--name", name, "--network", "host", "--read-only", "--health-interval", "disable",
               *ulimits(), "-e", f"KINSPECT_HEALTHZ_URL=http://127.0.0.1:{metrics}/healthz", image.name,
               "--config", "/etc/kinspect/kinspect.toml", "--listen", f"127.0.0.1:{listen}",
               "--bootstrap-server", tansu.bootstrap, "--node-port-base", str(node - TANSU_NODE_ID),
               "--advertised-host", "127.0.0.1", "--metrics-listen", f"127.0.0.1:{metrics}")
        try:
            yield Running(name, listen, metrics, image.inspect["Healthcheck"]["Test"][1:])
        finally:
            logs = podman("logs", name, check=False)
            podman("rm", "-f", "-t", "5", name, check=False)
            print(logs.stdout[-3000:], logs.stderr[-3000:])


def test_container_passes_its_healthcheck(container):
    deadline = time.monotonic() + 60
    while True:
        r = podman("healthcheck", "run", container.name, check=False)
        if r.returncode == 0:
            break
        state = podman("inspect", "--format", "{{.State.Status}}", container.name, check=False).stdout.strip()
        assert state == "running" and time.monotonic() < deadline, (
            f"healthcheck: {r.returncode} {r.stdout}{r.stderr}; container {state}:\n"
            + podman("logs", container.name, check=False).stderr[-3000:])
        time.sleep(0.5)
    health = json.loads(podman("inspect", "--format", "{{json .State.Health}}", container.name).stdout)
    assert health["Status"] == "healthy" and health["Log"][-1]["ExitCode"] == 0, health
    # The same command, pointed at a port nothing listens on, fails: the check can fail.
    closed = free_port()
    r = podman("exec", "-e", f"KINSPECT_HEALTHZ_URL=http://127.0.0.1:{closed}/healthz", container.name,
               *container.healthcheck, check=False)
    assert r.returncode == 1 and "Connection refused" in r.stderr, r.stdout + r.stderr
    # And so does a non-2xx answer (urllib raises on it).
    r = podman("exec", "-e", f"KINSPECT_HEALTHZ_URL=http://127.0.0.1:{container.metrics}/nope", container.name,
               *container.healthcheck, check=False)
    assert r.returncode == 1 and "404" in r.stderr, r.stdout + r.stderr


def test_a_real_client_produces_and_consumes_through_the_container(container):
    from confluent_kafka import Consumer, Producer

    bootstrap = f"127.0.0.1:{container.listen}"
    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                         "message.timeout.ms": 30000})
    for i in range(RECORDS):
        producer.produce(TOPIC, b"record-%d" % i, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(40) == 0
    assert delivered == [None] * RECORDS, delivered
    consumer = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": "container",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([TOPIC])
    values = []
    try:
        deadline = time.monotonic() + 40
        while len(values) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    assert sorted(values) == sorted(b"record-%d" % i for i in range(RECORDS))

    with urllib.request.urlopen(f"http://127.0.0.1:{container.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    produced = re.findall(r"^kinspect_produced_records_total\{compression=\"\w+\"\} (\S+)$", text, re.M)
    assert sum(map(float, produced)) >= RECORDS, text[:2000]  # a retried batch counts again
    assert re.search(r'^kinspect_requests_total\{api="Fetch",version="\d+"\} [1-9]', text, re.M)
    info = re.search(r"^kinspect_build_info\{(.*)\} 1\.0$", text, re.M)
    assert info and 'event_loop="uvloop"' in info.group(1) and 'native="true"' in info.group(1), info
    rss = re.search(r"^process_resident_memory_bytes (\S+)$", text, re.M)
    fds = re.search(r"^process_open_fds (\S+)$", text, re.M)
    assert rss and float(rss.group(1)) > 10e6 and fds and float(fds.group(1)) >= 5, (rss, fds)


def test_container_runs_unprivileged_on_a_read_only_root(container):
    r = podman("exec", container.name, "sh", "-c", "id -u; id -g; touch /opt/venv/x", check=False)
    assert r.stdout.split() == ["10001", "10001"], r.stdout
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr
