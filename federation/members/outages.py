"""Member outages: two clocks, and member pods that outlive their front-end pods.

A member apiserver that stops answering is not a member whose pods stopped: an apiserver
restart, a control-plane failover or a network blip leaves the pods running there. So the
provider keeps two clocks, after the node lifecycle's defaults (a node whose kubelet stops
reporting is NotReady after 40 s; its pods are evicted after their `tolerationSeconds` for
`node.kubernetes.io/unreachable`, 300 s by default, and keep running meanwhile):

- unreachable under `unreachable_grace` (30 s): its capacity is lent, our front-end pods there
  show what the member reports;
- under `pods_lost_after` (300 s): its capacity is withdrawn; the pods keep their last known
  status plus the condition `vkprovider.io/MemberReachable=False` (member, since when), and each
  job gets one Warning Event `MemberUnreachable`;
- from `pods_lost_after` on: the pods end Failed, reason `MemberLost`, with `DisruptionTarget`
  (reason `MemberUnreachable`), so a Job's podFailurePolicy can treat it as a disruption.

When the member answers again its pods are listed afresh: every change of the gap is reported
(a pod that completed shows Succeeded, one deleted there fails with the member's cause), the
condition goes, and nothing is created again.

Orphans: a member pod of ours whose front-end pod is gone, replaced (a new pod of the name, another
UID) or ended while the member pod still runs, is deleted gracefully by `OrphanReconciler`: at
start-up, whenever a member's pods are listed afresh (it answered again), and every
`orphan_interval`. A member pod that ended and whose front-end pod ended too is kept: it holds no
resources, and its logs stay readable until the front-end pod is deleted. Only pods the member
watch selects (our managed and instance labels) are ever looked at, and each candidate is
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from federation import labels
from federation.members.disruption import Disruption
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound
from vkprovider.objects import Pod, PodCondition
from vkprovider.podstore import PodStore

CONDITION = "vkprovider.io/MemberReachable"
LOST_REASON = "MemberLost"
LOST_CAUSE = "MemberUnreachable"
MIN_AGE = 10.0  # seconds a member pod lives before it can be an orphan (defence in depth)
TERMINAL = ("Succeeded", "Failed")

State = Literal["reachable", "unreachable", "lost"]


@dataclass(frozen=True)
class Outage:
    state: State
    since: float  # wall time of the member's last answer
    lost_after: float


def member_state(unreachable_for: float, *, grace: float, lost_after: float) -> State:
    if unreachable_for > lost_after:
        return "lost"
    if unreachable_for > grace:
        return "unreachable"
    return "reachable"


def follow(current: Outage | None, unreachable_for: float, *, grace: float, lost_after: float) -> Outage | None:
    """The member's outage after a look at its clock (None: reachable); `since` stays the
    moment it stopped answering."""
    state = member_state(unreachable_for, grace=grace, lost_after=lost_after)
    if state == "reachable":
        return None
    since = current.since if current is not None else time.time() - unreachable_for
    return Outage(state=state, since=since, lost_after=lost_after)


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unreachable_condition(member: str, outage: Outage) -> PodCondition:
    since = rfc3339(outage.since)
    return {
        "type": CONDITION,
        "status": "False",
        "reason": "MemberUnreachable",
        "message": f"member {member} has not answered since {since}; the pod keeps its last known status "
        f"and is declared lost after {outage.lost_after:.0f}s without an answer",
        "lastTransitionTime": since,
    }


def lost(member: str, node: str, outage: Outage) -> Disruption:
    message = (
        f"member {member}, node {node}: the member has not answered since {rfc3339(outage.since)} "
        f"(over {outage.lost_after:.0f}s); the pod is not moved to another member"
    )
    return Disruption(cause=LOST_CAUSE, pod_reason=LOST_REASON, message=message)


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
        self.deleted: Any = None  # prometheus Counter (member, why), when registered
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._log = logs.get("orphans")

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


class Announcer:
    """One Warning Event `MemberUnreachable` per job whose pods run in a member that stopped
    answering, on the job's group object or owner (else its first pod), sent from the
    provider's publish loop."""

    def __init__(
        self,
        *,
        job_of_pod: Callable[[str], str],
        job_object: Callable[[str, str], Awaitable[dict[str, Any] | None]],
        events: Callable[[], EventRecorder | None],
    ) -> None:
        self._job_of_pod = job_of_pod
        self._job_object = job_object
        self._events = events
        self._news: list[tuple[str, dict[str, str], Outage]] = []

    def add(self, member: str, pods: Mapping[str, str], outage: Outage) -> None:
        """`pods`: the member's pods of ours, front-end key -> job label, as last seen."""
        self._news.append((member, dict(pods), outage))

    async def flush(self) -> None:
        news, self._news = self._news, []
        events = self._events()
        if events is None:
            return
        for member, pods, outage in news:
            jobs: dict[str, list[str]] = {}  # the job label (a hash) -> front-end keys
            for key, label in pods.items():
                jobs.setdefault(label or key, []).append(key)
            for keys in jobs.values():
                job_key = next((j for j in map(self._job_of_pod, keys) if j), "")
                target = await self._job_object(job_key, keys[0])
                if target is None:
                    continue
                message = (
                    f"member {member} has not answered since {rfc3339(outage.since)}: "
                    f"{len(keys)} pod(s) of this job there keep their last known status; "
                    f"they are declared lost after {outage.lost_after:.0f}s without an answer"
                )
                await events.emit(target, reason="MemberUnreachable", message=message, warning=True)
