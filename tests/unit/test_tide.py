"""The tide's statistics: lent and used core- and GPU-seconds integrate exactly what held
between observations, a member that stops reporting stops lending, and the history and the
counters show the same member numbers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from federation.capacity import quantities
from federation.capacity.summary import MemberCapacity
from federation.view.tide import Tide, TideMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def member(
    name: str, *, free_cpu: int, ours_cpu: int, gpus: dict[str, tuple[int, int]] | None = None
) -> MemberCapacity:
    """`gpus`: model -> (free, held by our pods)."""
    summary = MemberCapacity(name=name)
    summary.lendable = {quantities.CPU: free_cpu}
    summary.ours_used = {quantities.CPU: ours_cpu}
    summary.online_used = {quantities.CPU: 5000}
    for model, (free, held) in (gpus or {}).items():
        summary.gpus_by_model[model] = free
        summary.ours_gpus_by_model[model] = held
        summary.lendable[quantities.GPU] = summary.lendable.get(quantities.GPU, 0) + free
        summary.ours_used[quantities.GPU] = summary.ours_used.get(quantities.GPU, 0) + held
    return summary


def test_lent_and_used_seconds_integrate_what_held_between_observations() -> None:
    clock = Clock()
    tide = Tide.with_tiers([(10.0, 100)], clock=clock)
    tide.observe([member("m1", free_cpu=6000, ours_cpu=2000, gpus={"V100": (3, 1)})])
    clock.now += 30
    tide.observe([member("m1", free_cpu=4000, ours_cpu=4000, gpus={"V100": (0, 4)})])
    clock.now += 15
    seconds = tide.seconds()
    # cpu: 8 cores lent throughout; used 2 cores for 30 s, then 4 for 15 s.
    assert seconds["lent"][("m1", "cpu", "")] == 8 * 45
    assert seconds["used"][("m1", "cpu", "")] == 2 * 30 + 4 * 15
    assert seconds["lent"][("m1", "gpu", "V100")] == 4 * 45
    assert seconds["used"][("m1", "gpu", "V100")] == 1 * 30 + 4 * 15

    tide.observe([])  # m1 unreachable or disabled: it lends nothing from here
    clock.now += 100
    later = tide.seconds()
    assert later["lent"][("m1", "cpu", "")] == 8 * 45
    assert later["used"][("m1", "gpu", "V100")] == 1 * 30 + 4 * 15


def test_the_history_and_the_counters_show_the_member() -> None:
    clock = Clock()
    tide = Tide.with_tiers([(10.0, 100)], clock=clock)
    tide.observe([member("m1", free_cpu=6000, ours_cpu=2000, gpus={"T4": (2, 2)})])
    clock.now += 10
    tide.observe([member("m1", free_cpu=6000, ours_cpu=2000, gpus={"T4": (2, 2)})])
    view = tide.query(since_seconds=3600)
    series = {(s["member"], s["resource"], s["kind"]): s["points"] for s in view["series"]}
    assert view["step"] == 10.0
    assert series[("m1", "cpu", "lent")] == [[1000.0, 8.0], [1010.0, 8.0]]
    assert series[("m1", "cpu", "used")][-1] == [1010.0, 2.0]
    assert series[("m1", "cpu", "online")][-1] == [1010.0, 5.0]
    assert series[("m1", "gpu/T4", "lent")][-1] == [1010.0, 4.0]

    registry = CollectorRegistry()
    registry.register(TideMetrics(tide))
    text = generate_latest(registry).decode()
    assert 'vkprovider_lent_cpu_seconds_total{member="m1"} 80.0' in text
    assert 'vkprovider_used_gpu_seconds_total{member="m1",model="T4"} 20.0' in text
    assert "# HELP vkprovider_used_cpu_seconds_total Core-seconds offline pods held in a member." in text


def test_the_daily_summary_totals_what_was_lent_and_used() -> None:
    from vkprovider.status import render_summary

    clock = Clock()
    tide = Tide.with_tiers([(10.0, 8640)], clock=clock)
    for _ in range(360):  # an hour: 8 cores and 4 V100s lent, 2 cores and 3 V100s used
        tide.observe([member("member-2", free_cpu=6000, ours_cpu=2000, gpus={"V100": (1, 3)})])
        clock.now += 10
    summary = tide.query(since_seconds=86400)["summary"]
    assert summary == [
        {"member": "member-2", "resource": "cpu", "lentHours": 8.0, "usedHours": 2.0, "usedShare": 0.25},
        {"member": "member-2", "resource": "gpu/V100", "lentHours": 4.0, "usedHours": 3.0, "usedShare": 0.75},
    ]
    table = render_summary({"summary": summary}, "24h")
    assert "member-2  gpu/V100  4.0 V100 GPU-h  3.0 V100 GPU-h  75 %" in table
    assert render_summary({"summary": []}, "24h").startswith("no history")


def test_durations_read_as_people_write_them() -> None:
    from vkprovider.httpapi.server import parse_duration

    assert [parse_duration(t) for t in ("90", "90s", "15m", "24h", "14d")] == [90, 90, 900, 86400, 14 * 86400]
    for bad in ("", "h", "-1h", "tomorrow"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_series_is_thinned_to_what_a_chart_can_show_and_the_summary_keeps_every_point() -> None:
    from federation.view.tide import thin

    points = [(float(t), float(t % 4)) for t in range(10)]
    assert thin(points, None) == points and thin(points, 20) == points
    assert thin(points, 4) == [(0.0, 1.0), (3.0, 4 / 3), (6.0, 5 / 3), (9.0, 1.0)]
    clock = Clock()
    tide = Tide.with_tiers([(10.0, 8640)], clock=clock)
    for _ in range(360):
        tide.observe([member("m1", free_cpu=6000, ours_cpu=2000)])
        clock.now += 10
    view = tide.query(since_seconds=86400, max_points=36)
    assert all(len(s["points"]) <= 36 for s in view["series"])
    assert view["summary"][0]["lentHours"] == 8.0
