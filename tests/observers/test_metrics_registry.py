"""kinspect's Prometheus registry follows the client library's conventions.

Every family served is in METRIC_NAMES or RUNTIME_METRIC_NAMES (with its type); the process,
platform and GC collectors report this very process (its RSS, its descriptors); every
collector names its families at registration, so a name clash fails there and not at a scrape;
kinspect_build_info is a prometheus_client Info.
"""

from __future__ import annotations

import os
import sys

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import kinspect
from kinspect.observers.metrics import (
    METRIC_NAMES,
    RUNTIME_METRIC_NAMES,
    SERVER_FAMILIES,
    MetricsObserver,
    ServerCollector,
)


def served(registry) -> dict[str, str]:
    """{name as in METRIC_NAMES: type} of what /metrics renders (counters get their _total back).

    The text format renders a counter's or histogram's creation time as a gauge <name>_created:
    not a family of its own.
    """
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    bases = {f.name for f in families if f.type in ("counter", "histogram")}
    return {f.name + "_total" if f.type == "counter" else f.name: f.type for f in families
            if not (f.name.endswith("_created") and f.name.removesuffix("_created") in bases)}


def test_every_served_family_is_declared_with_its_type():
    assert served(MetricsObserver().registry) == {**METRIC_NAMES, **RUNTIME_METRIC_NAMES}


def test_the_process_collectors_report_this_process():
    registry = MetricsObserver().registry
    rss = registry.get_sample_value("process_resident_memory_bytes")
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    assert rss == pytest.approx(resident_pages * os.sysconf("SC_PAGE_SIZE"), rel=0.2)
    before = registry.get_sample_value("process_open_fds")
    assert before == len(os.listdir("/proc/self/fd"))  # both counts see their own listing's descriptor
    with open(os.devnull, "rb"):
        assert registry.get_sample_value("process_open_fds") == before + 1
    limit = registry.get_sample_value("process_max_fds")
    import resource

    assert limit == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert registry.get_sample_value("python_gc_collections_total", {"generation": "0"}) >= 0
    major, minor, micro = (str(v) for v in sys.version_info[:3])
    assert registry.get_sample_value("python_info", {
        "implementation": sys.implementation.name.capitalize().replace("Cpython", "CPython"),
        "major": major, "minor": minor, "patchlevel": micro, "version": f"{major}.{minor}.{micro}"}) == 1


def test_server_collector_describes_its_families():
    observer = MetricsObserver()
    described = {family.name: family.type for family in ServerCollector(observer).describe()}
    assert described == {name.removesuffix("_total"): kind for name, kind, _, _ in SERVER_FAMILIES}
    assert all(not family.samples for family in ServerCollector(observer).describe())


@pytest.mark.parametrize("make_clash", [
    lambda r: Counter("kinspect_connections_open", "clashes with a ServerCollector gauge", registry=r),
    lambda r: Gauge("kinspect_bytes_total", "clashes with a ServerCollector counter's sample", registry=r),
    lambda r: Counter("kinspect_requests", "clashes with kinspect_requests_total", registry=r),
    lambda r: Gauge("kinspect_build_info", "clashes with the build Info", registry=r),
    lambda r: Gauge("process_resident_memory_bytes", "clashes with the process collector", registry=r),
    lambda r: Counter("python_gc_collections", "clashes with the GC collector", registry=r),
], ids=["server-gauge", "server-counter", "event-counter", "build-info", "process", "gc"])
def test_a_clash_fails_at_registration(make_clash):
    registry = MetricsObserver().registry
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        make_clash(registry)


def test_a_second_server_collector_or_observer_on_one_registry_fails():
    observer = MetricsObserver()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        observer.registry.register(ServerCollector(observer))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        MetricsObserver(registry=observer.registry)


def test_a_name_taken_before_the_observer_fails_its_registration():
    registry = CollectorRegistry(auto_describe=True)
    Gauge("kinspect_tasks", "taken first", registry=registry)
    with pytest.raises(ValueError, match="kinspect_tasks"):
        MetricsObserver(registry=registry)


def test_build_info_is_an_info():
    registry = MetricsObserver().registry
    (family,) = [f for f in registry.collect() if f.name == "kinspect_build"]
    assert family.type == "info"
    (sample,) = family.samples
    assert sample.name == "kinspect_build_info" and sample.value == 1
    assert sample.labels["version"] == kinspect.__version__
    assert sample.labels["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert sample.labels["event_loop"] in ("asyncio", "uvloop") and sample.labels["native"] in ("true", "false")


def test_the_capture_collector_clash_checks_too():
    """The capture writer's collector (registered on the same registry when capture is on) describes
    its families as well: a second one fails at registration."""
    from kinspect.capture.metrics import CaptureCollector

    registry = MetricsObserver().registry
    registry.register(CaptureCollector(writer=None))  # describe() does not read the writer
    with pytest.raises(ValueError, match="kinspect_capture_rows_total"):
        registry.register(CaptureCollector(writer=None))
