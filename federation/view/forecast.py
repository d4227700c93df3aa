"""The tide ahead (pure): for each member, from its own history, what it will lend over the next
hours and when that falls below what our pods hold there now.

The method, written so that an operator can check it by hand:
- seasonal: a slot's value is the mean of the same slot one, two, three and four weeks before
  (the same hour of the same weekday), of those the history holds; with no week behind it, the
  same slot one to four days before; with neither, the last value seen (persistence);
- level: the seasonal values are shifted by how far the last two hours ran above or below their
  own seasonal values (today's tide is higher or lower than usual), and that shift fades out
  linearly over six hours, after which the seasonal pattern alone speaks.
Its error is measured on the history kept, the way it would have done: from every whole hour that
has two hours behind it, forecast the next hour from what was known then, and compare with what
came. The mean absolute error is reported, in the resource's unit and relative to the mean level,
beside the same score for persistence (the last value held an hour) at the same hours.

Input is the history's coarse tier (federation.view.history: 5-minute slots over 14 days); no
numpy: at most a few thousand slots per series.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

WEEK = 7 * 86400.0
DAY = 86400.0
#: How far back the level is read, and over how long its shift fades.
LEVEL_WINDOW = 2 * 3600.0
FADE = 6 * 3600.0
#: Seasons looked back: one to four weeks (or days).
SEASONS = 4
METHOD = (
    "seasonal naive (mean of the same time 1-4 weeks before, else 1-4 days before, else the last value), "
    "shifted by the last 2 h's offset from it, fading out over 6 h; error: next-hour forecasts from every "
    "whole hour of the history kept"
)


@dataclass(frozen=True)
class Error:
    mean_absolute: float  # in the resource's unit (cores, GPUs)
    relative: float  # mean_absolute over the mean actual value
    forecasts: int  # how many next-hour forecasts were scored
    #: The same score for the last value held an hour (persistence), at the same hours: what
    #: the method is worth is how far under this it stays.
    baseline_relative: float


@dataclass(frozen=True)
class Outlook:
    points: list[tuple[float, float]]  # (slot start, predicted value), every step from now
    error: Error | None  # None: too little history to score a forecast
    below_at: float | None  # the first predicted slot under `floor` (None: none within the horizon)


class Series:
    """One history series on a regular grid: slot index -> value (empty slots absent)."""

    def __init__(self, points: list[tuple[float, float]], step: float) -> None:
        self.step = step
        self.values: dict[int, float] = {round(t / step): v for t, v in points}
        self._slots = sorted(self.values)

    def at(self, slot: int) -> float | None:
        return self.values.get(slot)

    def seasonal(self, slot: int, *, before: int) -> float | None:
        """The mean of the same slot 1-4 weeks earlier, else 1-4 days earlier, among slots
        earlier than `before` (what was known then)."""
        for period in (WEEK, DAY):
            lag = round(period / self.step)
            found = [
                v
                for k in range(1, SEASONS + 1)
                if slot - k * lag < before and (v := self.at(slot - k * lag)) is not None
            ]
            if found:
                return sum(found) / len(found)
        return None

    def last_before(self, before: int) -> float | None:
        index = bisect.bisect_left(self._slots, before)
        return self.values[self._slots[index - 1]] if index else None


def predict(series: Series, origin: int, ahead: int) -> float | None:
    """The value `ahead` slots after slot `origin`, from slots before it only."""
    target = origin + ahead
    base = series.seasonal(target, before=origin)
    if base is None:
        return series.last_before(origin)
    window = round(LEVEL_WINDOW / series.step)
    offsets = [
        v - s
        for slot in range(origin - window, origin)
        if (v := series.at(slot)) is not None and (s := series.seasonal(slot, before=origin)) is not None
    ]
    if not offsets:
        return base
    fade = max(0.0, 1.0 - ahead * series.step / FADE)
    return max(0.0, base + fade * sum(offsets) / len(offsets))


def backtest(series: Series) -> Error | None:
    """Next-hour forecasts from every whole hour with two hours of history behind it."""
    if not series.values:
        return None
    hour = round(3600.0 / series.step)
    first, last = series._slots[0], series._slots[-1]
    errors: list[float] = []
    baseline: list[float] = []
    actuals: list[float] = []
    origin = first + round(LEVEL_WINDOW / series.step)
    origin += (-origin) % hour  # whole hours
    while origin + hour <= last:
        actual = series.at(origin + hour)
        guess = predict(series, origin, hour) if actual is not None else None
        held = series.last_before(origin) if actual is not None else None
        if actual is not None and guess is not None and held is not None:
            errors.append(abs(guess - actual))
            baseline.append(abs(held - actual))
            actuals.append(actual)
        origin += hour
    if not errors:
        return None
    mean_actual = sum(actuals) / len(actuals)
    mae = sum(errors) / len(errors)

    def relative(total: float) -> float:
        return total / len(actuals) / mean_actual if mean_actual else 0.0

    return Error(
        mean_absolute=mae,
        relative=relative(sum(errors)),
        forecasts=len(errors),
        baseline_relative=relative(sum(baseline)),
    )


def outlook(series: Series, *, now: float, hours: float, floor: float) -> Outlook:
    """From the slot after `now`: the predicted values over `hours`, the error on the history
    kept, and when the prediction first falls under `floor` (what our pods hold now)."""
    origin = int(now // series.step) + 1
    points: list[tuple[float, float]] = []
    below_at = None
    for ahead in range(1, round(hours * 3600.0 / series.step) + 1):
        value = predict(series, origin, ahead)
        if value is None:
            break
        t = (origin + ahead) * series.step
        points.append((t, value))
        if below_at is None and value < floor:
            below_at = t
    return Outlook(points=points, error=backtest(series), below_at=below_at)


def forecasts(
    series: Mapping[tuple[str, str], list[tuple[float, float]]],
    used: Mapping[tuple[str, str], float],
    *,
    step: float,
    now: float,
    hours: float,
) -> dict[str, object]:
    """GET /forecast: per member and resource (cpu, gpu/<model>), the outlook of what it lends."""
    members: dict[str, dict[str, object]] = {}
    for (member, resource), points in sorted(series.items()):
        ahead = outlook(Series(points, step), now=now, hours=hours, floor=used.get((member, resource), 0.0))
        members.setdefault(member, {})[resource] = {
            "points": [[t, round(v, 3)] for t, v in ahead.points],
            "error": None
            if ahead.error is None
            else {
                "nextHourMeanAbsolute": round(ahead.error.mean_absolute, 4),
                "relative": round(ahead.error.relative, 4),
                "forecasts": ahead.error.forecasts,
                "baselineRelative": round(ahead.error.baseline_relative, 4),
            },
            "belowUsedAt": ahead.below_at,
            "used": used.get((member, resource), 0.0),
        }
    return {"now": now, "step": step, "hours": hours, "method": METHOD, "members": members}
