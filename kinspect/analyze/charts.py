"""The report's charts, drawn with plotly: each a <div> and its script; plotly.js is inlined once by the report."""

from __future__ import annotations

import functools

import plotly.io as pio
from plotly.offline import get_plotlyjs

# the mode bar (zoom, pan, log/linear reset, PNG) shows when the pointer is over a chart
CONFIG = {"displaylogo": False, "displayModeBar": "hover", "toImageButtonOptions": {"format": "png"}}
WIDTH = 540  # a fixed width: two charts side by side in the page's 1100 px
COLORS = ("#3b6ea8", "#e07b39", "#5a9e4b", "#b0413e", "#7d5ba6", "#8c8c8c")


def plotly_js() -> str:
    """plotly.js itself, to inline in one <script> of the page (nothing fetched when it is opened)."""
    return get_plotlyjs()


def human(value: float) -> str:
    """1234567 -> '1.2M'; small values as they are."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:g}" if isinstance(value, float) else str(value)


@functools.cache
def _template() -> dict:
    """plotly's "plotly_white" template as plain JSON, built once per process (about 50 ms)."""
    return pio.templates["plotly_white"].to_plotly_json()


def _html(data: list[dict], layout: dict, title: str, height: int, width: int | None = None) -> str:
    """A chart's <div> and script. The figure is plain JSON handed to plotly.io unvalidated:
    building and validating plotly's Figure objects (a deep copy of the template each) took
    0.6 to 0.8 s for a report's 34 charts, nearly all of the report's time; this takes 10 ms."""
    many = len(data) > 1
    layout = {**layout, "title": {"text": title, "font": {"size": 14}}, "height": height, "width": width or WIDTH,
              "margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "template": _template(), "showlegend": many,
              **({"legend": {"orientation": "h", "y": -0.2}} if many else {})}
    chart = pio.to_html({"data": data, "layout": layout}, full_html=False, include_plotlyjs=False, config=CONFIG,
                        validate=False)
    return f'<div class="chart">{chart}</div>'


def hbars(items: list[tuple[str, float]], title: str, unit: str = "bytes") -> str:
    """Horizontal bars, one per (label, value), largest on top (items come largest first)."""
    if not items:
        return ""
    labels = [label for label, _ in items][::-1]
    values = [value for _, value in items][::-1]
    bars = {"type": "bar", "x": values, "y": labels, "orientation": "h", "marker": {"color": COLORS[0]},
            "hovertemplate": f"%{{y}}: %{{x:,}} {unit}<extra></extra>"}
    return _html([bars], {"xaxis": {"title": {"text": unit}}}, title, height=max(220, 60 + 22 * len(items)))


def grouped_bars(categories: list[str], series: list[tuple[str, list[float]]], title: str, *,
                 log: bool = False, unit: str = "", height: int = 320, width: int | None = None,
                 x_title: str = "") -> str:
    """Bars per category, one colour per series; `log` gives the value axis a log scale."""
    if not categories:
        return ""
    bars = [{"type": "bar", "name": name, "x": categories, "y": values, "marker": {"color": COLORS[i % len(COLORS)]},
             "hovertemplate": f"%{{x}} {name}: %{{y:,}} {unit}<extra></extra>"}
            for i, (name, values) in enumerate(series)]
    layout = {"barmode": "group", "xaxis": {"type": "category", "title": {"text": x_title}},
              "yaxis": {"type": "log" if log else "linear", "title": {"text": unit}}}
    return _html(bars, layout, title, height=height, width=width)
