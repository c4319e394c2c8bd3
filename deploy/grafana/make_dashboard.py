#!/usr/bin/env python3
"""Generate the kinspect Grafana dashboard (kinspect-dashboard.json) with Grafana's typed SDK.

    python3 deploy/grafana/make_dashboard.py            # rewrites deploy/grafana/kinspect-dashboard.json
    python3 deploy/grafana/make_dashboard.py --out X    # writes X instead

Built with grafana-foundation-sdk (pinned in pyproject's `test` extra), whose builders are typed
after Grafana's own schemas. One dashboard row is one small function below, listed in ROWS; a
new row is a new function there. Panels get their ${datasource}, label filters and layout from
the helpers. The output is deterministic (tests/deploy/test_deploy.py checks the committed JSON
against a fresh run, and every query against a real Prometheus).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import heatmap as hm
from grafana_foundation_sdk.builders import stat as st
from grafana_foundation_sdk.builders import table as tb
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    FieldColor,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as c
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hmm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "kinspect-dashboard.json"

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label filters: every kinspect series is narrowed to the chosen sidecars; series with an api
# label also to the chosen APIs.
INST = 'instance=~"$instance"'
INST_API = 'instance=~"$instance", api=~"$api"'
RATE = "[$__rate_interval]"

Panel = Builder[dm.Panel]


# ------------------------------------------------------------------------------ helpers


def query(expr: str, legend: str = "", ref: str = "A", *,
          fmt: PromQueryFormat = PromQueryFormat.TIME_SERIES, instant: bool = False) -> Dataquery:
    q = (Dataquery().datasource(DS).editor_mode(QueryEditorMode.CODE).expr(expr).format(fmt)
         .legend_format(legend or "__auto").ref_id(ref))
    return q.instant() if instant else q.range()


def queries(*pairs: tuple[str, str]) -> list[Dataquery]:
    """(expr, legend) pairs as queries A, B, ..."""
    return [query(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def quantiles(metric: str, by: str, legend: str) -> list[Dataquery]:
    """p50 and p99 of a histogram, per the `by` labels."""
    return queries(*[
        (f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{INST_API}}}{RATE})))",
         f"{legend} {name}")
        for q, name in ((0.5, "p50"), (0.99, "p99"))])


def timeseries(title: str, description: str, targets: list[Dataquery], *, unit: str = "short",
               span: int = 12, height: int = 8, stack: bool = False) -> ts.Panel:
    return (ts.Panel().title(title).description(description).datasource(DS).span(span).height(height)
            .unit(unit).min(0)
            .color_scheme(FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
            .draw_style(c.GraphDrawStyle.LINE).line_width(1).fill_opacity(30 if stack else 10)
            .show_points(c.VisibilityMode.NEVER).span_nulls(False)
            .stacking(cb.StackingConfig().group("A").mode(c.StackingMode.NORMAL if stack else c.StackingMode.NONE))
            .legend(cb.VizLegendOptions().display_mode(c.LegendDisplayMode.TABLE)
                    .placement(c.LegendPlacement.RIGHT).show_legend(True).calcs(["mean", "max"]))
            .tooltip(cb.VizTooltipOptions().mode(c.TooltipDisplayMode.MULTI).sort(c.SortOrder.DESCENDING))
            .targets(targets))


def stat(title: str, description: str, targets: list[Dataquery], *, unit: str = "short",
         span: int = 6, height: int = 4) -> st.Panel:
    return (st.Panel().title(title).description(description).datasource(DS).span(span).height(height)
            .unit(unit)
            .color_scheme(FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .thresholds(ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
                        .steps([dm.Threshold(color="green", value=None)]))
            .color_mode(c.BigValueColorMode.VALUE).graph_mode(c.BigValueGraphMode.AREA)
            .justify_mode(c.BigValueJustifyMode.AUTO).orientation(c.VizOrientation.AUTO)
            .text_mode(c.BigValueTextMode.AUTO)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            .targets(targets))


def heatmap(title: str, description: str, metric: str) -> hm.Panel:
    """A size heatmap of one histogram, repeated once per selected API (a full-width line each)."""
    expr = f"sum by (le) (rate({metric}_bucket{{{INST_API}}}{RATE}))"
    return (hm.Panel().title(f"{title} ($api)").description(description).datasource(DS).span(24).height(8)
            .repeat("api").repeat_direction("h").max_per_row(2)
            .calculate(False).cell_gap(1)
            .color(hm.HeatmapColorOptions().mode(hmm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .scale(hmm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
            .y_axis(hm.YAxisConfig().axis_placement(c.AxisPlacement.LEFT).unit("bytes"))
            .rows_frame(hm.RowsHeatmapOptions().layout(c.HeatmapCellLayout.AUTO))
            .mode(c.TooltipDisplayMode.SINGLE).show_y_histogram().show_legend()
            .scale_distribution(cb.ScaleDistributionConfig().type(c.ScaleDistribution.LINEAR))
            .targets([query(expr, "{{le}}", fmt=PromQueryFormat.HEATMAP)]))


# --------------------------------------------------------------------------------- rows
# Each returns (row title, panels in reading order); the SDK lays them out on the 24-column grid.


def overview() -> tuple[str, list[Panel]]:
    return "Overview", [
        stat("Connections open", "Client connections kinspect is proxying now.",
             queries((f"sum(kinspect_connections_open{{{INST}}})", "open"))),
        stat("Requests / s", "All requests seen, every API.",
             queries((f"sum(rate(kinspect_requests_total{{{INST_API}}}{RATE}))", "requests/s")), unit="reqps"),
        stat("In-flight requests", "Requests waiting for their response, all connections.",
             queries((f"sum(kinspect_inflight_requests{{{INST}}})", "in flight"))),
        stat("Decode failures / s", "Frames kinspect forwarded but could not decode.",
             queries((f"sum(rate(kinspect_decode_failures_total{{{INST_API}}}{RATE}))", "failures/s"))),
        timeseries("Request rate by API and version",
                   "Requests per second per API and API version (kinspect_requests_total).",
                   queries((f"sum by (api, version) (rate(kinspect_requests_total{{{INST_API}}}{RATE}))",
                            "{{api}} v{{version}}")), unit="reqps"),
        timeseries("Response rate by API and version",
                   "Responses per second per API and API version (kinspect_responses_total).",
                   queries((f"sum by (api, version) (rate(kinspect_responses_total{{{INST_API}}}{RATE}))",
                            "{{api}} v{{version}}")), unit="reqps"),
        timeseries("Connections", "Open connections (gauge) and new connections per second.",
                   queries((f"sum(kinspect_connections_open{{{INST}}})", "open"),
                           (f"sum(rate(kinspect_connections_total{{{INST}}}{RATE}))", "new / s"))),
        timeseries("Bytes by direction", "Bytes per second kinspect forwarded, per direction.",
                   queries((f"sum by (direction) (rate(kinspect_bytes_total{{{INST}}}{RATE}))", "{{direction}}")),
                   unit="Bps"),
    ]


def sizes() -> tuple[str, list[Panel]]:
    return "Sizes", [
        heatmap("Request size", "Distribution of request frame sizes (kinspect_request_size_bytes).",
                "kinspect_request_size_bytes"),
        heatmap("Response size", "Distribution of response frame sizes (kinspect_response_size_bytes).",
                "kinspect_response_size_bytes"),
        timeseries("Request size p50 / p99 by API", "Quantiles from kinspect_request_size_bytes.",
                   quantiles("kinspect_request_size_bytes", "api", "{{api}}"), unit="bytes"),
        timeseries("Response size p50 / p99 by API", "Quantiles from kinspect_response_size_bytes.",
                   quantiles("kinspect_response_size_bytes", "api", "{{api}}"), unit="bytes"),
        timeseries("Header size p99 by API and direction",
                   "99th percentile of request/response header sizes (kinspect_header_size_bytes).",
                   queries((f"histogram_quantile(0.99, sum by (api, direction, le) "
                            f"(rate(kinspect_header_size_bytes_bucket{{{INST_API}}}{RATE})))",
                            "{{api}} {{direction}}")), unit="bytes", span=24),
    ]


def tagged_fields() -> tuple[str, list[Panel]]:
    by_field = "{{api}} {{path}} tag {{tag}} {{field}}"
    return "Tagged fields", [
        timeseries("Tagged-field usage by API, path, tag and field",
                   "Tagged fields seen per second (kinspect_tagged_fields_total); field \"unknown\" "
                   "is a tag the spec does not name.",
                   queries((f"sum by (api, path, tag, field) (rate(kinspect_tagged_fields_total{{{INST_API}}}{RATE}))",
                            by_field))),
        timeseries("Tagged-field bytes by API, path, tag and field",
                   "Bytes per second in tagged fields (kinspect_tagged_field_bytes_total).",
                   queries((f"sum by (api, path, tag, field) "
                            f"(rate(kinspect_tagged_field_bytes_total{{{INST_API}}}{RATE}))", by_field)),
                   unit="Bps"),
        timeseries("Tag-section bytes by API and direction",
                   "Bytes per second in tag sections, including empty ones (kinspect_tag_section_bytes_total).",
                   queries((f"sum by (api, direction) (rate(kinspect_tag_section_bytes_total{{{INST_API}}}{RATE}))",
                            "{{api}} {{direction}}")), unit="Bps", span=24),
    ]


def latency_and_errors() -> tuple[str, list[Panel]]:
    return "Latency and errors", [
        timeseries("Latency p50 / p99 by API",
                   "Time from request seen to response seen (kinspect_request_latency_seconds).",
                   quantiles("kinspect_request_latency_seconds", "api", "{{api}}"), unit="s"),
        timeseries("Response error codes by API and error",
                   "Responses per second carrying a Kafka error code (kinspect_response_errors_total).",
                   queries((f"sum by (api, error) (rate(kinspect_response_errors_total{{{INST_API}}}{RATE}))",
                            "{{api}} {{error}}"))),
    ]


def produce() -> tuple[str, list[Panel]]:
    return "Produce", [
        timeseries("Produced records by compression",
                   "Records per second in Produce requests (kinspect_produced_records_total).",
                   queries((f"sum by (compression) (rate(kinspect_produced_records_total{{{INST}}}{RATE}))",
                            "{{compression}}")), span=8),
        timeseries("Produced batches by compression",
                   "Record batches per second in Produce requests (kinspect_produced_batches_total).",
                   queries((f"sum by (compression) (rate(kinspect_produced_batches_total{{{INST}}}{RATE}))",
                            "{{compression}}")), span=8),
        timeseries("Topic bytes (opt-in)",
                   "Bytes per second per topic and direction (kinspect_topic_bytes_total); empty unless "
                   "per-topic metrics are enabled.",
                   queries((f"topk(20, sum by (topic, direction) (rate(kinspect_topic_bytes_total{{{INST}}}{RATE})))",
                            "{{topic}} {{direction}}")), unit="Bps", span=8),
    ]


def upgrade_readiness() -> tuple[str, list[Panel]]:
    """Which client software talks to the cluster, and what a target Kafka release would refuse (issue 13)."""
    software = "{{software}} {{software_version}}"
    return "Upgrade readiness", [
        timeseries("Connections by client software",
                   "New connections per second by the client software the clients name in ApiVersions "
                   "(kinspect_client_connections_total; \"unknown\" before ApiVersions v3).",
                   queries((f"sum by (software, software_version) "
                            f"(rate(kinspect_client_connections_total{{{INST}}}{RATE}))", software))),
        timeseries("Requests by client software", "Requests per second by client software "
                   "(kinspect_client_requests_total).",
                   queries((f"sum by (software, software_version) "
                            f"(rate(kinspect_client_requests_total{{{INST}}}{RATE}))", software)), unit="reqps"),
        timeseries("Requests a target release would refuse",
                   "Requests per second whose API version or record format the target Kafka release no longer "
                   "accepts (kinspect_upgrade_incompatible_requests_total).",
                   queries((f"sum by (target, api, version, software) "
                            f"(rate(kinspect_upgrade_incompatible_requests_total{{{INST_API}}}{RATE}))",
                            "{{target}}: {{software}} {{api}} v{{version}}")), unit="reqps"),
        timeseries("Share of requests a target release would refuse",
                   "Refused requests / all requests, per target release.",
                   queries((f"sum by (target) (rate(kinspect_upgrade_incompatible_requests_total{{{INST}}}{RATE}))"
                            f" / ignoring (target) group_left "
                            f"sum(rate(kinspect_client_requests_total{{{INST}}}{RATE}))", "{{target}}")),
                   unit="percentunit"),
        timeseries("UNSUPPORTED_VERSION responses by client software",
                   "Responses per second the broker answered with UNSUPPORTED_VERSION "
                   "(kinspect_unsupported_version_responses_total).",
                   queries((f"sum by (software) (rate(kinspect_unsupported_version_responses_total{{{INST}}}{RATE}))",
                            "{{software}}")), span=24),
    ]


def health() -> tuple[str, list[Panel]]:
    build_info = (
        tb.Panel().title("Build info").datasource(DS).span(24).height(6)
        .description("kinspect version, Python, event loop and codec of each sidecar (kinspect_build_info).")
        .show_header(True).cell_height(c.TableCellHeight.SM)
        .targets([query(f"kinspect_build_info{{{INST}}}", fmt=PromQueryFormat.TABLE, instant=True)])
        .with_transformation(dm.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True, "Value": True, "__name__": True}})))
    return "Health", [
        timeseries("Decode failures by API, direction and reason",
                   "Frames forwarded but not decoded (kinspect_decode_failures_total).",
                   queries((f"sum by (api, direction, reason) (rate(kinspect_decode_failures_total{{{INST_API}}}{RATE}))",
                            "{{api}} {{direction}} {{reason}}"))),
        timeseries("Problems by kind",
                   "Problems per second by kind and direction (kinspect_problems_total), and requests for api "
                   "keys no spec knows (kinspect_unknown_api_requests_total).",
                   queries((f"sum by (kind, direction) (rate(kinspect_problems_total{{{INST}}}{RATE}))",
                            "{{kind}} {{direction}}"),
                           (f"sum(rate(kinspect_unknown_api_requests_total{{{INST}}}{RATE}))", "unknown api requests"))),
        timeseries("In-flight requests",
                   "Requests awaiting a response, and the capacity the per-connection limit "
                   "(inspect.max_inflight) gives the open connections.",
                   queries((f"sum(kinspect_inflight_requests{{{INST}}})", "in flight"),
                           (f"sum(kinspect_connections_open{{{INST}}} * kinspect_inflight_limit{{{INST}}})", "capacity"))),
        timeseries("In-flight saturation",
                   "In-flight requests / (open connections x per-connection limit), per sidecar; no value while "
                   "there are no connections or no limit.",
                   queries((f"kinspect_inflight_requests{{{INST}}} / ((kinspect_connections_open{{{INST}}} > 0)"
                            f" * (kinspect_inflight_limit{{{INST}}} > 0))", "{{instance}}")), unit="percentunit"),
        build_info,
    ]


def process() -> tuple[str, list[Panel]]:
    """The sidecar process itself (prometheus_client's process, platform and GC collectors)."""
    return "Process", [
        timeseries("Resident memory", "Resident set size of each sidecar (process_resident_memory_bytes).",
                   queries((f"process_resident_memory_bytes{{{INST}}}", "{{instance}}")), unit="bytes", span=8),
        timeseries("Open file descriptors",
                   "Open file descriptors / the process's limit (process_open_fds, process_max_fds).",
                   queries((f"process_open_fds{{{INST}}} / process_max_fds{{{INST}}}", "{{instance}}")),
                   unit="percentunit", span=8),
        timeseries("CPU", "CPU seconds per second, user and system (process_cpu_seconds_total).",
                   queries((f"rate(process_cpu_seconds_total{{{INST}}}{RATE})", "{{instance}}")), span=8),
        timeseries("Garbage collections by generation",
                   "Python GC runs per second (python_gc_collections_total).",
                   queries((f"sum by (instance, generation) (rate(python_gc_collections_total{{{INST}}}{RATE}))",
                            "{{instance}} gen {{generation}}")), span=24),
    ]


ROWS: tuple[Callable[[], tuple[str, list[Panel]]], ...] = (
    overview, sizes, tagged_fields, latency_and_errors, produce, upgrade_readiness, health, process)


# ---------------------------------------------------------------------------- dashboard


def query_variable(name: str, label: str, expr: str) -> QueryVariable:
    return (QueryVariable(name).label(label).datasource(DS)
            .query({"qryType": 1, "query": expr, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))


def dashboard() -> Dashboard:
    board = (
        Dashboard("kinspect").uid("kinspect")
        .description("kinspect: Kafka protocol inspector sidecars (generated by deploy/grafana/make_dashboard.py; "
                     "edit that, not this file)")
        .tags(["kafka", "kinspect"]).editable().tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s").time("now-1h", "now").timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(query_variable("instance", "Sidecar", "label_values(kinspect_build_info, instance)"))
        .with_variable(query_variable("api", "API", 'label_values(kinspect_requests_total{instance=~"$instance"}, api)'))
    )
    next_id = 1
    for row in ROWS:
        title, panels = row()
        board.with_row(Row(title).id(next_id))
        next_id += 1
        for panel in panels:
            board.with_panel(panel.id(next_id))
            next_id += 1
    return board


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(dashboard().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    args.out.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
