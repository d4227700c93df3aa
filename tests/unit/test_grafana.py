"""The chart's Grafana dashboard (federation/view/grafana.py): the file in the chart is what the
module makes, and every query names metrics the provider exports. Grafana's own schema checks
it in tests/e2e/test_chart.py (a Go command built like the lab's tools)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from prometheus_client import generate_latest

from e2e import metrics
from federation.config import FederationConfig
from federation.provider import FederationProvider
from federation.view import grafana
from vkprovider.metrics import Metrics

CHART_FILE = Path(__file__).resolve().parents[2] / "charts" / "vkprovider" / "dashboards" / "vkprovider.json"


def _exported() -> set[str]:
    built = Metrics()
    built.track_api_calls(dict)
    FederationProvider(FederationConfig(), node_name="grafana").register_metrics(built.registry)

    async def inside_a_loop() -> str:  # the task gauge counts the running loop's tasks
        return generate_latest(built.registry).decode()

    return metrics.parse(asyncio.run(inside_a_loop())).names()


def test_the_charts_dashboard_is_the_generated_one() -> None:
    assert CHART_FILE.read_text() == grafana.render(), "run: python -m federation.view.grafana > " + str(CHART_FILE)


def test_every_query_names_only_metrics_the_provider_exports() -> None:
    exported = _exported()
    board = grafana.dashboard()
    named = {n for expr in grafana.queries(board) for n in re.findall(r"\bvkprovider_[a-z_]+", expr)}
    assert len(named) >= 8, named
    unknown = {n for n in named if n not in exported and n.removesuffix("_bucket") not in exported}
    assert unknown == set()


def test_panels_per_member_and_per_gpu_model_with_every_figure() -> None:
    board = json.loads(grafana.render())
    panels = board["panels"]
    rows = {p["title"]: p for p in panels if p["type"] == "row"}
    assert rows["Member $member"]["repeat"] == "member" and rows["GPU model $model"]["repeat"] == "model"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["member"]["query"] == "label_values(vkprovider_member_reachable, member)"
    member_panels = [p for p in panels if "$member" in p.get("title", "") and p["type"] == "timeseries"]
    assert len(member_panels) == 3  # CPU, memory, GPUs
    for panel in member_panels:
        legends = [t["legendFormat"] for t in panel["targets"]]
        assert legends == ["lent", "used", "free", "online"], panel["title"]
    model_panels = [p for p in panels if "$model" in p.get("title", "") and p["type"] == "timeseries"]
    assert [all('model="$model"' in t["expr"] for t in p["targets"]) for p in model_panels] == [True, True]
    assert len({p["id"] for p in panels}) == len(panels)  # ids unique
