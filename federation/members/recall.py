"""What the front-end pods remember of their members, read back after a restart.

A provider restarted in the middle of something finds its members' pods unknown until each
member answers a list, which a member in an outage never does. The front-end pods carry what
is needed meanwhile, written by the process before: where each runs (`vkprovider.io/member`),
and since when its member stopped answering (the `vkprovider.io/MemberReachable` condition's
`lastTransitionTime`). From them, read from the runtime's pod cache:

- `outages`: once the cache is listed, the fleet's outage clocks count from the recorded
  moments (federation.members.outages);
- `in_outage`: a pod whose member is in an outage and was not listed since the start reports its
  last status with the outage's condition, or ends lost;
- `kept_pin`: such a pod keeps its member annotation (nothing else knows where it runs);
- `gone_unseen`: a pod whose member answered and no longer has its member pod was taken away
  while no provider watched (federation.members.disruption).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import cast

from federation import labels
from federation.members import disruption, outages
from federation.members.fleet import Fleet
from federation.members.member import Member
from vkprovider import logs, podstatus
from vkprovider.objects import Pod, PodStatus
from vkprovider.podstore import PodStore


def _member_of(front: Pod) -> str | None:
    return (front["metadata"].get("annotations") or {}).get(labels.MEMBER)


class FrontRecall:
    def __init__(self, fleet: Fleet, *, instance: str) -> None:
        self._fleet = fleet
        self._cache: PodStore[Pod] | None = None
        self._listed: asyncio.Event | None = None
        self._given = asyncio.Event()  # the runtime handed over its cache
        self._log = logs.get("federation", node=instance)

    def attach(self, cache: PodStore[Pod], listed: asyncio.Event) -> None:
        """The runtime's cache of our front-end pods, and the event set once it is listed."""
        self._cache, self._listed = cache, listed
        self._given.set()

    def front(self, key: str) -> Pod | None:
        """The front-end pod as the runtime's cache holds it, unless it has ended."""
        return self._front(key)

    def _front(self, key: str) -> Pod | None:
        front = self._cache.get(key) if self._cache is not None else None
        return None if front is None or podstatus.is_terminal(front) else front

    def pinned_to(self, member: str) -> dict[str, Pod]:
        """Front-end pods pinned to a member that have not ended."""
        scanned = self._cache.scan() if self._cache is not None else iter(())
        return {k: f for k, f in scanned if _member_of(f) == member and not podstatus.is_terminal(f)}

    async def outages(self) -> None:
        """Once the cache is listed: when each member stopped answering, as recorded."""
        await self._given.wait()
        assert self._cache is not None and self._listed is not None
        await self._listed.wait()
        recorded: dict[str, float] = {}
        for _, front in self._cache.scan():
            member = _member_of(front)
            since = outages.recorded_since((front.get("status") or {}).get("conditions"))
            if member and since is not None and not podstatus.is_terminal(front):
                recorded[member] = min(since, recorded.get(member, since))
        self._fleet.recorded_outages.update(recorded)
        if recorded:
            self._log.info("member outages recalled", since={m: outages.rfc3339(t) for m, t in recorded.items()})
        self._fleet.changed()

    def _unlisted_in_outage(self, front: Pod) -> Member | None:
        member = self._fleet.members.get(_member_of(front) or "")
        if member is None or member.outage is None or (member.pods is not None and member.pods.synced.is_set()):
            return None
        return member

    def in_outage(self, key: str) -> Pod | None:
        """The pod as reported while its member, not listed since the start, is out."""
        front = self._front(key)
        member = self._unlisted_in_outage(front) if front is not None else None
        if front is None or member is None or member.outage is None:
            return None
        outage = member.outage
        if outage.state == "lost":
            status = disruption.disrupted_status(front, outages.lost(member.name, "unknown node", outage))
        else:
            status = cast(PodStatus, dict(front.get("status") or {}))
            others = [c for c in status.get("conditions") or [] if c.get("type") != outages.CONDITION]
            status["conditions"] = [*others, outages.unreachable_condition(member.name, outage)]
        return {"metadata": front["metadata"], "spec": front["spec"], "status": status}

    def kept_pin(self, key: str) -> str | None:
        """The member a pod is pinned to, when only the pod knows (its member not listed)."""
        front = self._front(key)
        pinned = _member_of(front) if front is not None else None
        return pinned if pinned and pinned in self._fleet.unlisted() else None

    def gone_unseen(self, key: str, *, serving: Mapping[str, Member]) -> tuple[str, Pod, disruption.Disruption] | None:
        """(member, front-end pod, why) for a running pod whose member pod went away while no
        provider watched; None when that is not what happened."""
        front = self._front(key)
        if front is None or not podstatus.is_accepted(front):
            return None
        member = _member_of(front)
        if not member or member not in serving:
            return None
        return member, front, disruption.gone_unseen(dict(front), member=member)
