"""Hand-made inline SVG charts for the HTML report (no plotting library, nothing fetched)."""

from __future__ import annotations

from html import escape

PALETTE = ("#3b6ea8", "#e07b39", "#5a9e4b", "#b0413e", "#7d5ba6", "#8c8c8c")
FONT = 'font-family="sans-serif" font-size="11"'


def human(value: float) -> str:
    """1234567 -> '1.2M'; small values as they are."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def hbars(items: list[tuple[str, float]], title: str, width: int = 640, bar: int = 16) -> str:
    """Horizontal bars, one per (label, value), largest first as given."""
    if not items:
        return ""
    label_w, top = 220, 22
    peak = max(v for _, v in items) or 1
    plot_w = width - label_w - 70
    height = top + len(items) * (bar + 4) + 6
    parts = [_open(width, height, title), _title(title)]
    for i, (label, value) in enumerate(items):
        y = top + i * (bar + 4)
        w = max(1.0, plot_w * value / peak) if value else 0
        parts.append(f'<text x="{label_w - 6}" y="{y + bar - 4}" text-anchor="end" {FONT}>{escape(_clip(label))}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar}" fill="{PALETTE[0]}">'
                     f'<title>{escape(label)}: {value:,}</title></rect>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar - 4}" {FONT}>{human(value)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def grouped_bars(categories: list[str], series: list[tuple[str, list[float]]], title: str,
                 width: int = 640, height: int = 200, log: bool = False) -> str:
    """Vertical bars: one group per category, one bar per series, with a legend."""
    if not categories or not series:
        return ""
    left, top = 50, 34
    # Category labels are slanted (horizontal ones overlap past a handful of groups), so the
    # bottom margin grows with the longest label and the plot keeps its height.
    longest = max(len(_clip(c, 28)) for c in categories)
    bottom = 14 + int(longest * 6.2 * 0.65)
    plot_h = height - top - 36
    height = top + plot_h + bottom
    plot_w = width - left - 10
    values = [v for _, vs in series for v in vs]
    peak = max(values) if values else 0
    scale = _log_scale(peak) if log else (lambda v: v / peak if peak else 0)
    group_w = plot_w / len(categories)
    bar_w = max(1.0, (group_w - 4) / len(series))
    parts = [_open(width, height, title), _title(title)]
    for s, (name, _) in enumerate(series):
        x = left + s * 120
        parts.append(f'<rect x="{x}" y="20" width="10" height="10" fill="{PALETTE[s % len(PALETTE)]}"/>'
                     f'<text x="{x + 14}" y="29" {FONT}>{escape(name)}</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#444"/>')
    parts.append(f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {FONT}>{human(peak)}</text>')
    if log:
        parts.append(f'<text x="{left - 4}" y="{top + 20}" text-anchor="end" {FONT}>log</text>')
    for c, category in enumerate(categories):
        gx = left + c * group_w + 2
        for s, (name, vs) in enumerate(series):
            v = vs[c]
            h = plot_h * scale(v)
            parts.append(f'<rect x="{gx + s * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                         f'height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                         f'<title>{escape(category)} {escape(name)}: {v:,}</title></rect>')
        lx, ly = gx + group_w / 2, top + plot_h + 12
        parts.append(f'<text x="{lx:.1f}" y="{ly}" text-anchor="end" transform="rotate(-40 {lx:.1f} {ly})" '
                     f'{FONT}>{escape(_clip(category, 28))}<title>{escape(category)}</title></text>')
    parts.append("</svg>")
    return "".join(parts)


def _log_scale(peak: float):
    import math

    top = math.log10(peak + 1) or 1
    return lambda v: math.log10(v + 1) / top if v > 0 else 0


def _open(width: int, height: int, title: str) -> str:
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">')


def _title(title: str) -> str:
    return f'<text x="4" y="13" font-family="sans-serif" font-size="12" font-weight="bold">{escape(title)}</text>'


def _clip(label: str, n: int = 34) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"
