#!/usr/bin/env python3
"""Generate the kinspect Grafana dashboard (kinspect-dashboard.json beside this script).

    python3 deploy/grafana/make_dashboard.py            # rewrites deploy/grafana/kinspect-dashboard.json
    python3 deploy/grafana/make_dashboard.py --out X    # writes X instead

Panels are built by the helpers below so every one uses the ${datasource} variable, the same
label filters and the same layout. The output is deterministic: running it again gives the same
bytes (tests/test_deploy.py checks the committed JSON against a fresh run). Metric names are the
kinspect metrics contract (kinspect/observers/metrics.py). Standard library only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "kinspect-dashboard.json"

DS = {"type": "prometheus", "uid": "${datasource}"}

# Label filters: every kinspect series is narrowed to the chosen sidecars; series with an api
# label also to the chosen APIs.
INST = 'instance=~"$instance"'
INST_API = 'instance=~"$instance", api=~"$api"'
RATE = "[$__rate_interval]"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to new lines."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.line_height = 0
        self.next_id = 1

    def place(self, w: int, h: int) -> dict:
        if self.x + w > 24:
            self.newline()
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.line_height = max(self.line_height, h)
        return pos

    def newline(self) -> None:
        self.y += self.line_height
        self.x = 0
        self.line_height = 0

    def panel_id(self) -> int:
        pid = self.next_id
        self.next_id += 1
        return pid


L = Layout()
PANELS: list[dict] = []


def target(expr: str, legend: str = "", ref: str = "A", *, fmt: str = "time_series",
           instant: bool = False) -> dict:
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "format": fmt,
        "instant": instant,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "refId": ref,
    }


def targets(*pairs: tuple[str, str]) -> list[dict]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def row(title: str) -> None:
    L.newline()
    PANELS.append({
        "collapsed": False,
        "gridPos": L.place(24, 1),
        "id": L.panel_id(),
        "panels": [],
        "title": title,
        "type": "row",
    })
    L.newline()


def timeseries(title: str, description: str, tgts: list[dict], *, unit: str = "short",
               w: int = 12, h: int = 8, stack: bool = False) -> None:
    PANELS.append({
        "datasource": DS,
        "description": description,
        "fieldConfig": {
            "defaults": {
                "color": {"mode": "palette-classic"},
                "custom": {
                    "drawStyle": "line",
                    "fillOpacity": 10 if not stack else 30,
                    "lineWidth": 1,
                    "showPoints": "never",
                    "spanNulls": False,
                    "stacking": {"group": "A", "mode": "normal" if stack else "none"},
                },
                "min": 0,
                "unit": unit,
            },
            "overrides": [],
        },
        "gridPos": L.place(w, h),
        "id": L.panel_id(),
        "options": {
            "legend": {"calcs": ["mean", "max"], "displayMode": "table", "placement": "right",
                       "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": tgts,
        "title": title,
        "type": "timeseries",
    })


def stat(title: str, description: str, tgts: list[dict], *, unit: str = "short", w: int = 6,
         h: int = 4) -> None:
    PANELS.append({
        "datasource": DS,
        "description": description,
        "fieldConfig": {
            "defaults": {"color": {"mode": "thresholds"}, "unit": unit,
                         "thresholds": {"mode": "absolute",
                                        "steps": [{"color": "green", "value": None}]}},
            "overrides": [],
        },
        "gridPos": L.place(w, h),
        "id": L.panel_id(),
        "options": {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        },
        "targets": tgts,
        "title": title,
        "type": "stat",
    })


def heatmap(title: str, description: str, metric: str, *, w: int = 12, h: int = 8) -> None:
    """A size heatmap of one histogram, repeated once per selected API."""
    expr = f"sum by (le) (rate({metric}_bucket{{{INST_API}}}{RATE}))"
    tgt = target(expr, "{{le}}", fmt="heatmap")
    PANELS.append({
        "datasource": DS,
        "description": description,
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}},
                        "overrides": []},
        "gridPos": L.place(w, h),
        "id": L.panel_id(),
        "maxPerRow": 2,
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential",
                      "exponent": 0.5, "steps": 64},
            "yAxis": {"axisPlacement": "left", "unit": "bytes"},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"show": True, "yHistogram": True},
            "legend": {"show": True},
        },
        "repeat": "api",
        "repeatDirection": "h",
        "targets": [tgt],
        "title": f"{title} ($api)",
        "type": "heatmap",
    })


def quantiles(metric: str, by: str, legend: str) -> list[dict]:
    """p50 and p99 of a histogram, per the `by` labels."""
    pairs = []
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        pairs.append((
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{INST_API}}}{RATE})))",
            f"{legend} {name}",
        ))
    return targets(*pairs)


def build_panels() -> None:
    row("Overview")
    stat("Connections open", "Client connections kinspect is proxying now.",
         targets((f"sum(kinspect_connections_open{{{INST}}})", "open")))
    stat("Requests / s", "All requests seen, every API.",
         targets((f"sum(rate(kinspect_requests_total{{{INST_API}}}{RATE}))", "requests/s")),
         unit="reqps")
    stat("In-flight requests", "Requests waiting for their response, all connections.",
         targets((f"sum(kinspect_inflight_requests{{{INST}}})", "in flight")))
    stat("Decode failures / s", "Frames kinspect forwarded but could not decode.",
         targets((f"sum(rate(kinspect_decode_failures_total{{{INST_API}}}{RATE}))", "failures/s")),
         unit="short")
    timeseries("Request rate by API and version",
               "Requests per second per API and API version (kinspect_requests_total).",
               targets((f"sum by (api, version) (rate(kinspect_requests_total{{{INST_API}}}{RATE}))",
                        "{{api}} v{{version}}")), unit="reqps")
    timeseries("Response rate by API and version",
               "Responses per second per API and API version (kinspect_responses_total).",
               targets((f"sum by (api, version) (rate(kinspect_responses_total{{{INST_API}}}{RATE}))",
                        "{{api}} v{{version}}")), unit="reqps")
    timeseries("Connections",
               "Open connections (gauge) and new connections per second.",
               targets((f"sum(kinspect_connections_open{{{INST}}})", "open"),
                       (f"sum(rate(kinspect_connections_total{{{INST}}}{RATE}))", "new / s")))
    timeseries("Bytes by direction", "Bytes per second kinspect forwarded, per direction.",
               targets((f"sum by (direction) (rate(kinspect_bytes_total{{{INST}}}{RATE}))",
                        "{{direction}}")), unit="Bps")

    row("Sizes")
    heatmap("Request size", "Distribution of request frame sizes (kinspect_request_size_bytes).",
            "kinspect_request_size_bytes")
    L.newline()
    heatmap("Response size", "Distribution of response frame sizes (kinspect_response_size_bytes).",
            "kinspect_response_size_bytes")
    L.newline()
    timeseries("Request size p50 / p99 by API", "Quantiles from kinspect_request_size_bytes.",
               quantiles("kinspect_request_size_bytes", "api", "{{api}}"), unit="bytes")
    timeseries("Response size p50 / p99 by API", "Quantiles from kinspect_response_size_bytes.",
               quantiles("kinspect_response_size_bytes", "api", "{{api}}"), unit="bytes")
    timeseries("Header size p99 by API and direction",
               "99th percentile of request/response header sizes (kinspect_header_size_bytes).",
               targets((f"histogram_quantile(0.99, sum by (api, direction, le) "
                        f"(rate(kinspect_header_size_bytes_bucket{{{INST_API}}}{RATE})))",
                        "{{api}} {{direction}}")), unit="bytes", w=24)

    row("Tagged fields")
    timeseries("Tagged-field usage by API, path, tag and field",
               "Tagged fields seen per second (kinspect_tagged_fields_total); field \"unknown\" "
               "is a tag the spec does not name.",
               targets((f"sum by (api, path, tag, field) "
                        f"(rate(kinspect_tagged_fields_total{{{INST_API}}}{RATE}))",
                        "{{api}} {{path}} tag {{tag}} {{field}}")), unit="short")
    timeseries("Tagged-field bytes by API, path, tag and field",
               "Bytes per second in tagged fields (kinspect_tagged_field_bytes_total).",
               targets((f"sum by (api, path, tag, field) "
                        f"(rate(kinspect_tagged_field_bytes_total{{{INST_API}}}{RATE}))",
                        "{{api}} {{path}} tag {{tag}} {{field}}")), unit="Bps")
    timeseries("Tag-section bytes by API and direction",
               "Bytes per second in tag sections, including empty ones "
               "(kinspect_tag_section_bytes_total).",
               targets((f"sum by (api, direction) "
                        f"(rate(kinspect_tag_section_bytes_total{{{INST_API}}}{RATE}))",
                        "{{api}} {{direction}}")), unit="Bps", w=24)

    row("Latency and errors")
    timeseries("Latency p50 / p99 by API",
               "Time from request seen to response seen (kinspect_request_latency_seconds).",
               quantiles("kinspect_request_latency_seconds", "api", "{{api}}"), unit="s")
    timeseries("Response error codes by API and error",
               "Responses per second carrying a Kafka error code (kinspect_response_errors_total).",
               targets((f"sum by (api, error) "
                        f"(rate(kinspect_response_errors_total{{{INST_API}}}{RATE}))",
                        "{{api}} {{error}}")), unit="short")

    row("Produce")
    timeseries("Produced records by compression",
               "Records per second in Produce requests (kinspect_produced_records_total).",
               targets((f"sum by (compression) "
                        f"(rate(kinspect_produced_records_total{{{INST}}}{RATE}))",
                        "{{compression}}")), unit="short", w=8)
    timeseries("Produced batches by compression",
               "Record batches per second in Produce requests (kinspect_produced_batches_total).",
               targets((f"sum by (compression) "
                        f"(rate(kinspect_produced_batches_total{{{INST}}}{RATE}))",
                        "{{compression}}")), unit="short", w=8)
    timeseries("Topic bytes (opt-in)",
               "Bytes per second per topic and direction (kinspect_topic_bytes_total); empty "
               "unless per-topic metrics are enabled.",
               targets((f"topk(20, sum by (topic, direction) "
                        f"(rate(kinspect_topic_bytes_total{{{INST}}}{RATE})))",
                        "{{topic}} {{direction}}")), unit="Bps", w=8)

    row("Health")
    timeseries("Decode failures by API, direction and reason",
               "Frames forwarded but not decoded (kinspect_decode_failures_total).",
               targets((f"sum by (api, direction, reason) "
                        f"(rate(kinspect_decode_failures_total{{{INST_API}}}{RATE}))",
                        "{{api}} {{direction}} {{reason}}")), unit="short")
    timeseries("Problems by kind",
               "Problems per second by kind and direction (kinspect_problems_total), and "
               "requests for api keys no spec knows (kinspect_unknown_api_requests_total).",
               targets((f"sum by (kind, direction) (rate(kinspect_problems_total{{{INST}}}{RATE}))",
                        "{{kind}} {{direction}}"),
                       (f"sum(rate(kinspect_unknown_api_requests_total{{{INST}}}{RATE}))",
                        "unknown api requests")), unit="short")
    timeseries("In-flight requests",
               "Requests awaiting a response, and the capacity the per-connection limit "
               "(inspect.max_inflight) gives the open connections.",
               targets((f"sum(kinspect_inflight_requests{{{INST}}})", "in flight"),
                       (f"sum(kinspect_connections_open{{{INST}}} * kinspect_inflight_limit{{{INST}}})",
                        "capacity")), unit="short")
    timeseries("In-flight saturation",
               "In-flight requests / (open connections x per-connection limit), per sidecar; "
               "no value while there are no connections or no limit.",
               targets((f"kinspect_inflight_requests{{{INST}}} / ((kinspect_connections_open{{{INST}}} > 0)"
                        f" * (kinspect_inflight_limit{{{INST}}} > 0))",
                        "{{instance}}")), unit="percentunit")
    PANELS.append({
        "datasource": DS,
        "description": "kinspect version, Python, event loop and codec of each sidecar "
                       "(kinspect_build_info).",
        "fieldConfig": {"defaults": {}, "overrides": []},
        "gridPos": L.place(24, 6),
        "id": L.panel_id(),
        "options": {"showHeader": True, "cellHeight": "sm"},
        "targets": [target(f"kinspect_build_info{{{INST}}}", fmt="table", instant=True)],
        "title": "Build info",
        "transformations": [{
            "id": "organize",
            "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}},
        }],
        "type": "table",
    })


def query_variable(name: str, label: str, query: str) -> dict:
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DS,
        "definition": query,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def dashboard() -> dict:
    PANELS.clear()
    L.__init__()
    build_panels()
    return {
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": "kinspect: Kafka protocol inspector sidecars (generated by "
                       "deploy/grafana/make_dashboard.py; edit that, not this file)",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": list(PANELS),
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["kafka", "kinspect"],
        "templating": {"list": [
            {
                "current": {},
                "hide": 0,
                "includeAll": False,
                "label": "Data source",
                "multi": False,
                "name": "datasource",
                "options": [],
                "query": "prometheus",
                "refresh": 1,
                "regex": "",
                "skipUrlSync": False,
                "type": "datasource",
            },
            query_variable("instance", "Sidecar", "label_values(kinspect_build_info, instance)"),
            query_variable("api", "API", 'label_values(kinspect_requests_total{instance=~"$instance"}, api)'),
        ]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "kinspect",
        "uid": "kinspect",
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    args.out.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
