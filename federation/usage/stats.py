"""`/stats/summary` (and so `/metrics/resource`) of a virtual node: the members that lend to it,
our pods in each, and their samples from the member's Metrics API, summed as a kubelet would.

What this reads of the rest of the provider is handed in (`PodIndex`, `members_of`), as the
streams have it: usage imports no other feature.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from federation import labels
from federation.members.pods import MemberPods
from federation.usage.reader import MetricsReader
from federation.usage.summary import CpuCounters, PodSample, pod_sample, summary


class PodIndex(Protocol):
    """Our pods per member (federation.dispatch.reports.StatusReports)."""

    def pods_in(self, member: str) -> MemberPods | None: ...


class UsageStats:
    def __init__(
        self,
        *,
        index: PodIndex,
        members_of: Callable[[str], list[str]],
        reader: MetricsReader,
        started: float | None = None,
    ) -> None:
        self._index = index
        self._members_of = members_of
        self.reader = reader
        self._started = time.time() if started is None else started
        self._counters: dict[str, CpuCounters] = {}  # per virtual node

    async def _member_samples(self, member: str) -> list[PodSample]:
        pods = self._index.pods_in(member)
        client = pods.client if pods is not None else None
        if pods is None or client is None:
            return []
        ours = [(key, member_pod) async for key, member_pod in pods.by_origin.walk()]
        if not ours:
            return []
        namespaces = {member_pod["metadata"]["namespace"] for _, member_pod in ours}
        metrics = await self.reader.samples(member, client, namespaces)
        out = []
        for key, member_pod in ours:
            meta = member_pod["metadata"]
            found = metrics.get((meta["namespace"], meta["name"]))
            if found is None:
                continue
            sample = pod_sample(key, member_pod, found, uid=(meta.get("labels") or {}).get(labels.ORIGIN_UID, ""))
            if sample is not None:
                out.append(sample)
        return out

    async def summary(self, node: str) -> dict[str, Any]:
        found = await asyncio.gather(*(self._member_samples(m) for m in self._members_of(node)))
        samples = [s for member in found for s in member]
        return summary(node, samples, self._counters.setdefault(node, CpuCounters()), self._started)
