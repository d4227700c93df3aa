"""The Grafana dashboard the chart ships (pure): the provider's own metrics, per member and per
GPU model, for platform teams who live in Grafana rather than on the provider's page.

Generated, not hand-edited: `python -m federation.view.grafana` writes
charts/vkprovider/dashboards/vkprovider.json, and a test fails when that file differs from what
this module makes, when a query names a metric the provider does not export, or when Grafana's
own dashboard schema refuses it (e2e/tools/grafana). The figures are docs/concepts/pooling.md's: lent = used +
free, and online load, as the gauges export them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

UID = "vkprovider-tide"
#: The window of rates and increases: Grafana's, at least four scrapes.
WINDOW = "[$__rate_interval]"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Per-member figures (federation.view.tide.FleetMetrics), in the order drawn, with their colour.
FIGURES = (("lent", "green"), ("used", "blue"), ("free", "yellow"), ("online", "red"))
#: The resources a member's figures come in, with Grafana's unit for each.
RESOURCES = (("cpu", "CPU", "none"), ("memory", "Memory", "bytes"), ("nvidia.com/gpu", "GPUs", "none"))


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def _timeseries(
    panel_id: int, title: str, grid: tuple[int, int, int, int], targets: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    x, y, w, h = grid
    unit = extra.pop("unit", "none")
    colours = extra.pop("colours", {})
    return {
        "type": "timeseries",
        "id": panel_id,
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "min": 0},
            "overrides": [
                {
                    "matcher": {"id": "byName", "options": name},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}],
                }
                for name, colour in colours.items()
            ],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        **extra,
    }


def _stat(panel_id: int, title: str, x: int, expr: str, description: str) -> dict[str, Any]:
    return {
        "type": "stat",
        "id": panel_id,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": 1, "w": 6, "h": 4},
        "targets": [_target(expr, title, "A")],
        "options": {
            "graphMode": "area",
            "colorMode": "value",
            "justifyMode": "auto",
            "textMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
            "reduceOptions": {"calcs": ["lastNotNull"], "values": False},
            "percentChangeColorMode": "standard",
            "orientation": "auto",
        },
    }


def _row(panel_id: int, title: str, y: int) -> dict[str, Any]:
    return {
        "type": "row",
        "id": panel_id,
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard, as Grafana stores it (schemaVersion 39, Grafana 10.3 and later)."""
    panels: list[dict[str, Any]] = [_row(1, "Now", 0)]
    panels += [
        _stat(2, "Members reachable", 0, "sum(vkprovider_member_reachable)", "Members whose apiserver answers."),
        _stat(
            3,
            "Gangs without room",
            6,
            'sum(vkprovider_jobs{state="NoMemberFits"})',
            "Gangs whole at the front end that no member can take now (reason NoMemberFits).",
        ),
        _stat(
            4,
            "Gangs timed out",
            12,
            'sum(vkprovider_jobs{state="GangTimeout"})',
            "Gangs no member bound within their timeout.",
        ),
        _stat(
            5,
            "Pods reclaimed, last hour",
            18,
            "sum(increase(vkprovider_reclaimed_pods_total[1h]))",
            "Our pods members took back in the last hour, whatever the cause.",
        ),
    ]
    # Per member: one row of its figures, repeated for each member chosen.
    panels.append(_row(10, "Member $member", 5) | {"repeat": "member"})
    for index, (resource, name, unit) in enumerate(RESOURCES):
        targets = [
            _target(f'max(vkprovider_member_{figure}{{member="$member",resource="{resource}"}})', figure, ref)
            for (figure, _), ref in zip(FIGURES, "ABCD", strict=True)
        ]
        panels.append(
            _timeseries(
                11 + index,
                f"{name} of $member: lent, used, free, online",
                (index * 8, 6, 8, 8),
                targets,
                unit=unit,
                colours=dict(FIGURES),
            )
        )
    # Per GPU model: what members lent of it and what our pods used, GPUs on average.
    panels.append(_row(20, "GPU model $model", 14) | {"repeat": "model"})
    for index, kind in enumerate(("lent", "used")):
        panels.append(
            _timeseries(
                21 + index,
                f"$model GPUs {kind}, by member",
                (index * 12, 15, 12, 8),
                [
                    _target(
                        f'sum by (member) (rate(vkprovider_{kind}_gpu_seconds_total{{model="$model"}}{WINDOW}))',
                        "{{member}}",
                        "A",
                    )
                ],
            )
        )
    panels.append(_row(30, "Reclaims and gangs", 23))
    panels += [
        _timeseries(
            31,
            "Pods reclaimed, by member and cause",
            (0, 24, 8, 8),
            [
                _target(
                    f"sum by (member, cause) (increase(vkprovider_reclaimed_pods_total{WINDOW}))",
                    "{{member}} {{cause}}",
                    "A",
                )
            ],
        ),
        _timeseries(
            32,
            "Gang wait at the front end (p50, p90)",
            (8, 24, 8, 8),
            [
                _target(
                    f"histogram_quantile({q}, sum by (le) (rate(vkprovider_gang_wait_seconds_bucket{WINDOW})))",
                    f"p{int(q * 100)}",
                    ref,
                )
                for q, ref in ((0.5, "A"), (0.9, "B"))
            ],
            unit="s",
        ),
        _timeseries(
            33, "Jobs by state", (16, 24, 8, 8), [_target("sum by (state) (vkprovider_jobs)", "{{state}}", "A")]
        ),
    ]
    return {
        "uid": UID,
        "title": "vkprovider: the tide",
        "description": "What members lend (lent = used + free), what our pods use, online load, reclaims and gangs.",
        "tags": ["vkprovider"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": 39,
        "templating": {
            "list": [
                {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus"},
                _variable("member", "Member", "label_values(vkprovider_member_reachable, member)"),
                _variable("model", "GPU model", "label_values(vkprovider_lent_gpu_seconds_total, model)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression in the dashboard: its panels' and its variables'."""
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
