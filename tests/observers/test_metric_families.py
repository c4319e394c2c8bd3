"""metric_families renders what prometheus_client's own Counter and Histogram render for the same updates."""

from __future__ import annotations

import re
from bisect import bisect_left

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client import metrics as client_metrics
from prometheus_client.exposition import generate_latest

from kinspect.observers.metric_families import CounterFamily, FamiliesCollector, HistogramFamily
from kinspect.observers.metrics import HEADER_BUCKETS, LATENCY_BUCKETS, SIZE_BUCKETS

CREATED = re.compile(r"^(\S+_created(?:\{.*\})?) \S+$", re.M)


def text(registry: CollectorRegistry) -> str:
    return CREATED.sub(r"\1 T", generate_latest(registry).decode())


def observe(family: HistogramFamily, labels: tuple, value: float) -> None:
    cell = family.cell(labels)
    cell[bisect_left(family.bounds, value)] += 1
    cell[family.sum_index] += value


def values_for(buckets) -> list[float]:
    """Every bound, just below and just above it, zero, and past the last bound."""
    out = [0, 0.0]
    for b in buckets:
        out += [b, b * 0.999, b * 1.001]
    return out + [buckets[-1] * 10, 7]


@pytest.mark.parametrize("buckets", [SIZE_BUCKETS, HEADER_BUCKETS, LATENCY_BUCKETS], ids=["size", "header", "latency"])
def test_histograms_match_prometheus_client(buckets):
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    hist = Histogram("h_seconds", "help \\ with \"quotes\"\nand a line", ("a", "b"), buckets=buckets, registry=theirs)
    family = HistogramFamily("h_seconds", "help \\ with \"quotes\"\nand a line", ("a", "b"), buckets)
    ours.register(FamiliesCollector([family]))
    for i, value in enumerate(values_for(buckets)):
        labels = ("x", "é\"\\") if i % 3 else ("y", "")
        hist.labels(*labels).observe(value)
        observe(family, labels, value)
    family.cell(("empty", "series"))
    hist.labels("empty", "series")
    assert text(ours) == text(theirs)
    assert "le=\"+Inf\"" in text(ours) and "h_seconds_sum" in text(ours)


def test_counters_match_prometheus_client():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    labelled = Counter("c_total", "a counter", ("k",), registry=theirs)
    bare = Counter("d_total", "no labels", registry=theirs)
    c, d = CounterFamily("c_total", "a counter", ("k",)), CounterFamily("d_total", "no labels")
    ours.register(FamiliesCollector([c, d]))
    for k, amount in (("a", 1), ("b", 2.5), ("a", 3), ("c", 0), ("b", 1 / 3)):
        labelled.labels(k).inc(amount)
        c.cell((k,))[0] += amount
    assert text(ours) == text(theirs)
    assert "d_total 0.0" in text(ours)  # a counter without labels exists from the start
    with pytest.raises(ValueError):
        CounterFamily("c", "a counter's name ends with _total")


def test_created_series_follow_prometheus_client_switch():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    Counter("c_total", "a counter", registry=theirs).inc()
    Histogram("h", "a histogram", buckets=(1, 2), registry=theirs).observe(1.5)
    c, h = CounterFamily("c_total", "a counter"), HistogramFamily("h", "a histogram", (), (1, 2))
    c.cell(())[0] += 1
    observe(h, (), 1.5)
    ours.register(FamiliesCollector([c, h]))
    client_metrics.disable_created_metrics()
    try:
        assert "_created" not in text(ours)
        assert text(ours) == text(theirs)
    finally:
        client_metrics.enable_created_metrics()
    assert text(ours) == text(theirs) and "c_created" in text(ours) and "h_created" in text(ours)


def test_families_claim_their_names_in_the_registry():
    registry = CollectorRegistry()
    registry.register(FamiliesCollector([CounterFamily("c_total", "a counter"), HistogramFamily("h", "h", (), (1,))]))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("c_total", "the same name again", registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("h", "the same name again", registry=registry)
    with pytest.raises(ValueError):
        HistogramFamily("h", "unsorted", (), (2, 1))


def test_a_cell_holds_doubles_by_index_as_the_list_it_stands_in_for():
    """The C counting's Cell: zeros, then read and written by index (negative ones too) like a list; what a list
    would not take it does not either, and it holds no object for the garbage collector to walk."""
    import gc

    from tests.support.native import native_module

    counting, missing = native_module("kinspect.observers._counting")
    if counting is None:
        pytest.fail(missing)
    cell = counting.Cell(4)
    assert list(cell) == [0.0] * 4 and len(cell) == 4 and not gc.is_tracked(cell)
    cell[0] += 1
    cell[-1] = 1.5e9
    cell[2] += 2**40
    assert list(cell) == [1.0, 0.0, 2.0**40, 1.5e9] and cell[-4] == 1.0 and repr(cell).startswith("Cell([1.0,")
    for bad in (lambda: cell[4], lambda: cell[-5]):
        with pytest.raises(IndexError):
            bad()
    with pytest.raises(IndexError):
        cell[4] = 1
    with pytest.raises(TypeError):
        cell[0] = "1"
    with pytest.raises(TypeError):
        del cell[0]
    with pytest.raises(ValueError):
        counting.Cell(-1)
    assert list(cell) == [1.0, 0.0, 2.0**40, 1.5e9]  # nothing changed by what failed
