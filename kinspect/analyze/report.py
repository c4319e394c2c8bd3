"""The self-contained HTML report: a headline, the job's tables and plotly charts, one file, nothing fetched."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from html import escape

from kinspect.analyze.charts import grouped_bars, hbars, human, plotly_js
from kinspect.analyze.tables import TABLES
from kinspect.analyze.upgrade import UPGRADE_TABLES

DESCRIPTIONS = {name: description for name, (_, description, _) in (TABLES | UPGRADE_TABLES).items()}

CSS = """
body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:8px 0 16px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f0f0f0}td.s{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:8px}
.chart{flex:0 0 540px}
.headline{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid #ccc;border-radius:6px;padding:8px 12px;min-width:230px;flex:1 1 230px}
.card h3{margin:0 0 6px;font-size:14px}.card .big{font-size:22px;font-weight:bold}
details{margin-bottom:12px}
"""
MAX_PLOTS = 12  # small multiples per section; the tables hold everything


def render_report(analysis) -> str:
    t = analysis.tables
    s = t["summary"][0]
    body = ["<h1>kinspect capture report</h1>", _headline(t), _summary(s, analysis.paths)]
    body += _section("api_sizes", t, _api_sizes_plot(t["api_sizes"]))
    body += _section("size_histogram", t, _size_plots(t["size_histogram"], t["api_sizes"]))
    body += _section("top_clients", t, hbars([(_client(r["client_id"]), r["bytes"])
                                               for r in t["top_clients"][:20]], "bytes per client id"))
    body += _section("top_topics", t, hbars([(r["topic"], r["bytes"]) for r in t["top_topics"][:20]],
                                             "bytes of exchanges naming the topic"))
    body += _section("tagged_fields", t, hbars(
        [(f'{r["api"]} {r["location"]} {r["path"] or "/"} #{r["tag"]} {r["name"] or "?"}', r["bytes"])
         for r in sorted(t["tagged_fields"], key=lambda r: -r["bytes"])[:20]], "tagged field bytes"))
    body += _section("kip482_savings", t, _kip482_plot(t["kip482_savings"]))
    body += _section("varint_savings", t, _varint_savings_plot(t["varint_savings"]))
    body += _section("varint_histogram", t, _varint_histogram_plots(t["varint_histogram"], t["varint_savings"]))
    body += _section("latency", t, grouped_bars(
        [r["api"] for r in t["latency"]],
        [(p, [r[f"{p}_ms"] for r in t["latency"]]) for p in ("p50", "p90", "p99")],
        "latency per api (ms, log scale)", log=True, unit="ms"))
    body += _section("error_codes", t, hbars([(f'{r["api"]} {r["name"]}', r["count"])
                                              for r in sorted(t["error_codes"], key=lambda r: -r["count"])[:20]],
                                             "error codes", unit="errors"))
    if "upgrade_clients" in t:
        body += _section("upgrade_clients", t, _upgrade_plot(t["upgrade_clients"]))
        body += _section("upgrade_versions", t, "")
    body.append("<h2>Definitions</h2><p>Percentiles are exact, by nearest rank (the value at rank ceil(p*n) of "
                "the sorted values). Size buckets are powers of two. A topic's bytes are those of every exchange "
                "naming it (an exchange naming several topics counts for each). KIP-482 savings compare "
                "non-flexible messages with the same fields at the api's first flexible version; varint savings "
                "compare integer fields fixed today with zig-zag (packed) and unsigned (upacked) varints.</p>")
    # plotly.js inlined once, before the charts' own scripts: the page works offline
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kinspect capture report</title>"
            f"<style>{CSS}</style><script>{plotly_js()}</script></head><body>{''.join(body)}</body></html>\n")


def _upgrade_plot(rows: list[dict]) -> str:
    targets = sorted({r["target"] for r in rows})
    software = sorted({(r["software"], r["software_version"] or "") for r in rows})
    labels = [f"{name} {version}".strip() for name, version in software]
    series = []
    for target in targets:
        got = {(r["software"], r["software_version"] or ""): r["rejected_requests"] for r in rows
               if r["target"] == target}
        series.append((f"rejected by {target}", [got.get(k, 0) for k in software]))
    total = {(r["software"], r["software_version"] or ""): r["requests"] for r in rows}
    series.append(("requests", [total.get(k, 0) for k in software]))
    return grouped_bars(labels, series, "requests per client software, and those each target release rejects",
                        unit="requests", log=True)


def _client(client_id: str | None) -> str:
    return "(no client id)" if client_id is None else client_id


def _pct(part: float, whole: float) -> str:
    return f"{part * 100.0 / whole:.1f}%" if whole else "n/a"


def _card(title: str, big: str, lines: list[str]) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return f'<div class="card"><h3>{escape(title)}</h3><div class="big">{escape(big)}</div><ul>{items}</ul></div>'


def _headline(t: dict) -> str:
    """Totals, the largest messages by api, the top clients, and what compact and varint encodings would save."""
    s = t["summary"][0]
    total = s["request_bytes"] + s["response_bytes"]
    cards = [_card("totals", f'{s["exchanges"]:,} exchanges', [
        f'{human(total)}B: {human(s["request_bytes"])}B requests, {human(s["response_bytes"])}B responses',
        f'{s["apis"]} apis, {s["client_ids"]} client ids',
        f'from {_utc(s["first_request_us"])[:19]} to {_utc(s["last_request_us"])[:19]} UTC'])]
    largest: dict[str, int] = {}
    for r in t["api_sizes"]:
        largest[r["api"]] = max(largest.get(r["api"], 0), r["max"])
    top_apis = sorted(largest.items(), key=lambda kv: -kv[1])[:5]
    cards.append(_card("largest messages by api", f"{human(top_apis[0][1])}B" if top_apis else "-",
                       [f"{api}: {size:,} bytes" for api, size in top_apis]))
    clients = [r for r in t["top_clients"] if r["grouped"] == 1][:5]
    cards.append(_card("top clients", _client(clients[0]["client_id"]) if clients else "-",
                       [f'{_client(r["client_id"])}: {human(r["bytes"])}B ({_pct(r["bytes"], total)}), '
                        f'{r["exchanges"]:,} exchanges' for r in clients]))
    today = sum(r["bytes_today"] for r in t["kip482_savings"])
    saved = sum(r["saved"] for r in t["kip482_savings"])
    cards.append(_card("KIP-482 compact encodings would save", f"{human(saved)}B ({_pct(saved, today)})", [
        f"{saved:,} of the {today:,} bytes of non-flexible messages",
        f"{_pct(saved, total)} of all bytes captured"]))
    fixed = sum(r["fixed_bytes"] for r in t["varint_savings"])
    packed = fixed - sum(r["packed_bytes"] for r in t["varint_savings"])
    upacked = fixed - sum(r["upacked_bytes"] for r in t["varint_savings"])
    best = fixed - sum(r["best_bytes"] for r in t["varint_savings"])
    cards.append(_card("varint encodings of integer fields would save", f"{human(best)}B ({_pct(best, fixed)})", [
        f"best per field: {best:,} of {fixed:,} fixed-width bytes",
        f"all zig-zag (packed): {packed:,} bytes ({_pct(packed, fixed)})",
        f"all unsigned (upacked): {upacked:,} bytes ({_pct(upacked, fixed)})"]))
    if t.get("upgrade_clients"):
        lines = []
        for target in sorted({r["target"] for r in t["upgrade_clients"]}):
            rows = [r for r in t["upgrade_clients"] if r["target"] == target]
            broken = [r for r in rows if r["rejected_requests"]]
            lines.append(f"{target}: {len(broken)} of {len(rows)} client software versions use what it rejects "
                         f"({sum(r['rejected_requests'] for r in broken):,} requests)")
        cards.append(_card("upgrade readiness", f"{len(lines)} target releases", lines))
    return f'<h2 id="headline">headline</h2><div class="headline">{"".join(cards)}</div>'


def _api_sizes_plot(rows: list[dict]) -> str:
    plots = []
    for direction in ("request", "response"):
        by_api: dict[str, dict] = {}
        for r in rows:
            if r["direction"] == direction:
                got = by_api.setdefault(r["api"], {"p50": 0, "p90": 0, "p99": 0, "max": 0})
                for k in got:
                    got[k] = max(got[k], r[k])
        apis = sorted(by_api)
        plots.append(grouped_bars(apis, [(k, [by_api[a][k] for a in apis]) for k in ("p50", "p90", "p99", "max")],
                                  f"{direction} sizes per api, highest version figure (bytes, log scale)",
                                  log=True, unit="bytes"))
    return "".join(plots)


def _summary(s: dict, paths: list[str]) -> str:
    items = [("captures", ", ".join(paths)), ("exchanges", f'{s["exchanges"]:,}'),
             ("with a response", f'{s["responses"]:,}'),
             ("first request", _utc(s["first_request_us"])), ("last request", _utc(s["last_request_us"])),
             ("request bytes", f'{s["request_bytes"]:,}'), ("response bytes", f'{s["response_bytes"]:,}'),
             ("apis", s["apis"]), ("client ids", s["client_ids"]),
             ("decode errors (request / response)", f'{s["request_decode_errors"]} / {s["response_decode_errors"]}'),
             ("requests not inspected (too large)", s["requests_not_inspected"]),
             ("generated", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))]
    rows = "".join(f'<tr><th class="s">{escape(k)}</th><td class="s">{escape(str(v))}</td></tr>' for k, v in items)
    return f'<h2 id="summary">summary</h2><table>{rows}</table>'


def _utc(micros: int | None) -> str:
    if micros is None:
        return ""
    return (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)).isoformat(sep=" ")


def _section(name: str, tables: dict, plots: str) -> list[str]:
    rows = tables[name]
    description = DESCRIPTIONS[name]
    return [f'<h2 id="{name}">{escape(name)}</h2><p>{escape(description)} '
            f'(tables/{name}.csv, {len(rows)} rows)</p>',
            f'<div class="plots">{plots}</div>' if plots else "",
            f"<details{' open' if len(rows) <= 40 else ''}><summary>table</summary>{_table(rows)}</details>"]


def _table(rows: list[dict]) -> str:
    if not rows:
        return "<p>(no rows)</p>"
    columns = list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_td(r[c]) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _td(value) -> str:
    text = escape(_cell(value))
    return f"<td>{text}</td>" if isinstance(value, (int, float)) else f'<td class="s">{text}</td>'


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _size_plots(histogram: list[dict], sizes: list[dict]) -> str:
    counts = defaultdict(int)
    for r in sizes:
        counts[r["api"]] += r["count"]
    plots = []
    for api in sorted(counts, key=lambda a: -counts[a])[:MAX_PLOTS]:
        rows = [r for r in histogram if r["api"] == api]
        buckets = list(range(min(r["bucket"] for r in rows), max(r["bucket"] for r in rows) + 1))
        series = []
        for direction in ("request", "response"):
            got = {r["bucket"]: r["count"] for r in rows if r["direction"] == direction}
            if got:
                series.append((direction, [got.get(b, 0) for b in buckets]))
        plots.append(grouped_bars([human(1 << b) for b in buckets], series,
                                  f"{api}: messages per size bucket", unit="messages", height=260,
                                  x_title="size from (bytes, powers of two)"))
    return "".join(plots)


def _kip482_plot(rows: list[dict]) -> str:
    totals = defaultdict(lambda: [0, 0])
    for r in rows:
        key = f'{r["api"]} {r["direction"][:3]}'
        totals[key][0] += r["bytes_today"]
        totals[key][1] += r["bytes_compact"]
    keys = sorted(totals, key=lambda k: -totals[k][0])[:MAX_PLOTS]
    return grouped_bars(keys, [("today", [totals[k][0] for k in keys]), ("compact", [totals[k][1] for k in keys])],
                        "non-flexible bytes today vs at the first flexible version", unit="bytes")


def _varint_savings_plot(rows: list[dict]) -> str:
    top = sorted(rows, key=lambda r: -r["fixed_bytes"])[:MAX_PLOTS]
    names = [f'{r["api"]}.{r["path"].rsplit(".", 1)[-1]}' for r in top]
    return grouped_bars(names, [("fixed", [r["fixed_bytes"] for r in top]),
                                ("packed", [r["packed_bytes"] for r in top]),
                                ("upacked", [r["upacked_bytes"] for r in top])],
                        "integer field bytes: fixed vs packed vs upacked", unit="bytes")


def _varint_histogram_plots(histogram: list[dict], savings: list[dict]) -> str:
    plots = []
    for r in sorted(savings, key=lambda r: -r["fixed_bytes"])[:MAX_PLOTS]:
        key = (r["api"], r["location"], r["path"])
        slots = {"int16": 3, "int32": 5, "int64": 10}.get(r["type"], 10)  # most bytes a varint of the type takes
        series = []
        for encoding in ("unsigned", "zigzag"):
            got = {h["bytes"]: h["count"] for h in histogram
                   if (h["api"], h["location"], h["path"]) == key and h["encoding"] == encoding}
            series.append((encoding, [got.get(b, 0) for b in range(1, slots + 1)]))
        plots.append(grouped_bars([str(b) for b in range(1, slots + 1)], series,
                                  f'{r["api"]} {r["path"]} ({r["type"]}): values by varint bytes',
                                  unit="values", height=260, x_title="varint bytes"))
    return "".join(plots)
