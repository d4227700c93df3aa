"""Reclaims kept (pure): every pod taken back from a member, with what took it and whether its
job had a notice, so the view can answer "what did we give back, and did anyone get warned"
after the fact. The capacity history keeps sums; a reclaim is an event with a pod, a job and a
cause, which a sum loses.

A bounded log, oldest first: at most `keep` entries and none older than `span` seconds (by
default 10,000 and 14 days, about 3 MB at their worst). Lost on restart unless `dump`/`load`
are used, like the history. The provider hands each reclaim in as a mapping (the reclaim
package must not import this one): `record` takes the fields below, unknown ones ignored.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

#: Ten thousand reclaims or two weeks, whichever is less.
KEEP = 10_000
SPAN = 14 * 86_400.0


@dataclass(frozen=True, slots=True)
class Reclaim:
    at: float  # when the pod was seen gone or stopped in its member (epoch seconds)
    member: str
    node: str  # the member node it ran on ("" when it never had one)
    pod: str  # the front-end pod, namespace/name
    job: str  # the job's key ("" for a pod of no job we know)
    band: str  # its priority band's role (worker-min, worker-elastic, ps, ...)
    cause: str  # planner, Evicted, Preempted, NodeLost, ... (federation.members.disruption)
    reason: str  # the front-end pod's reason (Reclaimed, Preempted, ...)
    noticed_at: float | None  # when its checkpoint notice was given; None: no notice
    deadline: float | None  # the notice's deadline as it last stood
    acknowledged: bool  # the workload said its checkpoint was written before it went

    @property
    def notice_seconds(self) -> float | None:
        """How long the notice ran before the pod went (None: none was given)."""
        return None if self.noticed_at is None else max(0.0, self.at - self.noticed_at)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["notice_seconds"] = None if self.notice_seconds is None else round(self.notice_seconds, 3)
        return out


_TEXT = tuple(f.name for f in fields(Reclaim) if f.type == "str")


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class ReclaimLog:
    def __init__(self, *, keep: int = KEEP, span: float = SPAN) -> None:
        if keep < 1 or span <= 0:
            raise ValueError("a reclaim log keeps at least one entry for some time")
        self.keep, self.span = keep, span
        self._entries: collections.deque[Reclaim] = collections.deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, entry: Mapping[str, Any]) -> Reclaim:
        """Keep one reclaim; the oldest go once there are `keep`, or are older than `span`
        than the newest. Entries may arrive a little out of order (the members' watches): the
        log stays sorted by time."""
        reclaim = Reclaim(
            at=float(entry["at"]),
            **{name: str(entry.get(name) or "") for name in _TEXT},
            noticed_at=_seconds(entry.get("noticed_at")),
            deadline=_seconds(entry.get("deadline")),
            acknowledged=bool(entry.get("acknowledged")),
        )
        entries = self._entries
        if not entries or entries[-1].at <= reclaim.at:
            entries.append(reclaim)
        else:
            ordered = sorted([*entries, reclaim], key=lambda r: r.at)[-self.keep :]
            entries.clear()
            entries.extend(ordered)
        horizon = entries[-1].at - self.span
        while entries and entries[0].at < horizon:
            entries.popleft()
        return reclaim

    def since(self, t: float, *, member: str | None = None) -> list[Reclaim]:
        """The reclaims at or after `t`, oldest first (of one member if named)."""
        return [r for r in self._entries if r.at >= t and (member is None or r.member == member)]

    def served(self, since_seconds: float, member: str | None, *, now: float) -> dict[str, Any]:
        """What GET /reclaims answers: the reclaims of the last `since_seconds`, oldest first,
        with their summary."""
        listed = self.since(now - since_seconds, member=member)
        return {
            "since_seconds": since_seconds,
            "summary": self.summary(listed),
            "reclaims": [r.as_json() for r in listed],
        }

    def summary(self, reclaims: Iterable[Reclaim]) -> dict[str, Any]:
        """Counts for a list's header: by member, by cause, with and without notice."""
        listed = list(reclaims)
        by_member = collections.Counter(r.member for r in listed)
        by_cause = collections.Counter(r.cause for r in listed)
        return {
            "count": len(listed),
            "by_member": dict(sorted(by_member.items())),
            "by_cause": dict(sorted(by_cause.items())),
            "with_notice": sum(1 for r in listed if r.noticed_at is not None),
            "acknowledged": sum(1 for r in listed if r.acknowledged),
        }

    # -- persistence (beside the history's file) ------------------------------------------------

    def dump(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self._entries]

    def load(self, data: Iterable[Mapping[str, Any]]) -> None:
        """Take over a dump; entries that do not read as reclaims are skipped."""
        for entry in data:
            if isinstance(entry, Mapping) and isinstance(entry.get("at"), int | float):
                self.record(entry)
