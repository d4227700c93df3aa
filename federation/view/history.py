"""Capacity over time (issue 13): per member, resource and kind (lendable, used by our pods,
online load), bounded ring buffers at a few resolutions, by default the last 24 h at 10 s and
the last 14 days at 5 min. Pure: the provider records what it computed, readers query.

Each tier holds, per series, one float32 per step (the mean of the samples that fell in it,
NaN where none did), so memory is `series x slots x 4 bytes` however many nodes the members
have: 3 members x 12 series x (8,640 + 4,032) slots is 1.8 MB. A series appears when first
recorded; `max_series` bounds their number (a member with many GPU models, many members).
Lost on restart unless `dump`/`load` are used (the provider writes a small file when asked).
"""

from __future__ import annotations

import array
import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: (member, resource, kind); kind is "lent", "used" or "online" (federation.view.tide).
Key = tuple[str, str, str]
KINDS = ("lent", "used", "online")


@dataclass(frozen=True)
class Tier:
    step: float  # seconds per slot
    slots: int

    @property
    def span(self) -> float:
        return self.step * self.slots


DEFAULT_TIERS = (Tier(10.0, 8640), Tier(300.0, 4032))


@dataclass
class _Ring:
    """One series at one tier: `values[i]` is the slot whose index mod slots is i."""

    tier: Tier
    values: array.array[float] = field(init=False)
    newest: int = -1  # the absolute slot index of the newest slot
    sum: float = 0.0  # of the samples in the newest slot
    count: int = 0

    def __post_init__(self) -> None:
        self.values = array.array("f", [math.nan]) * self.tier.slots

    def add(self, t: float, value: float) -> None:
        slot = int(t // self.tier.step)
        if slot < self.newest:
            return  # late: a clock that went back, dropped
        if slot > self.newest:
            # Slots skipped since the newest had no samples.
            for gap in range(max(self.newest + 1, slot - self.tier.slots + 1), slot):
                self.values[gap % self.tier.slots] = math.nan
            self.newest, self.sum, self.count = slot, 0.0, 0
        self.sum += value
        self.count += 1
        self.values[slot % self.tier.slots] = self.sum / self.count

    def points(self, since: float) -> list[tuple[float, float]]:
        """(slot start, mean) from `since` to the newest, skipping empty slots."""
        if self.newest < 0:
            return []
        first = max(self.newest - self.tier.slots + 1, int(since // self.tier.step))
        out = []
        for slot in range(first, self.newest + 1):
            value = self.values[slot % self.tier.slots]
            if not math.isnan(value):
                out.append((slot * self.tier.step, float(value)))
        return out


class History:
    def __init__(self, tiers: Iterable[Tier] = DEFAULT_TIERS, *, max_series: int = 512) -> None:
        self.tiers = tuple(sorted(tiers, key=lambda t: t.step))
        if not self.tiers:
            raise ValueError("a history needs at least one tier")
        self.max_series = max_series
        self._series: dict[Key, list[_Ring]] = {}
        self.dropped = 0  # samples of series beyond max_series

    def record(self, t: float, values: dict[Key, float]) -> None:
        for key, value in values.items():
            rings = self._series.get(key)
            if rings is None:
                if len(self._series) >= self.max_series:
                    self.dropped += 1
                    continue
                rings = self._series[key] = [_Ring(tier) for tier in self.tiers]
            for ring in rings:
                ring.add(t, value)

    def keys(self) -> list[Key]:
        return sorted(self._series)

    def query(
        self, *, since: float, now: float, member: str | None = None, resource: str | None = None
    ) -> tuple[float, dict[Key, list[tuple[float, float]]]]:
        """(the step used, points per series) from `since`: the finest tier that reaches back
        that far, so a day comes at 10 s and two weeks at 5 min."""
        index = next((i for i, t in enumerate(self.tiers) if now - since <= t.span), len(self.tiers) - 1)
        out = {
            key: rings[index].points(since)
            for key, rings in sorted(self._series.items())
            if (member is None or key[0] == member) and (resource is None or key[1] == resource)
        }
        return self.tiers[index].step, out

    def nbytes(self) -> int:
        """The buffers' size (what grows with series and slots; per-object overhead aside)."""
        return sum(ring.values.itemsize * len(ring.values) for rings in self._series.values() for ring in rings)

    # -- persistence (optional: a small file the provider writes now and then) ------------------

    def dump(self) -> dict[str, Any]:
        return {
            "tiers": [[t.step, t.slots] for t in self.tiers],
            "series": [
                {
                    "key": list(key),
                    "rings": [
                        {
                            "newest": r.newest,
                            "sum": r.sum,
                            "count": r.count,
                            "values": base64.b64encode(r.values.tobytes()).decode(),
                        }
                        for r in rings
                    ],
                }
                for key, rings in self._series.items()
            ],
        }

    def load(self, data: dict[str, Any]) -> None:
        """Take over a dump of the same tiers; a dump of other tiers is ignored (starts empty)."""
        if [[t.step, t.slots] for t in self.tiers] != data.get("tiers"):
            return
        for entry in data.get("series", [])[: self.max_series]:
            rings = [_Ring(tier) for tier in self.tiers]
            for ring, saved in zip(rings, entry["rings"], strict=True):
                values = array.array("f")
                values.frombytes(base64.b64decode(saved["values"]))
                if len(values) != ring.tier.slots:
                    break
                ring.values, ring.newest, ring.sum, ring.count = values, saved["newest"], saved["sum"], saved["count"]
            else:
                key = entry["key"]
                self._series[(key[0], key[1], key[2])] = rings
