"""Dispatch: front-end pods to member clusters, whole jobs at a time, and their status back.

- A job's first dispatch pins it to one member that can host its gang as a whole, and every
  later pod follows. The pin is durable before anything reaches the member: on the job's
  front-end group object, or on a gang's pods; for other jobs the member pods' job label is
  the record. Every front-end pod shows its member (annotation vkprovider.io/member), written
  with its status.
- Gang pods wait at the front end until the gang's minimum is bound, counting the job's pods on
  native nodes too (federation.hybrid): only the virtual part needed to complete the minimum
  leaves as a gang; the member's gang object is created first, then those pods at once. If the
  member has not bound the gang within the timeout, the member gang is deleted, the job
  unpinned and the next candidate tried; with none left the pods end Failed with reason
  GangTimeout.
- Pod security: a job goes only to a member whose level admits all its pods
  (federation.podsecurity), checked before anything reaches the member; a pod its job's member
  (or, before the job is placed, every member) refuses ends Failed with ForbiddenByMemberPolicy
  (ProviderInvalid). Member namespaces carry their member's Pod Security Admission labels.
- Our member pods are watched (federation.memberpods) and their status reported back to the
  runtime; what they refer to is copied into their member first (federation.reflector).
State is rebuilt from the front-end pods and the member pods after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from federation import jobs, labels, podsecurity
from federation.capacity.inventory import pod_requests
from federation.capacity.summary import MemberCapacity
from federation.dispatch import forge, hybrid, placement
from federation.dispatch.jobstate import Job, reported_status
from federation.dispatch.nativepods import NativePods
from federation.dispatch.writes import MemberWriter
from federation.jobs import (
    GROUP_RESOURCES,
    JobRef,
    gang_of,
    job_of,
    role_of,
)
from federation.members import disruption, outages
from federation.members.pods import MemberPods, Tombstones, new_tombstones
from federation.view.tide import GangMetrics
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import (
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
)
from vkprovider.objects import Pod, PodStatus, pod_key
from vkprovider.podstore import PodOverlay, PodSubset
from vkprovider.provider import ProviderError, ProviderInvalid


class Dispatcher:
    def __init__(
        self,
        *,
        instance: str,
        members: Callable[[], dict[str, Any]],
        capacities: Callable[[], dict[str, MemberCapacity]],
        notify: Callable[[str], None],
        outage: Callable[[str], outages.Outage | None] = lambda member: None,
        draining: Callable[[str], bool] = lambda member: False,
        virtual_nodes: Callable[[], list[str]] = lambda: [],
    ) -> None:
        self.instance = instance
        self._draining = draining
        self._members = members  # name -> provider Member (config + pods watcher)
        self._capacities = capacities
        self._notify = notify
        self._outage = outage
        self.native_pods = NativePods(lambda: self.front, virtual_nodes)
        self.jobs: dict[str, Job] = {}
        #: The front-end pods of every job: borrowed from the runtime's cache where it holds the
        #: same pod, else as bytes of their own (vkprovider.podstore).
        self.front_pods: PodOverlay[Pod] = PodOverlay()
        #: Set with the provider's metrics (federation.tide).
        self.gang_metrics: GangMetrics | None = None
        #: Pods a member took away (shared with every member's MemberPods).
        self.tombstones: Tombstones = new_tombstones()
        #: Where each pod was last seen running (front-end ns/name -> member), so a pod whose
        #: member is removed or lost fails with that reason instead of vanishing.
        self.placed: dict[str, str] = {}
        self.job_of_pod: dict[str, str] = {}  # ns/name -> job key
        self.front: KubeClient | None = None
        self.events: EventRecorder | None = None
        self.writer = MemberWriter(
            instance=instance, members=members, front=lambda: self.front, events=lambda: self.events, notify=notify
        )
        self._log = logs.get("dispatch", instance=instance)

    # -- lookups ---------------------------------------------------------------------------------

    def pods_in(self, member: str) -> MemberPods | None:
        entry = self._members().get(member)
        return getattr(entry, "pods", None)

    def member_pod(self, key: str) -> tuple[str, dict[str, Any]] | None:
        for name in self._members():
            pods = self.pods_in(name)
            if pods is not None and key in pods.by_origin:
                return name, pods.by_origin[key]
        return None

    async def _group(self, job: JobRef) -> dict[str, Any] | None:
        if job.source not in GROUP_RESOURCES or self.front is None:
            return None
        api_version, plural = GROUP_RESOURCES[job.source]
        try:
            return await self.front.get(f"/apis/{api_version}/namespaces/{job.namespace}/{plural}/{job.name}")
        except ApiError:
            return None

    async def _job(self, pod: Pod) -> Job:
        ref = job_of(pod)  # type: ignore[arg-type]
        job = self.jobs.get(ref.key)
        if job is None:
            group = await self._group(ref)
            gang = gang_of(ref, pod, group)  # type: ignore[arg-type]
            job = self.jobs.setdefault(ref.key, Job(ref=ref, gang=gang, pods=PodSubset(self.front_pods)))
            if group is not None:
                job.has_group = True
                job.recorded = ((group.get("metadata") or {}).get("annotations") or {}).get(labels.MEMBER)
        self.job_of_pod[pod_key(pod)] = ref.key
        return job

    # -- member-side writes ----------------------------------------------------------------------

    async def _create_member_pod(self, job: Job, pod: Pod, member: str, *, in_gang: bool = True) -> None:
        await self.writer.create_pod(
            pod, member, job=job.ref, gang=job.member_gang, place=job.place, role=job.role, in_gang=in_gang
        )

    async def _create_gang_object(self, job: Job, member: str) -> None:
        await self.writer.create_gang(job.ref, job.member_gang, member, place=job.place, role=job.role)

    async def _record(self, job: Job, member: str | None) -> None:
        """Record (None: clear) the job's member durably before any of it reaches the member.

        A job with a front-end group object is pinned there, in one write; a gang without one
        on each of its pods. Other jobs need no write here: their member pods carry the job
        label, which a restart reads, and each front-end pod gets the pin annotation with its
        next status write (`pin_of`)."""
        front = self.front
        assert front is not None
        if job.has_group:
            api_version, plural = GROUP_RESOURCES[job.ref.source]
            path = f"/apis/{api_version}/namespaces/{job.ref.namespace}/{plural}/{job.ref.name}"
            try:
                await front.patch(path, {"metadata": {"annotations": {labels.MEMBER: member}}})
            except NotFound:
                job.has_group = False  # deleted meanwhile: pin the pods instead
            else:
                job.recorded = member
                return
        if not job.gang.is_gang:
            return
        limit = asyncio.Semaphore(32)

        async def one(key: str) -> None:
            namespace, name = key.split("/", 1)
            async with limit:
                try:
                    updated = await front.patch(
                        f"/api/v1/namespaces/{namespace}/pods/{name}",
                        {"metadata": {"annotations": {labels.MEMBER: member}}},
                    )
                except (NotFound, Conflict):
                    return
            pod = job.pods.get(key)
            if pod is not None and updated["metadata"].get("uid") == pod["metadata"].get("uid"):
                job.pods[key] = cast(Pod, updated)

        await asyncio.gather(*(one(k) for k in list(job.pods)))

    def _recorded_member(self, job: Job, pod: Pod) -> str | None:
        """Where the job went, if anywhere: this run's choice, else the durable record (the
        group object's pin, or the pod's), else a member that runs pods of the job."""
        if job.member:
            return job.member
        recorded = job.recorded if job.has_group else (pod["metadata"].get("annotations") or {}).get(labels.MEMBER)
        if recorded:
            return recorded
        label = jobs.job_hash(job.ref)
        for name in self._members():
            pods = self.pods_in(name)
            if pods is not None and label in pods.jobs:
                return name
        return None

    def pin_of(self, key: str) -> str | None:
        """The member a front-end pod is pinned to now (its vkprovider.io/member annotation)."""
        found = self.member_pod(key)
        if found is not None:
            return found[0]
        job_key = self.job_of_pod.get(key)
        job = self.jobs.get(job_key) if job_key else None
        return job.member if job is not None and key in job.pods else None

    # -- the job state machine -------------------------------------------------------------------

    async def create(self, pod: Pod) -> None:
        job = await self._job(pod)
        key = pod_key(pod)
        async with job.lock:
            job.pods[key] = pod
            if job.failed:
                return
            tomb = self.tombstone(key)
            if tomb is not None and (tomb[0]["metadata"].get("labels") or {}).get(labels.ORIGIN_UID) == pod[
                "metadata"
            ].get("uid"):
                self._notify(key)  # taken away in its member: reported, never re-created
                return
            found = self.member_pod(key)
            if found is not None:
                job.member = job.member or found[0]
                return
            pinned = self._recorded_member(job, pod)
            if pinned and (pinned not in self._members() or self._draining(pinned)):
                job.failed = "MemberRemoved"
                self._notify_job(job)
                return
            refusal = self._refusal(pod, pinned)
            if refusal is not None:
                self._forget_pod(job, key)
                self._log.warning("pod refused by member pod security", pod=key, member=pinned or "any")
                raise ProviderInvalid(refusal, reason=podsecurity.REASON)
            if pinned and job.dispatched_at is not None:
                # An elastic pod beyond the gang's minimum (or a plain job's next pod): it goes
                # to the job's member on its own, as capacity allows.
                await self._create_member_pod(job, job.pods[key], pinned, in_gang=key in job.core)
                return
            known = self._known_pods(job, pinned) if pinned else len(job.pods)
            if job.gang.is_gang:
                job.native = await self._count_native(job)
                if known + job.native >= job.gang.min_member:
                    # About to decide what leaves as the gang: count from the API as it is now
                    # (pods bound together by the front end's gang scheduler may be in flight).
                    job.native = await self._count_native(job, fresh=True)
            if pinned and (not job.gang.is_gang or known + job.native >= job.gang.min_member):
                # Pinned before a restart: finish the dispatch in the same member.
                job.member = pinned
                job.member_min = max(0, job.gang.min_member - job.native) if job.gang.is_gang else None
                job.core = set(job.pods) if job.member_gang.is_gang else set()
                job.role = forge.gang_role([role_of(p) for p in job.pods.values()])  # type: ignore[arg-type]
                if job.member_gang.is_gang:
                    await self._create_gang_object(job, pinned)
                for other in list(job.pods.values()):
                    await self._create_member_pod(job, other, pinned, in_gang=bool(job.core))
                job.dispatched_at = time.monotonic()
                self._start_timer(job)
                return
            if job.gang.is_gang and len(job.pods) + job.native < job.gang.min_member:
                self._notify_job(job)  # waiting: every pod's message names the count
                self._start_timer(job)  # counts native pods again while it waits
                return
            if job.ready_at is None:
                job.ready_at = time.monotonic()
            await self._dispatch(job)

    def _levels(self, names: list[str]) -> dict[str, podsecurity.Level]:
        members = self._members()
        return {n: members[n].config.pod_security for n in names if n in members}

    def _refusal(self, pod: Pod, pinned: str | None) -> str | None:
        """Why the pod may go nowhere (its job's member, else any member not being drained)
        by pod security; None when some member's level admits it."""
        names = [pinned] if pinned else sorted(n for n in self._members() if not self._draining(n))
        return podsecurity.refusal(pod, self._levels(names), self.writer.needs(pod), pinned=pinned)

    def _refusing(self, job: Job) -> set[str]:
        """Members whose pod-security level refuses some pod of the job (placement skips them)."""
        levels = self._levels(list(self._members()))
        if all(level == "privileged" for level in levels.values()):
            return set()
        return podsecurity.refusing(levels, {self.writer.needs(p) for p in job.pods.values()})

    def _forget_pod(self, job: Job, key: str) -> None:
        """A pod that will not be dispatched: out of its job, and the job gone if it was its last."""
        job.pods.discard(key)
        self.job_of_pod.pop(key, None)
        if not job.pods and self.jobs.get(job.ref.key) is job:
            if job.timer is not None:
                job.timer.cancel()
            del self.jobs[job.ref.key]

    def _known_pods(self, job: Job, member: str) -> int:
        """Pods of the job bound here or already in the member (after a restart, pods that
        reached the member are adopted without passing through `create`)."""
        pods = self.pods_in(member)
        there = set()
        if pods is not None:
            label = jobs.job_hash(job.ref)
            there = set(pods.keys_of(label))
        return len(set(job.pods) | there)

    async def _count_native(self, job: Job, *, fresh: bool = False) -> int:
        """The job's pods bound to native nodes of the front end (federation.hybrid); the last
        count when the front end cannot tell now."""
        try:
            return await self.native_pods.count(job.ref, fresh=fresh)
        except ApiError as exc:
            self._log.warning("native pods of a job not counted", job=job.ref.key, error=str(exc))
            return job.native

    def _split(self, job: Job) -> hybrid.Split:
        """The pods that leave as the gang (the virtual part of its minimum, highest bands
        first) and the elastic rest; a plain job's pods all leave as they come."""
        if not job.gang.is_gang:
            return hybrid.Split(ready=True, core=tuple(job.pods), elastic=(), member_min=1)
        roles = {k: role_of(p) for k, p in job.pods.items()}  # type: ignore[arg-type]
        return hybrid.split(job.gang.min_member, job.native, roles)

    async def _dispatch(self, job: Job, *, retry: bool = False) -> None:
        split = self._split(job)
        if not split.ready:
            return
        # All elastic (the floor is on native nodes): the member need only fit one pod now.
        placed = list(split.core) if split.core else [next(iter(job.pods))]
        requests = [pod_requests(job.pods[k]["spec"]) for k in placed]
        weights = {n: m.config.weight for n, m in self._members().items()}
        capacities = {n: c for n, c in self._capacities().items() if n in self._members()}
        wanted = job.gang if split.member_min == job.gang.min_member else replace(job.gang, min_member=len(placed))
        excluded = job.excluded | self._refusing(job)
        reserved = {
            n: p.reservations.uncounted(c.at) for n, c in capacities.items() if (p := self.pods_in(n)) is not None
        }
        found = placement.candidates(capacities, requests, wanted, weights=weights, exclude=excluded, reserved=reserved)
        if not found:
            if not job.gang.is_gang:
                raise ProviderError("no member cluster can host this pod now")
            if not retry:
                self._start_timer(job)  # waits for capacity until the gang's timeout
                self._notify_job(job)
            return
        choice = found[0]
        target = self.pods_in(choice.member)
        if target is not None:
            # Taken now, before any await: a placement running meanwhile (another job's) must not
            # be offered this room again while the pin and the member's namespace are written.
            for key, wants in zip(placed, requests, strict=True):
                target.reservations.hold(key, wants)
        try:
            await self._send(job, choice, split)
        except BaseException:
            if target is not None:
                for key in placed:
                    if key not in target.by_origin:
                        target.reservations.release(key)
            raise
        if not retry:
            self._start_timer(job)

    async def _send(self, job: Job, choice: placement.Placement, split: hybrid.Split) -> None:
        """The placed job to its member: the pin, the gang object, the core's pods, the rest."""
        job.member, job.place = choice.member, choice
        job.member_min = split.member_min if job.gang.is_gang else None
        core = list(split.core)
        job.core = set(core)  # the elastic rest follow below, each once
        job.role = forge.gang_role([role_of(job.pods[k]) for k in core or job.pods])  # type: ignore[arg-type]
        self._log.info(
            "dispatching job",
            job=job.ref.key,
            member=choice.member,
            pods=len(core),
            native=job.native,
            network_pod=choice.network_pod,
        )
        await self._record(job, choice.member)
        if job.member_gang.is_gang:
            await self._create_gang_object(job, choice.member)
        limit = asyncio.Semaphore(64)

        async def one(key: str) -> None:
            async with limit:
                await self._create_member_pod(job, job.pods[key], choice.member, in_gang=key in job.core)

        # The gang's core all at once, then the elastic rest.
        await asyncio.gather(*(one(k) for k in core))
        job.dispatched_at = time.monotonic()
        if self.gang_metrics is not None and job.gang.is_gang:
            self.gang_metrics.wait.observe(job.dispatched_at - (job.ready_at or job.dispatched_at))
        await asyncio.gather(*(one(k) for k in list(job.pods) if k not in job.core))

    def _start_timer(self, job: Job) -> None:
        if job.timer is not None and not job.timer.done():
            return
        if not job.gang.is_gang or (job.member is not None and not job.member_gang.is_gang):
            return  # nothing to bind as a whole in the member
        job.timer = asyncio.get_running_loop().create_task(self._gang_timer(job), name=f"dispatch/gang/{job.ref.key}")

    def _gang_bound(self, job: Job) -> bool:
        if job.member is None:
            return False
        pods = self.pods_in(job.member)
        if pods is None:
            return False
        bound = sum(1 for key in job.pods if pods.by_origin.node(key))
        return bound >= job.member_gang.min_member

    async def _gang_timer(self, job: Job) -> None:
        started = job.dispatched_at or job.ready_at or time.monotonic()
        while True:
            if self._gang_bound(job):
                if self.gang_metrics is not None and job.dispatched_at is not None:
                    self.gang_metrics.bind.observe(time.monotonic() - job.dispatched_at)
                return
            if time.monotonic() - started >= job.gang.timeout:
                break
            await asyncio.sleep(0.5)
            if job.member is None and not job.failed:
                # Not ready (pods on native nodes may be bound after ours), or no member could
                # take the gang when it was: look again as pods and capacity move.
                async with job.lock:
                    if job.member is None and not job.failed and job.pods and job.ready_at is None:
                        job.native = await self._count_native(job)
                        if len(job.pods) + job.native >= job.gang.min_member:
                            job.native = await self._count_native(job, fresh=True)
                            if len(job.pods) + job.native >= job.gang.min_member:
                                job.ready_at = time.monotonic()
                    if job.member is None and not job.failed and job.ready_at is not None:
                        await self._dispatch(job, retry=True)
                        if job.member is not None:
                            self._notify_job(job)
        async with job.lock:
            if self._gang_bound(job):
                return
            if job.member is None and job.ready_at is None:
                # Never complete at the front end: the pods keep waiting and say why; the job
                # is told once.
                job.timer = None
                if not job.incomplete_told:
                    job.incomplete_told = True
                    message = (
                        f"{len(job.pods) + job.native} of the gang's {job.gang.min_member} pods are bound "
                        f"({job.native} on native nodes, {len(job.pods)} on the virtual node) after "
                        f"{job.gang.timeout:.0f}s; the virtual part leaves for a member when the minimum is bound"
                    )
                    await self._emit_job(job, "GangIncomplete", message)
                return
            member = job.member
            if member is not None:
                self._log.warning("gang not bound in time; rolling back", job=job.ref.key, member=member)
                await self.writer.delete_gang(job.ref, member)
                job.excluded.add(member)
                job.member, job.place, job.dispatched_at = None, None, None
                await self._record(job, None)
                job.timer = None
                await self._dispatch(job)
                if job.member is not None:
                    message = (
                        f"member {member} did not bind the gang of {job.gang.min_member} within "
                        f"{job.gang.timeout:.0f}s; its pods there were deleted and the gang sent whole to {job.member}"
                    )
                    await self._emit_job(job, "GangRolledBack", message)
                    return
            job.failed = "GangTimeout"
            self._log.warning("gang timed out in every member", job=job.ref.key)
            self._notify_job(job)
            tried = f" (tried: {', '.join(sorted(job.excluded))})" if job.excluded else ""
            message = f"no member bound the gang of {job.gang.min_member} within {job.gang.timeout:.0f}s{tried}"
            await self._emit_job(job, "GangTimeout", message)

    async def _emit_job(self, job: Job, reason: str, message: str) -> None:
        """A Warning Event on each pod of the job."""
        if self.events is None:
            return
        for pod in list(job.pods.values()):
            await self.events.emit(pod, reason=reason, message=message, warning=True)

    def _notify_job(self, job: Job) -> None:
        for key in job.pods:
            self._notify(key)

    # -- what the runtime reads -----------------------------------------------------------------

    def status(self, key: str) -> tuple[Pod | None, PodStatus | None]:
        """(front-end pod as last seen, the status to report), or (None, None) if unknown."""
        job_key = self.job_of_pod.get(key)
        job = self.jobs.get(job_key) if job_key else None
        pod = job.pods.get(key) if job else None
        found = self.member_pod(key)
        if found is not None:
            self.placed[key] = found[0]
        status = reported_status(
            key,
            job,
            pod,
            member_pod=found,
            outage=self._outage(found[0]) if found is not None else None,
            tomb=self.tombstone(key) if found is None else None,
            gone_from=self.placed.get(key),
            members=self._members,
        )
        return (pod, status) if status is not None else (None, None)

    def tombstone(self, key: str) -> tuple[dict[str, Any], disruption.Disruption] | None:
        """The last state of the pod's member pod and why it was taken away, if it was."""
        return self.tombstones.get(key)

    def _forget_tombstone(self, key: str) -> bool:
        return self.tombstones.pop(key, None) is not None

    async def delete(self, pod: Pod) -> bool:
        """Delete the pod's member pod; False if there is none."""
        key = pod_key(pod)
        if self._forget_tombstone(key):
            self.placed.pop(key, None)
            self.job_of_pod.pop(key, None)
            return True
        job_key = self.job_of_pod.get(key)
        job = self.jobs.get(job_key) if job_key else None
        if job is not None:
            job.pods.discard(key)
            if not job.pods:
                if job.timer is not None:
                    job.timer.cancel()
                self.jobs.pop(job.ref.key, None)
        found = self.member_pod(key)
        if found is None:
            self.job_of_pod.pop(key, None)
            removed = self.placed.pop(key, None) is not None
            return job is not None or removed
        member, member_pod = found
        pods = self.pods_in(member)
        client = pods.client if pods is not None else None
        if client is None or pods is None:
            raise ProviderError(f"member {member} is not connected")
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        meta = member_pod["metadata"]
        pods.expect_deletion(meta.get("uid", ""))
        body: dict[str, Any] = {"preconditions": {"uid": meta.get("uid")}}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        with contextlib.suppress(NotFound, Conflict):
            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
        return True
