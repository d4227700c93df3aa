"""The front end's pods on native nodes, per namespace, for counting a job's floor
(federation.dispatch.hybrid holds the rules; this module the list behind them).

One list per namespace and second at most, however many jobs dispatch there: the apiserver
filters out pods bound to our nodes, unbound ones and ended ones. A caller about to decide what
leaves as a gang asks for a fresh list (pods the front end's gang scheduler binds together may
be in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cachetools import TTLCache

from federation.dispatch import hybrid
from federation.jobs import JobRef
from vkprovider.kube import KubeClient

TTL = 1.0  # seconds a namespace's list serves counts


class NativePods:
    def __init__(self, front: Callable[[], KubeClient | None], virtual_nodes: Callable[[], list[str]]) -> None:
        self._front = front
        self._virtual_nodes = virtual_nodes
        self._lists: TTLCache[str, list[dict[str, Any]]] = TTLCache(maxsize=1000, ttl=TTL)

    async def count(self, job: JobRef, *, fresh: bool = False) -> int:
        """The job's live pods bound to native nodes; raises ApiError when it cannot tell."""
        return len(await self.pods(job, fresh=fresh))

    async def pods(self, job: JobRef, *, fresh: bool = False) -> list[dict[str, Any]]:
        """The job's live pods bound to native nodes (reclaim tells them of notices, and ends
        them with a split gang); raises ApiError when it cannot tell."""
        front = self._front()
        if front is None:
            return []
        virtual = set(self._virtual_nodes())
        items = None if fresh else self._lists.get(job.namespace)
        if items is None:
            fields = [f"spec.nodeName!={n}" for n in sorted(virtual)]
            fields += ["spec.nodeName!=", "status.phase!=Succeeded", "status.phase!=Failed"]
            listed = await front.list(
                f"/api/v1/namespaces/{job.namespace}/pods", params={"fieldSelector": ",".join(fields)}
            )
            items = listed["items"]
            self._lists[job.namespace] = items
        keys = hybrid.native_pods(items, job, virtual)
        return [p for p in items if f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}" in keys]
