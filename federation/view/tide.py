"""The tide (issue 13): what each member lent and what offline work used, over time. Fed with
the member summaries each time the provider recomputes them (at least once a second), it keeps

  - the capacity history (federation.view.history): lendable, used by our pods and online load, per
    member and resource (cpu in cores, memory in bytes, GPUs per model);
  - lent and used core-seconds and GPU-seconds per member (and GPU model), integrated exactly
    for values that hold between two recomputations (a change is seen at the next one, and the
    provider recomputes on every change), read as Prometheus counters.

"Lent" is what the member made available to us: what we could still place ("free") plus what
our pods hold (the virtual node's capacity for that member); "used" is what our pods hold;
"online" what the member's own pods request. The same words mean the same figures in /capacity,
the dashboard, the gauges below and `vkprovider status` (docs/concepts/pooling.md, "What the figures mean").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from federation.capacity import quantities
from federation.capacity.summary import MemberCapacity
from federation.view import forecast
from federation.view.history import History, Key, Tier

#: The resources of the history and their unit scale (millicores to cores).
SCALE = {quantities.CPU: 1000.0, quantities.MEMORY: 1.0, quantities.GPU: 1.0}


def sample(summary: MemberCapacity) -> dict[Key, float]:
    """The history's values for one member now."""
    member = summary.name
    lent = quantities.add(summary.lendable, summary.ours_used)
    out: dict[Key, float] = {}
    for resource, scale in SCALE.items():
        name = "gpu" if resource == quantities.GPU else resource
        out[(member, name, "lent")] = lent.get(resource, 0) / scale
        out[(member, name, "used")] = summary.ours_used.get(resource, 0) / scale
        out[(member, name, "online")] = summary.online_used.get(resource, 0) / scale
    for model, free in summary.gpus_by_model.items():
        used = summary.ours_gpus_by_model.get(model, 0)
        out[(member, f"gpu/{model}", "lent")] = float(free + used)
        out[(member, f"gpu/{model}", "used")] = float(used)
    for model, used in summary.ours_gpus_by_model.items():
        out.setdefault((member, f"gpu/{model}", "lent"), float(used))
        out.setdefault((member, f"gpu/{model}", "used"), float(used))
    return out


@dataclass
class _Integral:
    """∫ value dt of a value that holds between updates."""

    total: float = 0.0
    value: float = 0.0
    since: float | None = None

    def update(self, now: float, value: float) -> None:
        self.total = self.at(now)
        self.value, self.since = value, now

    def at(self, now: float) -> float:
        return self.total + (self.value * (now - self.since) if self.since is not None else 0.0)


@dataclass
class Tide:
    history: History = field(default_factory=History)
    clock: Callable[[], float] = time.time
    #: (member, what, model) -> integral; what: "cpu" (core-seconds) or "gpu" (GPU-seconds).
    lent: dict[tuple[str, str, str], _Integral] = field(default_factory=dict)
    used: dict[tuple[str, str, str], _Integral] = field(default_factory=dict)
    #: The values of the last observation (what the forecast compares with).
    latest: dict[Key, float] = field(default_factory=dict)
    _forecast: tuple[tuple[int, float], dict[str, object]] | None = None

    @classmethod
    def with_tiers(
        cls, tiers: list[tuple[float, int]], *, max_series: int = 1024, clock: Callable[[], float] = time.time
    ) -> Tide:
        return cls(history=History([Tier(step, slots) for step, slots in tiers], max_series=max_series), clock=clock)

    def observe(self, summaries: Iterable[MemberCapacity]) -> None:
        """Record the summaries of the members that lend now; one left out (disabled, not
        synced, unreachable) lends nothing from now on."""
        now = self.clock()
        values: dict[Key, float] = {}
        seen: set[tuple[str, str, str]] = set()
        for summary in summaries:
            if not summary.reachable:
                continue
            current = sample(summary)
            values.update(current)
            for (member, resource, kind), value in current.items():
                if resource == "cpu" or resource.startswith("gpu/"):
                    what, model = ("cpu", "") if resource == "cpu" else ("gpu", resource[4:])
                    if kind in ("lent", "used"):
                        target = self.lent if kind == "lent" else self.used
                        target.setdefault((member, what, model), _Integral()).update(now, value)
                        seen.add((member, what, model))
        for integrals in (self.lent, self.used):
            for key, integral in integrals.items():
                if key not in seen and integral.value:
                    integral.update(now, 0.0)
        self.history.record(now, values)
        self.latest = values

    def seconds(self) -> dict[str, dict[tuple[str, str, str], float]]:
        """Lent and used core-/GPU-seconds so far, per (member, cpu|gpu, model)."""
        now = self.clock()
        return {
            "lent": {k: i.at(now) for k, i in self.lent.items()},
            "used": {k: i.at(now) for k, i in self.used.items()},
        }

    def query(
        self,
        *,
        since_seconds: float,
        member: str | None = None,
        resource: str | None = None,
        max_points: int | None = None,
    ) -> dict[str, Any]:
        """The history as JSON: {step, summary, series: [{member, resource, kind, points: [[t, v]...]}]},
        each series thinned to `max_points` (a chart needs no more points than pixels); the
        summary always comes from every point."""
        now = self.clock()
        step, series = self.history.query(since=now - since_seconds, now=now, member=member, resource=resource)
        return {
            "now": now,
            "step": step,
            "summary": totals(series, step),
            "series": [
                {
                    "member": m,
                    "resource": r,
                    "kind": k,
                    "points": [[t, round(v, 3)] for t, v in thin(points, max_points)],
                }
                for (m, r, k), points in series.items()
            ],
        }

    def forecast(self, *, hours: float) -> dict[str, object]:
        """What each member will lend of CPU and of each GPU model over the next `hours`, from
        its history's coarsest tier (federation.view.forecast), against what our pods hold now.
        Made once per slot of that tier and horizon: a dashboard asks every 5 s."""
        now = self.clock()
        key = (int(now // self.history.tiers[-1].step), hours)
        if self._forecast is not None and self._forecast[0] == key:
            return self._forecast[1]
        step, series = self.history.query(since=now - self.history.tiers[-1].span, now=now)
        lent = {
            (member, resource): points
            for (member, resource, kind), points in series.items()
            if kind == "lent" and (resource == "cpu" or resource.startswith("gpu/"))
        }
        used = {(m, r): self.latest.get((m, r, "used"), 0.0) for m, r in lent}
        made = forecast.forecasts(lent, used, step=step, now=now, hours=hours)
        self._forecast = (key, made)
        return made


def thin(points: list[tuple[float, float]], most: int | None) -> list[tuple[float, float]]:
    """At most `most` points: runs of consecutive points averaged, each at its first time."""
    if most is None or most <= 0 or len(points) <= most:
        return points
    size = -(-len(points) // most)  # ceiling
    out = []
    for at in range(0, len(points), size):
        run = points[at : at + size]
        out.append((run[0][0], sum(v for _, v in run) / len(run)))
    return out


def totals(series: dict[Key, list[tuple[float, float]]], step: float) -> list[dict[str, Any]]:
    """Per member and resource (cpu, GPUs per model): what was lent and used over the series'
    span, in unit-hours (core-hours, GPU-hours), from the slots' means; the daily summary."""
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for (member, resource, kind), points in series.items():
        if kind not in ("lent", "used") or not (resource == "cpu" or resource.startswith("gpu/")):
            continue
        entry = sums.setdefault((member, resource), {"lent": 0.0, "used": 0.0})
        entry[kind] += sum(v for _, v in points) * step / 3600.0
    return [
        {
            "member": member,
            "resource": resource,
            "lentHours": round(entry["lent"], 3),
            "usedHours": round(entry["used"], 3),
            "usedShare": round(entry["used"] / entry["lent"], 4) if entry["lent"] else None,
        }
        for (member, resource), entry in sorted(sums.items())
    ]


class TideMetrics(Collector):
    """The lent and used seconds as counters, computed at scrape time."""

    def __init__(self, tide: Tide) -> None:
        self._tide = tide

    def collect(self) -> Iterator[Metric]:
        seconds = self._tide.seconds()
        families = {
            ("lent", "cpu"): CounterMetricFamily(
                "vkprovider_lent_cpu_seconds", "Core-seconds a member made available to offline pods.",
                labels=["member"],
            ),
            ("used", "cpu"): CounterMetricFamily(
                "vkprovider_used_cpu_seconds", "Core-seconds offline pods held in a member.", labels=["member"]
            ),
            ("lent", "gpu"): CounterMetricFamily(
                "vkprovider_lent_gpu_seconds",
                "GPU-seconds a member made available to offline pods, by GPU model.",
                labels=["member", "model"],
            ),
            ("used", "gpu"): CounterMetricFamily(
                "vkprovider_used_gpu_seconds", "GPU-seconds offline pods held in a member, by GPU model.",
                labels=["member", "model"],
            ),
        }  # fmt: skip
        for kind, values in seconds.items():
            for (member, what, model), total in sorted(values.items()):
                labels = [member] if what == "cpu" else [member, model]
                families[(kind, what)].add_metric(labels, total)
        yield from families.values()


#: What the gauges below read from the provider: (member, reachable, its summary if any).
MemberState = tuple[str, bool, MemberCapacity | None]


class FleetMetrics(Collector):
    """Gauges of the present moment, for dashboards and the chart's alert rules: each member's
    reachability, what it lends, what our pods hold there, what is free and its online load, and
    jobs by state."""

    def __init__(self, members: Callable[[], Iterable[MemberState]], jobs: Callable[[], dict[str, int]]) -> None:
        self._members = members
        self._jobs = jobs

    def collect(self) -> Iterator[Metric]:
        reachable = GaugeMetricFamily(
            "vkprovider_member_reachable", "1 while the member's apiserver answers, else 0.", labels=["member"]
        )
        figures = {
            "lent": GaugeMetricFamily(
                "vkprovider_member_lent",
                "What the member lends now: what our pods hold plus what is free (cores, bytes, GPUs).",
                labels=["member", "resource"],
            ),
            "used": GaugeMetricFamily(
                "vkprovider_member_used", "What our pods hold in the member now (cores, bytes, GPUs).",
                labels=["member", "resource"],
            ),
            "free": GaugeMetricFamily(
                "vkprovider_member_free",
                "What the member lends and our pods do not hold: what could be placed now (cores, bytes, GPUs).",
                labels=["member", "resource"],
            ),
            "online": GaugeMetricFamily(
                "vkprovider_member_online", "What the member's own pods request now (cores, bytes, GPUs).",
                labels=["member", "resource"],
            ),
        }  # fmt: skip
        for name, up, summary in self._members():
            reachable.add_metric([name], 1.0 if up else 0.0)
            vectors = (
                {
                    "lent": summary.capacity,
                    "used": summary.ours_used,
                    "free": summary.lendable,
                    "online": summary.online_used,
                }
                if summary is not None
                else {}
            )
            for resource, scale in SCALE.items():
                for figure, family in figures.items():
                    family.add_metric([name, resource], vectors.get(figure, {}).get(resource, 0) / scale)
        jobs = GaugeMetricFamily(
            "vkprovider_jobs",
            "Jobs by state: waiting (a gang not yet whole), NoMemberFits (whole, no member can take it now), "
            "dispatched, or why they failed (GangTimeout: the gang waited past its timeout).",
            labels=["state"],
        )
        for state, count in sorted(self._jobs().items()):
            jobs.add_metric([state], count)
        yield from (reachable, *figures.values(), jobs)
