"""The gang gate: a gang leaves for a member only whole, and is bound there in time or sent back.

- Complete at the front end: a gang's minimum counts its pods bound to the virtual node and to
  the front end's native nodes (federation.dispatch.hybrid, listed by
  federation.dispatch.nativepods); the native count is taken again from the API just before
  deciding what leaves, since pods the front end's gang scheduler binds together may be in flight.
- One timer per gang job (task `dispatch/gang/<job>`): while the job waits at the front end it
  looks again every half second (pods bound, capacity freed) and dispatches once it can; once
  dispatched it waits for the member's scheduler to bind the member gang's minimum.
- The timeout counts from the start of the gang's current wait: its dispatch to its member, else
  its minimum bound at the front end (waiting for room), else its first pod bound there. Each is
  read from the clusters (federation.dispatch.jobstate): a restarted provider counts from the
  same moment as the one it replaces, and gives the runtime `SETTLE` seconds to offer the job's
  other pods before it judges a gang whose time ran out meanwhile.
- Past the gang's timeout: a gang never complete at the front end is told once (Event
  GangIncomplete; its pods are marked `TOLD`, which a restarted provider reads) and keeps
  waiting; one its member did not bind is deleted there, the job unpinned and sent whole to the
  next candidate (GangRolledBack); with none left, its pods end Failed with reason GangTimeout.
What dispatching means (placement, the member writes) is the dispatcher's; it is reached
through `Dispatching`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram

from federation import jobs, labels
from federation.dispatch.jobstate import Job, bound_at, created_at, first_time, nth_time, to_monotonic, wait_start
from federation.dispatch.nativepods import NativePods
from federation.members.pods import MemberPods
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, KubeClient
from vkprovider.objects import Pod
from vkprovider.podstatus import now_rfc3339

#: Seconds between two looks of a waiting or dispatched gang's timer.
TICK = 0.5
#: Seconds a timer started with its time already out (a restarted provider's) waits before it
#: judges: the runtime offers a job's pods one by one after a restart, and a gang judged on its
#: first would be told incomplete, or rolled back from a member that bound it.
SETTLE = 5.0
#: On each pod of a gang told GangIncomplete (the time it was told): a restarted provider tells
#: it no second time. An annotation rather than a look for the Event: it is read with the pod
#: (no request, and no permission to list Events), and it does not expire with the Event.
TOLD = labels.GANG_INCOMPLETE_TOLD
#: Pods of a gang marked at once.
CONCURRENCY = 32
GANG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


@dataclass
class GangMetrics:
    """How long gangs wait at the front end and how long members take to bind them."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        self.wait = Histogram(
            "vkprovider_gang_wait_seconds",
            "From a gang complete at the front end to its leaving for a member (waiting for capacity).",
            buckets=GANG_BUCKETS,
            registry=self.registry,
        )
        self.bind = Histogram(
            "vkprovider_gang_bind_seconds",
            "From a gang's dispatch to its minimum bound by the member's scheduler.",
            buckets=GANG_BUCKETS,
            registry=self.registry,
        )


def monotonic_of(wall: float | None) -> float | None:
    """A wall time read from a cluster, on this process's monotonic clock (never in the future)."""
    if wall is None:
        return None
    return to_monotonic(wall, wall_now=time.time(), monotonic_now=time.monotonic())


class Dispatching(Protocol):
    """What the gang gate asks of the dispatcher (federation.dispatch.dispatcher)."""

    async def dispatch(self, job: Job, *, retry: bool = False) -> None: ...

    async def unplace(self, job: Job, member: str) -> None: ...

    def notify_job(self, job: Job) -> None: ...


class Gangs:
    def __init__(
        self,
        dispatcher: Dispatching,
        *,
        native_pods: NativePods,
        pods_in: Callable[[str], MemberPods | None],
        events: Callable[[], EventRecorder | None],
        instance: str,
        front: Callable[[], KubeClient | None] = lambda: None,
    ) -> None:
        self._dispatcher = dispatcher
        self._front = front
        self._native_pods = native_pods
        self._pods_in = pods_in
        self._events = events
        #: Set with the provider's metrics.
        self.metrics: GangMetrics | None = None
        #: Told of a job whose gang timed out everywhere (a hybrid job's native part may now be
        #: a split gang below its minimum: federation.reclaim.splitgang).
        self.on_timeout: Callable[[Job], Awaitable[None]] | None = None
        self._log = logs.get("dispatch", instance=instance)

    async def _native(self, job: Job, *, fresh: bool = False) -> int:
        """The job's pods bound to native nodes of the front end; the last count when the
        front end cannot tell now."""
        try:
            return await self._native_pods.count(job.ref, fresh=fresh)
        except ApiError as exc:
            self._log.warning("native pods of a job not counted", job=job.ref.key, error=str(exc))
            return job.native

    async def count_native(self, job: Job, *, known: int) -> None:
        """`job.native` now; counted afresh from the API when, with the `known` virtual pods, it
        completes the gang's minimum (what leaves as the gang is about to be decided)."""
        job.native = await self._native(job)
        if known + job.native >= job.gang.min_member:
            job.native = await self._native(job, fresh=True)

    def arrived(self, job: Job, pod: Pod) -> None:
        """A pod of the job bound at the front end: the gang's first wait is its earliest binding
        (once told GangIncomplete, the next timer's start instead: `start`)."""
        if not job.gang.is_gang:
            return
        if TOLD in (pod["metadata"].get("annotations") or {}):
            job.incomplete_told = True  # told before a restart
        if job.incomplete_told:
            return
        since = monotonic_of(bound_at(pod))
        since = time.monotonic() if since is None else since
        if job.waiting_since is None or since < job.waiting_since:
            job.waiting_since = since

    def ready_since(self, job: Job) -> float:
        """When the gang's minimum was bound at the front end: the binding of its virtual pod
        that made up the minimum with the native ones. Native pods' bindings are not read: when
        they complete the minimum after the virtual pods this is earlier than the truth (a
        provider that sees them complete it counts from then: `_look_again`)."""
        needed = job.gang.min_member - job.native
        since = monotonic_of(nth_time((bound_at(p) for p in job.pods.values()), needed))
        return time.monotonic() if since is None else since

    def member_since(self, job: Job, member: str) -> float | None:
        """When the job was sent to `member`: its first member pod's creation there (None: no pod
        of the job is there)."""
        pods = self._pods_in(member)
        if pods is None:
            return None
        store = pods.by_origin
        created = (created_at(store[k]) for k in pods.keys_of(jobs.job_hash(job.ref)) if k in store)
        return monotonic_of(first_time(created))

    def adopt(self, job: Job, member_pod: dict[str, Any]) -> None:
        """A gang found in its member after a restart, sent there by the process before: the
        member gang's minimum from its pods, and its timer (counting from their creation) unless
        the member bound it already. Once per job."""
        if not job.gang.is_gang or job.member_min is not None or job.dispatched_at is not None:
            return
        recorded = ((member_pod.get("metadata") or {}).get("annotations") or {}).get(labels.GANG_MIN, "")
        job.member_min = int(recorded) if recorded.isdigit() else job.gang.min_member
        if not self.bound(job, every=True):
            self.start(job)

    def start(self, job: Job) -> None:
        """The job's timer, unless it runs already or nothing is to be bound as a whole."""
        if job.timer is not None and not job.timer.done():
            return
        if not job.gang.is_gang or (job.member is not None and not job.member_gang.is_gang):
            return  # nothing to bind as a whole in the member
        if job.incomplete_told and job.member is None and job.ready_at is None:
            job.waiting_since = time.monotonic()  # told once: a whole timeout of looking again
        job.timer = asyncio.get_running_loop().create_task(self._watch(job), name=f"dispatch/gang/{job.ref.key}")

    def bound(self, job: Job, *, every: bool = False) -> bool:
        """The member gang's minimum is bound to nodes by the member's scheduler. Counted over the
        job's front-end pods known here, or with `every` over all its pods in the member (a
        scan of the member's pods: before deciding, and after a restart, when the runtime may
        not have offered every pod yet)."""
        if job.member is None:
            return False
        pods = self._pods_in(job.member)
        if pods is None:
            return False
        keys = set(job.pods) | set(pods.keys_of(jobs.job_hash(job.ref))) if every else job.pods
        bound = sum(1 for key in keys if pods.by_origin.node(key))
        return bound >= job.member_gang.min_member

    async def _watch(self, job: Job) -> None:
        settle = time.monotonic() + min(SETTLE, job.gang.timeout)
        adopted = None
        if job.member is not None and job.dispatched_at is None:
            adopted = self.member_since(job, job.member)
        while True:
            if self.bound(job):
                if self.metrics is not None and job.dispatched_at is not None:
                    self.metrics.bind.observe(time.monotonic() - job.dispatched_at)
                return
            now = time.monotonic()
            if now >= settle and now - wait_start(job, adopted=adopted, now=now) >= job.gang.timeout:
                break
            await asyncio.sleep(TICK)
            if job.member is None and not job.failed:
                await self._look_again(job)
        async with job.lock:
            await self._expire(job)

    async def _look_again(self, job: Job) -> None:
        """Not ready (pods on native nodes may be bound after ours), or no member could take
        the gang when it was: look again as pods and capacity move."""
        async with job.lock:
            if job.member is None and not job.failed and job.pods and job.ready_at is None:
                await self.count_native(job, known=len(job.pods))
                if len(job.pods) + job.native >= job.gang.min_member:
                    job.ready_at = time.monotonic()  # completed by native pods, seen now
            if job.member is None and not job.failed and job.ready_at is not None:
                await self._dispatcher.dispatch(job, retry=True)
                if job.member is not None:
                    self._dispatcher.notify_job(job)

    async def _expire(self, job: Job) -> None:
        """The timeout passed (the job's lock held): told, rolled back, or failed."""
        if self.bound(job, every=True):
            return
        if job.member is None and job.ready_at is None:
            # Never complete at the front end: the pods keep waiting and say why; the job is
            # told once.
            job.timer = None
            if not job.incomplete_told:
                job.incomplete_told = True
                message = (
                    f"{len(job.pods) + job.native} of the gang's {job.gang.min_member} pods are bound "
                    f"({job.native} on native nodes, {len(job.pods)} on the virtual node) after "
                    f"{job.gang.timeout:.0f}s; the virtual part leaves for a member when the minimum is bound"
                )
                await self.emit(job, "GangIncomplete", message)
                await self._record_told(job)
            return
        member = job.member
        if member is not None:
            self._log.warning("gang not bound in time; rolling back", job=job.ref.key, member=member)
            await self._dispatcher.unplace(job, member)
            job.timer = None
            await self._dispatcher.dispatch(job)
            if job.member is not None:
                message = (
                    f"member {member} did not bind the gang of {job.gang.min_member} within "
                    f"{job.gang.timeout:.0f}s; its pods there were deleted and the gang sent whole to {job.member}"
                )
                await self.emit(job, "GangRolledBack", message)
                return
        job.failed = "GangTimeout"
        self._log.warning("gang timed out in every member", job=job.ref.key)
        self._dispatcher.notify_job(job)
        tried = f" (tried: {', '.join(sorted(job.excluded))})" if job.excluded else ""
        message = f"no member bound the gang of {job.gang.min_member} within {job.gang.timeout:.0f}s{tried}"
        if job.unplaced is not None:
            message = f"{message}; {job.unplaced}"
        if not all((p.get("status") or {}).get("reason") == "GangTimeout" for p in job.pods.values()):
            await self.emit(job, "GangTimeout", message)  # else told and reported before a restart
        if self.on_timeout is not None:
            await self.on_timeout(job)

    async def _record_told(self, job: Job) -> None:
        """Mark the job's pods told GangIncomplete (`TOLD`), for a restarted provider: best effort,
        as the Event itself (a pod that cannot be marked is told again after a restart at worst)."""
        front = self._front()
        if front is None:
            return
        limit = asyncio.Semaphore(CONCURRENCY)
        told = {"metadata": {"annotations": {TOLD: now_rfc3339()}}}

        async def one(pod: Pod) -> None:
            meta = pod["metadata"]
            async with limit:
                try:
                    await front.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", told)
                except ApiError as exc:
                    self._log.warning("gang's pod not marked told", job=job.ref.key, pod=meta["name"], error=str(exc))

        await asyncio.gather(*(one(p) for p in list(job.pods.values())))

    async def emit(self, job: Job, reason: str, message: str) -> None:
        """A Warning Event on each pod of the job."""
        events = self._events()
        if events is None:
            return
        for pod in list(job.pods.values()):
            await events.emit(pod, reason=reason, message=message, warning=True)
