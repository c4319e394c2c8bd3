"""Counters and histograms held in plain lists on the event loop thread, rendered by a collector at scrape time.

prometheus_client's Counter and Histogram take a lock on every `inc`/`observe`; the
metrics observer pays several per frame. Here a series is a plain list (a "cell") that the
event loop thread updates in place (`cell[0] += n`), with no lock: only that thread
writes, so no update is lost. A scrape, from any thread, copies each family's dict of
cells and then each cell (`dict.copy()` and `list()` run in C without releasing the GIL:
each copy is taken at one instant) and renders them as prometheus_client Metric families
with the samples prometheus_client's own Counter and Histogram would give: the same
names, help texts, label order, buckets (`le` labels), `_count`/`_sum` and `_created`
series. Within one histogram series the buckets and `_count` always agree (the count is
their total); `_sum` may miss the one observation being recorded at that instant, as
prometheus_client's own histogram, which locks its sum and buckets separately, may too.

Cells:
- counter: [value, created]
- histogram: [count of bucket 0, ..., count of bucket n-1 (+Inf last), sum, created];
  a value goes to bucket `bisect_left(bounds, value)` (the first bound >= value), as
  Histogram.observe does, and bucket counts are accumulated at scrape time.
Where the C counting is built, a cell is its Cell (kinspect/observers/_counting.c): the same
items as doubles, which the C counting adds to in place; a list is the reference.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import INF, floatToGoString

from kinspect.protocol.codec.wire_program import optional_extension


def _use_created() -> bool:
    """Whether prometheus_client exports _created series (see its disable_created_metrics)."""
    return getattr(_client_metrics, "_use_created", True)


def new_cell(size: int, created: float) -> list:
    """A cell of `size` items, 0 but the last, `created`: the C counting's Cell where built, else a list."""
    counting = optional_extension("kinspect.observers._counting")
    cell_class = getattr(counting, "Cell", None)
    if cell_class is None:
        return [0] * (size - 1) + [created]
    cell = cell_class(size)
    cell[size - 1] = created
    return cell


def _copy(series: dict) -> dict:
    for _ in range(10):
        try:
            return series.copy()
        except RuntimeError:  # not expected for a plain dict; never let a scrape fail on it
            continue
    return dict(list(series.items()))


class CounterFamily:
    """A counter family: `cell(labels)` gives the [value, created] cell of one label set."""

    __slots__ = ("name", "documentation", "labelnames", "series")
    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"a counter's name ends with _total: {name}")
        self.name = name[: -len("_total")]  # the family name, as prometheus_client's Counter keeps it
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.series: dict[tuple, list] = {}
        if not self.labelnames:
            self.cell(())  # a counter without labels exists from the start, at 0

    def cell(self, labels: tuple) -> list:
        cell = self.series.get(labels)
        if cell is None:
            cell = self.series[labels] = new_cell(2, time.time())
        return cell

    def metric(self, with_samples: bool = True) -> Metric:
        metric = Metric(self.name, self.documentation, "counter")
        if with_samples:
            total, created, names = self.name + "_total", self.name + "_created", self.labelnames
            samples, with_created = metric.samples, _use_created()
            for labels, cell in _copy(self.series).items():
                value, when = list(cell)
                label_dict = dict(zip(names, labels))
                samples.append(Sample(total, label_dict, float(value), None, None))
                if with_created:
                    samples.append(Sample(created, dict(label_dict), when, None, None))
        return metric


class HistogramFamily:
    """A histogram family: `cell(labels)` gives the bucket counts, sum and created time of one label set."""

    __slots__ = ("name", "documentation", "labelnames", "bounds", "sum_index", "series", "_le")
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: Iterable[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(bounds)
        self.sum_index = len(bounds)  # cell[sum_index] is the sum, cell[sum_index + 1] the created time
        self.series: dict[tuple, list] = {}
        self._le = tuple(floatToGoString(b) for b in bounds)

    def cell(self, labels: tuple) -> list:
        cell = self.series.get(labels)
        if cell is None:
            cell = self.series[labels] = new_cell(len(self.bounds) + 2, time.time())
        return cell

    def metric(self, with_samples: bool = True) -> Metric:
        metric = Metric(self.name, self.documentation, "histogram")
        if not with_samples:
            return metric
        name, names, n, samples = self.name, self.labelnames, self.sum_index, metric.samples
        with_created = _use_created()
        bucket, count, sum_, created = name + "_bucket", name + "_count", name + "_sum", name + "_created"
        for labels, cell in _copy(self.series).items():
            cell = list(cell)
            base = list(zip(names, labels))
            acc = 0.0
            for le, hits in zip(self._le, cell[:n]):
                acc += hits
                samples.append(Sample(bucket, dict(base + [("le", le)]), acc, None, None))
            samples.append(Sample(count, dict(base), acc, None, None))
            if self.bounds[0] >= 0:
                samples.append(Sample(sum_, dict(base), float(cell[n]), None, None))
            if with_created:
                samples.append(Sample(created, dict(base), cell[n + 1], None, None))
        return metric


class FamiliesCollector(Collector):
    """Renders families, in the order given, at each scrape; describe() names them for the registry."""

    def __init__(self, families: Iterable[CounterFamily | HistogramFamily]) -> None:
        self.families = tuple(families)

    def describe(self) -> list[Metric]:
        return [family.metric(with_samples=False) for family in self.families]

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()


__all__ = ["CounterFamily", "FamiliesCollector", "HistogramFamily", "new_cell"]
