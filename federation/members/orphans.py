"""Member pods that outlive their front-end pods (orphans).

A member pod of ours whose front-end pod is gone, replaced (a new pod of the name, another
UID) or ended while the member pod still runs, is deleted gracefully by `OrphanReconciler`: at
start-up, whenever a member's pods are listed afresh (it answered again), and every
`orphan_interval`. A member pod that ended and whose front-end pod ended too is kept: it holds no
resources, and its logs stay readable until the front-end pod is deleted. Only pods the member
watch selects (our managed, instance and front-end labels) are ever looked at, and each candidate is
confirmed with a read of its front-end pod before it is deleted. Which front-end pods live is read
from the runtime's pod cache, not listed: a list of 10,000 pods every `orphan_interval` was the
apiserver's and our biggest periodic cost, and a cache that lags the API can only make a pod a
candidate (the read clears it) or keep an orphan for one more round.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from federation import labels
from federation.members.outages import TERMINAL
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound
from vkprovider.objects import Pod
from vkprovider.podstore import PodStore

MIN_AGE = 10.0  # seconds a member pod lives before it can be an orphan (defence in depth)


def _origin_uid(member_pod: Mapping[str, Any]) -> str:
    return str((member_pod["metadata"].get("labels") or {}).get(labels.ORIGIN_UID, ""))


def _age(member_pod: Mapping[str, Any], now: float) -> float:
    created = member_pod["metadata"].get("creationTimestamp")
    if not created:
        return 0.0
    return now - datetime.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()


def is_candidate(
    member_pod: Mapping[str, Any], live: Mapping[str, str], *, now: float, min_age: float = MIN_AGE
) -> bool:
    """The member pod's front-end pod is not among the live ones (key -> UID of front-end pods
    not ended): to be confirmed with `verdict`."""
    meta = member_pod["metadata"]
    if meta.get("deletionTimestamp") or _age(member_pod, now) < min_age:
        return False
    annotations = meta.get("annotations") or {}
    key = f"{annotations.get(labels.ORIGIN_NAMESPACE, '')}/{annotations.get(labels.ORIGIN_NAME, '')}"
    return live.get(key) != _origin_uid(member_pod)


def verdict(member_pod: Mapping[str, Any], front: Mapping[str, Any] | None) -> str | None:
    """Why the member pod must go, given its front-end pod as read now (None: gone), or None."""
    if front is None:
        return "gone"
    if front["metadata"].get("uid") != _origin_uid(member_pod):
        return "replaced"
    if front["metadata"].get("deletionTimestamp"):
        return None  # being deleted: the runtime's deletion path owns it
    ended = (front.get("status") or {}).get("phase") in TERMINAL
    running = (member_pod.get("status") or {}).get("phase") not in TERMINAL
    return "ended" if ended and running else None


class OrphanReconciler:
    """Deletes our member pods whose front-end pods are gone or ended (see the module doc)."""

    def __init__(
        self,
        *,
        members: Callable[[], dict[str, Any]],
        node_of: Callable[[str], str],
        interval: float,
        limit: int = 200,
    ) -> None:
        self._members = members  # name -> provider Member (with .pods: MemberPods)
        self._node_of = node_of  # member -> the virtual node its events go to
        self.interval = interval
        self.limit = limit
        self.front: KubeClient | None = None
        self._cache: PodStore[Pod] | None = None  # the runtime's front-end pods on our nodes
        self._listed: asyncio.Event | None = None  # set once that cache is complete
        self._following = asyncio.Event()
        self.events: EventRecorder | None = None
        self.deleted: PromCounter | None = None  # (member, why), once registered
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._log = logs.get("orphans")

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.deleted = PromCounter(
            "vkprovider_orphans_deleted",
            "Member pods of ours deleted because their front-end pod is gone, replaced or ended.",
            ["member", "why"],
            registry=registry,
        )

    def follow(self, cache: PodStore[Pod], listed: asyncio.Event) -> None:
        """Read the live front-end pods from the runtime's cache, complete once `listed` is set."""
        self._cache, self._listed = cache, listed
        self._following.set()

    def request(self, member: str) -> None:
        """Look at this member soon (its pods were just listed afresh)."""
        self._due.add(member)
        self._wake.set()

    async def run(self) -> None:
        last_all = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, last_all + self.interval - time.monotonic()))
            self._wake.clear()
            if time.monotonic() - last_all >= self.interval:
                self._due |= set(self._members())
                last_all = time.monotonic()
            due, self._due = self._due, set()
            if not due:
                continue
            live = await self._live()
            for name in sorted(due):
                try:
                    if await self.sweep(name, live) >= self.limit:
                        self._due.add(name)  # more left: next round, after the others
                except ApiError as exc:
                    self._log.warning("orphan check failed", cluster=name, error=str(exc))
                    self._due.add(name)
            if self._due:
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _live(self) -> dict[str, str]:
        """Front-end pods on our nodes that have not ended: ns/name -> UID, once the cache of
        them is complete."""
        await self._following.wait()
        assert self._cache is not None and self._listed is not None
        await self._listed.wait()
        return {key: entry.uid for key, entry in self._cache.entries() if entry.phase not in TERMINAL}

    async def sweep(self, name: str, live: Mapping[str, str]) -> int:
        """Delete this member's orphans (at most `limit`); how many were deleted."""
        assert self.front is not None
        member = self._members().get(name)
        pods = getattr(member, "pods", None)
        if pods is None or pods.client is None or not pods.synced.is_set() or pods.failing:
            return 0
        now = time.time()
        found = [p async for _, p in pods.by_origin.walk() if is_candidate(p, live, now=now)]
        why: Tally[str] = Tally()
        for member_pod in found[: self.limit]:
            annotations = member_pod["metadata"].get("annotations") or {}
            namespace, front_name = annotations.get(labels.ORIGIN_NAMESPACE), annotations.get(labels.ORIGIN_NAME)
            try:
                front: dict[str, Any] | None = await self.front.get(f"/api/v1/namespaces/{namespace}/pods/{front_name}")
            except NotFound:
                front = None
            reason = verdict(member_pod, front)
            if reason is None:
                continue
            meta = member_pod["metadata"]
            pods.expect_deletion(meta.get("uid", ""))
            with contextlib.suppress(NotFound, Conflict):
                await pods.client.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    body={"preconditions": {"uid": meta.get("uid")}},
                )
            self._log.info("deleted an orphaned member pod", cluster=name, pod=f"{namespace}/{front_name}", why=reason)
            why[reason] += 1
            if self.deleted is not None:
                self.deleted.labels(name, reason).inc()
        count = sum(why.values())
        if count and self.events is not None:
            node = self._node_of(name)
            detail = ", ".join(f"{n} {r}" for r, n in sorted(why.items()))
            message = f"deleted {count} pod(s) in member {name} whose front-end pods are gone or ended ({detail})"
            target = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": node}}
            await self.events.emit(target, reason="MemberOrphansDeleted", message=message)
        return count
