"""The gang gate: a gang leaves for a member only whole, and is bound there in time or sent back.

- Complete at the front end: a gang's minimum counts its pods bound to the virtual node and to
  the front end's native nodes (federation.dispatch.hybrid, listed by
  federation.dispatch.nativepods); the native count is taken again from the API just before
  deciding what leaves, since pods the front end's gang scheduler binds together may be in flight.
- One timer per gang job (task `dispatch/gang/<job>`): while the job waits at the front end it
  looks again every half second (pods bound, capacity freed) and dispatches once it can; once
  dispatched it waits for the member's scheduler to bind the member gang's minimum.
- Past the gang's timeout: a gang never complete at the front end is told once (Event
  GangIncomplete) and keeps waiting; one its member did not bind is deleted there, the job
  unpinned and sent whole to the next candidate (GangRolledBack); with none left, its pods end
  Failed with reason GangTimeout.
What dispatching means (placement, the member writes) is the dispatcher's; it is reached
through `Dispatching`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram

from federation.dispatch.jobstate import Job
from federation.dispatch.nativepods import NativePods
from federation.members.pods import MemberPods
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError

#: Seconds between two looks of a waiting or dispatched gang's timer.
TICK = 0.5
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
    ) -> None:
        self._dispatcher = dispatcher
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

    def start(self, job: Job) -> None:
        """The job's timer, unless it runs already or nothing is to be bound as a whole."""
        if job.timer is not None and not job.timer.done():
            return
        if not job.gang.is_gang or (job.member is not None and not job.member_gang.is_gang):
            return  # nothing to bind as a whole in the member
        job.timer = asyncio.get_running_loop().create_task(self._watch(job), name=f"dispatch/gang/{job.ref.key}")

    def bound(self, job: Job) -> bool:
        """The member gang's minimum is bound to nodes by the member's scheduler."""
        if job.member is None:
            return False
        pods = self._pods_in(job.member)
        if pods is None:
            return False
        bound = sum(1 for key in job.pods if pods.by_origin.node(key))
        return bound >= job.member_gang.min_member

    async def _watch(self, job: Job) -> None:
        started = job.dispatched_at or job.ready_at or time.monotonic()
        while True:
            if self.bound(job):
                if self.metrics is not None and job.dispatched_at is not None:
                    self.metrics.bind.observe(time.monotonic() - job.dispatched_at)
                return
            if time.monotonic() - started >= job.gang.timeout:
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
                    job.ready_at = time.monotonic()
            if job.member is None and not job.failed and job.ready_at is not None:
                await self._dispatcher.dispatch(job, retry=True)
                if job.member is not None:
                    self._dispatcher.notify_job(job)

    async def _expire(self, job: Job) -> None:
        """The timeout passed (the job's lock held): told, rolled back, or failed."""
        if self.bound(job):
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
        await self.emit(job, "GangTimeout", message)
        if self.on_timeout is not None:
            await self.on_timeout(job)

    async def emit(self, job: Job, reason: str, message: str) -> None:
        """A Warning Event on each pod of the job."""
        events = self._events()
        if events is None:
            return
        for pod in list(job.pods.values()):
            await events.emit(pod, reason=reason, message=message, warning=True)
