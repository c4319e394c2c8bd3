"""The deployment files: Prometheus config and alert rules, and the Grafana dashboard.

- promtool accepts deploy/prometheus/prometheus.yml (also with its Kubernetes job uncommented)
  and deploy/prometheus/alerts.yml;
- every PromQL expression of the dashboard (Grafana variables replaced by concrete values) and
  of the rules parses (promtool check rules on a generated recording-rules file);
- every metric they name is a kinspect metric (kinspect.observers.metrics.METRIC_NAMES, and the
  client inventory's kinspect.observers.inventory.METRIC_NAMES), one of the process collectors'
  (RUNTIME_METRIC_NAMES), or `up`;
- the dashboard: every panel uses ${datasource}, has a title and a target, and the committed JSON
  is exactly what deploy/grafana/make_dashboard.py generates (with grafana-foundation-sdk);
- a real Prometheus (Debian's binary) on a loopback port scrapes a running kinspect's /metrics
  while a real client produces and consumes through it, loads the rules, accepts every
  dashboard and rule expression on /api/v1/query, and sees the series this traffic makes.

promtool and prometheus come from Debian's `prometheus` package. They are required: a missing
binary fails these tests, it does not skip them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.paths import ROOT

PROM_DIR = ROOT / "deploy" / "prometheus"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
ALERTS = PROM_DIR / "alerts.yml"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "kinspect-dashboard.json"
MAKE_DASHBOARD = GRAFANA_DIR / "make_dashboard.py"

# Values for Grafana's variables when an expression is checked outside Grafana.
GRAFANA_VARS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "api": "Produce|Metadata",
    "instance": ".*",
    "datasource": "prometheus",
}

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}


# ---------------------------------------------------------------------------------- helpers


def find_binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if path is None:
        pytest.fail(f"{name} not found in PATH or /usr/bin: install Debian's `prometheus` package "
                    f"(apt-get install -y prometheus)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_binary("promtool"), *args], capture_output=True, text=True,
                          timeout=60)


def allowed_series_names() -> set[str]:
    """Series names the dashboard and rules may use: kinspect's own (the inventory's included) and the
    process's, histograms with suffixes."""
    from kinspect.observers import inventory
    from kinspect.observers.metrics import METRIC_NAMES, RUNTIME_METRIC_NAMES

    types = {**METRIC_NAMES, **inventory.METRIC_NAMES, **RUNTIME_METRIC_NAMES}
    allowed = {"up"}
    for name, kind in types.items():
        allowed.add(name)
        if kind in ("histogram", "summary", "unknown"):
            allowed.update(name + s for s in ("_bucket", "_sum", "_count"))
        if kind in ("counter", "unknown") and not name.endswith("_total"):
            allowed.add(name + "_total")  # prometheus_client adds _total to counter names
    return allowed


def substitute(expr: str) -> str:
    """Replace Grafana variables ($name, ${name}, ${name:format}) by concrete values."""
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in GRAFANA_VARS, f"unknown Grafana variable ${name} in {expr!r}"
        return GRAFANA_VARS[name]
    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)
    assert "$" not in out, out
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers that are not functions or keywords)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", "{}", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "[]", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside collapsed rows
    return out


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(where, expr) of every PromQL expression: panel targets and query-variable selectors."""
    exprs = []
    for panel in all_panels(dashboard):
        for t in panel.get("targets", []):
            exprs.append((f"panel {panel['id']} {panel.get('title')!r} {t.get('refId')}", t["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
        assert m, f"variable {var['name']}: expected label_values(selector, label), got {query!r}"
        exprs.append((f"variable {var['name']}", m.group(1)))
    return exprs


def rule_exprs() -> list[tuple[str, str]]:
    """(alert, expr) from alerts.yml; plain and block (| >) scalars, without a YAML library."""
    lines = ALERTS.read_text(encoding="utf-8").splitlines()
    out: list[tuple[str, str]] = []
    alert = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"\s*- (?:alert|record):\s*(\S+)", line):
            alert = m.group(1)
        if m := re.match(r"(\s*)expr:\s*(.*)$", line):
            indent, value = len(m.group(1)), m.group(2).strip()
            if value[:1] in ("|", ">"):
                block = []
                while i + 1 < len(lines) and (not lines[i + 1].strip()
                                              or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                    i += 1
                    block.append(lines[i].strip())
                value = "\n".join(b for b in block if b)
            else:
                assert value[:1] not in ("'", '"'), f"{alert}: quoted expr not supported here"
            out.append((alert, value))
        i += 1
    return out


def yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a YAML double-quoted scalar


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str) -> dict:
    """GET a Prometheus API URL; its error answers (HTTP 4xx with a JSON body) are returned too."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "http": exc.code, "body": body.decode(errors="replace")}


# ------------------------------------------------------------------------- static checks


@pytest.mark.integration
def test_promtool_check_config():
    r = run_promtool("check", "config", str(PROM_CONFIG))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout + r.stderr


@pytest.mark.integration
def test_promtool_check_config_with_kubernetes_job_uncommented(tmp_path):
    """The commented pod job is valid once uncommented."""
    text = PROM_CONFIG.read_text(encoding="utf-8")
    marker = "  # - job_name: kinspect-pods"
    assert marker in text
    head, tail = text.split(marker, 1)
    tail = "\n".join(re.sub(r"^  # ?", "  ", ln) for ln in (marker + tail).splitlines()) + "\n"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(head + tail, encoding="utf-8")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    assert "kubernetes_sd_configs:\n      - role: pod\n" in tail and "prometheus_io_scrape" in tail
    r = run_promtool("check", "config", str(cfg))
    if r.returncode != 0 and "field kubernetes_sd_configs not found" in r.stdout + r.stderr:
        # Debian builds Prometheus without Kubernetes discovery: check the rest of the job
        # (its relabelling) with a static target in place of the pod discovery.
        cfg.write_text(head + tail.replace(
            "kubernetes_sd_configs:\n      - role: pod\n",
            "static_configs:\n      - targets: [\"127.0.0.1:9464\"]\n"), encoding="utf-8")
        r = run_promtool("check", "config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.integration
def test_promtool_check_rules():
    r = run_promtool("check", "rules", str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    found = re.search(r"SUCCESS: (\d+) rules found", r.stdout + r.stderr)
    assert found and int(found.group(1)) == len(rule_exprs()), r.stdout


def test_rules_cover_the_required_alerts():
    exprs = dict(rule_exprs())
    text = " ".join(exprs.values())
    assert len(exprs) >= 5
    for needle in ("up", "kinspect_decode_failures_total", "kinspect_unknown_api_requests_total",
                   "kinspect_inflight_requests", 'kind="frame_too_large"'):
        assert needle in text, needle
    body = ALERTS.read_text(encoding="utf-8")
    assert body.count("summary:") == len(exprs) and body.count("description:") == len(exprs)


@pytest.mark.integration
def test_dashboard_exprs_parse_with_promtool(tmp_path):
    exprs = dashboard_exprs(load_dashboard())
    assert exprs
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for n, (where, expr) in enumerate(exprs):
        lines.append(f"      - record: kinspect_dashboard:expr_{n}")
        lines.append(f"        expr: {yaml_str(substitute(expr))}")
    rules = tmp_path / "dashboard_rules.yml"
    rules.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = run_promtool("check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr + "\n" + "\n".join(
        f"{n}: {w}: {e}" for n, (w, e) in enumerate(exprs))
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout


@pytest.mark.integration
def test_rule_exprs_reparse_with_promtool(tmp_path):
    """The extractor used below sees the same expressions promtool accepts."""
    exprs = rule_exprs()
    lines = ["groups:", "  - name: alerts", "    rules:"]
    for n, (alert, expr) in enumerate(exprs):
        lines += [f"      - alert: A{n}", f"        expr: {yaml_str(expr)}"]
    rules = tmp_path / "alert_exprs.yml"
    rules.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = run_promtool("check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr


def test_metric_names_are_the_contracts():
    allowed = allowed_series_names()
    used: dict[str, str] = {}
    for where, expr in dashboard_exprs(load_dashboard()):
        for name in metric_names(substitute(expr)):
            used.setdefault(name, where)
    for alert, expr in rule_exprs():
        for name in metric_names(expr):
            used.setdefault(name, f"alert {alert}")
    assert used
    unknown = {name: where for name, where in used.items() if name not in allowed}
    assert not unknown, f"metrics not in the kinspect contract: {unknown}"


def test_metric_name_extraction():
    assert metric_names('sum by (api, le) (rate(kinspect_x_bucket{api=~"a|b"}[5m])) > 0.8') == {
        "kinspect_x_bucket"}
    assert metric_names("a / on(instance) (b > 0) * c unless up") == {"a", "b", "c", "up"}


def test_dashboard_panels():
    d = load_dashboard()
    assert d["uid"] == "kinspect"
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "api" in variables and variables["api"]["type"] == "query"
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == ds, var["name"]
    panels = all_panels(d)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    data_panels = [p for p in panels if p["type"] != "row"]  # rows only group panels
    assert len(data_panels) >= 15
    for p in panels:
        assert p.get("title"), p
    for p in data_panels:
        assert p.get("datasource") == ds, p["title"]
        assert p.get("targets"), p["title"]
        for t in p["targets"]:
            assert t.get("datasource") == ds, (p["title"], t)
            assert t.get("expr"), (p["title"], t)
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Overview", "Sizes", "Tagged fields", "Latency and errors", "Produce", "Upgrade readiness",
                    "Health", "Process"]
    titles = " | ".join(p["title"] for p in data_panels).lower()
    for needle in ("request size", "response size", "p50 / p99", "request rate", "tagged-field",
                   "tag-section", "latency", "error", "produced records", "produced batches",
                   "connections", "bytes by direction", "decode failures", "problems",
                   "in-flight", "build info", "client software", "target release", "resident memory",
                   "file descriptors"):
        assert needle in titles, needle
    heatmaps = [p for p in data_panels if p["type"] == "heatmap"]
    assert len(heatmaps) == 2
    for p in heatmaps:
        assert p["repeat"] == "api"
        assert p["targets"][0]["format"] == "heatmap"
        assert "_bucket" in p["targets"][0]["expr"] and "by (le)" in p["targets"][0]["expr"]


@pytest.mark.integration
def test_dashboard_is_generated(tmp_path):
    out = tmp_path / "dashboard.json"
    for _ in range(2):  # twice: the output must not change from one run to the next
        r = subprocess.run([sys.executable, str(MAKE_DASHBOARD), "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == DASHBOARD.read_bytes(), \
            "kinspect-dashboard.json is stale: run python3 deploy/grafana/make_dashboard.py"


# ---------------------------------------------------------------- against a real Prometheus


@dataclass
class MetricsEndpoint:
    target: str  # host:port Prometheus scrapes
    metrics_path: str
    exposes: set[str] | None  # base metric names it is known to expose (None: not known)


@pytest.fixture(scope="module")
def metrics_endpoint():
    """What Prometheus scrapes: a running kinspect's own /metrics, with real traffic through it.

    Tansu behind kinspect (passthrough); a confluent-kafka client creates a topic twice (an
    error code), produces and consumes; the traffic keeps flowing while Prometheus scrapes.
    """
    import threading

    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from kinspect.observers.http_endpoints import HttpEndpoints, readiness_of
    from kinspect.observers.metrics import MetricsObserver
    from tests.support.proxy_harness import ProxyHarness
    from tests.support.tansu import TansuBroker, free_port

    listen = free_port()
    broker = TansuBroker(advertised_port=listen).start()
    metrics = MetricsObserver()
    harness = ProxyHarness({"proxy.listen": f"127.0.0.1:{listen}", "proxy.upstream": broker.bootstrap},
                           observers=(metrics,))
    stop = threading.Event()
    traffic = None
    try:
        harness.start()
        metrics.server = harness.server
        endpoints = harness.call(HttpEndpoints(metrics.registry, readiness_of(harness.server)).start())
        bootstrap = f"127.0.0.1:{listen}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for _ in range(2):  # the second attempt answers TOPIC_ALREADY_EXISTS
            for future in admin.create_topics([NewTopic("scraped", 1, 1)]).values():
                try:
                    future.result(15)
                except Exception:
                    pass

        def produce_and_consume():
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "scrape", "session.timeout.ms": 6000,
                                 "auto.offset.reset": "earliest"})
            consumer.subscribe(["scraped"])
            i = 0
            while not stop.is_set():
                producer.produce("scraped", value=b"v%d" % i)
                producer.poll(0)
                consumer.poll(0.05)
                i += 1
            producer.flush(5)
            consumer.close()

        traffic = threading.Thread(target=produce_and_consume, daemon=True)
        traffic.start()
        # Series this traffic always produces (opt-in topic bytes and rarer problems may be absent).
        always = {
            "kinspect_requests_total", "kinspect_responses_total", "kinspect_request_size_bytes_bucket",
            "kinspect_response_size_bytes_bucket", "kinspect_header_size_bytes_bucket",
            "kinspect_request_latency_seconds_bucket", "kinspect_response_errors_total",
            "kinspect_produced_records_total", "kinspect_produced_batches_total", "kinspect_connections_open",
            "kinspect_connections_total", "kinspect_bytes_total", "kinspect_inflight_requests",
            "kinspect_inflight_limit", "kinspect_build_info", "up",
            # the process, platform and GC collectors on kinspect's registry
            "process_resident_memory_bytes", "process_open_fds", "process_max_fds", "process_cpu_seconds_total",
            "python_gc_collections_total",
        }
        yield MetricsEndpoint(f"127.0.0.1:{endpoints.port}", "/metrics", always)
    finally:
        stop.set()
        if traffic is not None:
            traffic.join(15)
        try:
            harness.call(endpoints.close()) if "endpoints" in locals() else None
        finally:
            harness.stop()
            broker.stop()


@dataclass
class PrometheusServer:
    url: str
    job: str

    def query(self, expr: str) -> dict:
        return http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


@pytest.fixture(scope="module")
def prometheus(metrics_endpoint, tmp_path_factory):
    binary = find_binary("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    shutil.copy(ALERTS, work / "alerts.yml")
    job = "kinspect"
    (work / "prometheus.yml").write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "rule_files:\n"
        "  - alerts.yml\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n"
        f"    metrics_path: {metrics_endpoint.metrics_path}\n"
        "    static_configs:\n"
        f"      - targets: [{json.dumps(metrics_endpoint.target)}]\n",
        encoding="utf-8",
    )
    port = free_port()
    log = open(work / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, cwd=work,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}: "
                            f"{(work / 'prometheus.log').read_text(errors='replace')}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        server = PrometheusServer(url, job)
        # Wait for scrapes: up == 1, and two samples so rate() has something to work with.
        while True:
            r = server.query(f'count_over_time(up{{job="{job}"}}[1m])')
            if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) >= 2:
                break
            assert time.monotonic() < deadline, f"no scrapes: {r}"
            time.sleep(0.3)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


@pytest.mark.integration
def test_prometheus_scrapes_endpoint(prometheus):
    r = prometheus.query(f'up{{job="{prometheus.job}"}}')
    assert r["status"] == "success"
    assert [s["value"][1] for s in r["data"]["result"]] == ["1"]


@pytest.mark.integration
def test_prometheus_accepts_dashboard_exprs(prometheus):
    failures = []
    for where, expr in dashboard_exprs(load_dashboard()):
        r = prometheus.query(substitute(expr))
        if r.get("status") != "success":
            failures.append((where, expr, r))
    assert not failures, failures


@pytest.mark.integration
def test_prometheus_accepts_rule_exprs(prometheus):
    for alert, expr in rule_exprs():
        r = prometheus.query(expr)
        assert r.get("status") == "success", (alert, expr, r)


@pytest.mark.integration
def test_prometheus_loads_and_evaluates_rules(prometheus):
    alerts = [a for a, _ in rule_exprs()]
    deadline = time.monotonic() + 15
    while True:
        groups = http_json(f"{prometheus.url}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("health") == "ok" for r in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.3)
    assert sorted(r["name"] for r in rules) == sorted(alerts)


@pytest.mark.integration
def test_dashboard_metrics_exist_in_scrape(prometheus, metrics_endpoint):
    """The series that this traffic must produce, and that the dashboard and rules use, are scraped."""
    deadline = time.monotonic() + 20
    while True:
        r = prometheus.query(f'count by (__name__) ({{job="{prometheus.job}"}})')
        present = {s["metric"]["__name__"] for s in r["data"]["result"]}
        used = set()
        for _, expr in dashboard_exprs(load_dashboard()):
            used |= metric_names(substitute(expr))
        for _, expr in rule_exprs():
            used |= metric_names(expr)
        missing = sorted((used & metrics_endpoint.exposes) - present)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, missing
    assert metrics_endpoint.exposes <= used | {"up"}, sorted(metrics_endpoint.exposes - used)
