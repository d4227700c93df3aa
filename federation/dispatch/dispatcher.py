"""Dispatch: front-end pods to member clusters, whole jobs at a time.

- A job's first dispatch pins it to one member that can host its gang as a whole, and every
  later pod follows; the pin is durable before anything reaches the member
  (federation.dispatch.pins). Every front-end pod shows its member (annotation
  vkprovider.io/member), written with its status (federation.dispatch.reports).
- Gang pods wait at the front end until the gang's minimum is bound, counting the job's pods on
  native nodes too (federation.dispatch.hybrid): only the virtual part needed to complete the
  minimum leaves as a gang; the member's gang object is created first, then those pods at once.
  The gang's timer and rollback are federation.dispatch.gang's.
- Pod security: a job goes only to a member whose level admits all its pods
  (federation.podsecurity), checked before anything reaches the member; a pod its job's member
  (or, before the job is placed, every member) refuses ends Failed with ForbiddenByMemberPolicy
  (ProviderInvalid). Member namespaces carry their member's Pod Security Admission labels.
- What reaches a member is written by federation.dispatch.writes; our member pods are watched by
  their member's index (federation.members.pods) and reported back by
  federation.dispatch.reports.
State is rebuilt from the front-end pods and the member pods after a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from federation import jobs, labels, podsecurity
from federation.capacity.inventory import pod_requests
from federation.capacity.summary import MemberCapacity
from federation.dispatch import forge, hybrid, placement
from federation.dispatch.gang import Gangs
from federation.dispatch.jobstate import Job, job_state
from federation.dispatch.nativepods import NativePods
from federation.dispatch.pins import Pins
from federation.dispatch.reports import StatusReports
from federation.dispatch.writes import MemberWriter, NamespaceFence
from federation.jobs import gang_of, job_of, role_of
from federation.members import outages
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import KubeClient
from vkprovider.objects import Pod, pod_key
from vkprovider.podstore import PodOverlay, PodSubset
from vkprovider.provider import ProviderError, ProviderInvalid


class Dispatcher:
    def __init__(
        self,
        *,
        owner: labels.Owner,
        members: Callable[[], dict[str, Any]],
        capacities: Callable[[], dict[str, MemberCapacity]],
        notify: Callable[[str], None],
        namespaces: NamespaceFence,
        outage: Callable[[str], outages.Outage | None] = lambda member: None,
        draining: Callable[[str], bool] = lambda member: False,
        virtual_nodes: Callable[[], list[str]] = lambda: [],
    ) -> None:
        self.owner = owner
        self._draining = draining
        self._members = members  # name -> provider Member (config + pods watcher)
        self._capacities = capacities
        self._notify = notify
        self.jobs: dict[str, Job] = {}
        self.job_of_pod: dict[str, str] = {}  # ns/name -> job key
        #: The front-end pods of every job: borrowed from the runtime's cache where it holds the
        #: same pod, else as bytes of their own (vkprovider.podstore).
        self.front_pods: PodOverlay[Pod] = PodOverlay()
        self.front: KubeClient | None = None
        self.events: EventRecorder | None = None
        self.reports = StatusReports(members=members, jobs=self.jobs, job_of_pod=self.job_of_pod, outage=outage)
        self.pins = Pins(front=lambda: self.front, running_job=self.reports.running_job)
        self.writer = MemberWriter(
            owner=owner,
            members=members,
            front=lambda: self.front,
            events=lambda: self.events,
            notify=notify,
            namespaces=namespaces,
        )
        self.native_pods = NativePods(lambda: self.front, virtual_nodes)
        self.gangs = Gangs(
            self,
            native_pods=self.native_pods,
            pods_in=self.reports.pods_in,
            events=lambda: self.events,
            instance=owner.instance,
            front=lambda: self.front,
        )
        self._log = logs.get("dispatch", instance=owner.instance)

    async def _job(self, pod: Pod) -> Job:
        ref = job_of(pod)  # type: ignore[arg-type]
        job = self.jobs.get(ref.key)
        if job is None:
            group = await self.pins.group(ref)
            gang = gang_of(ref, pod, group)  # type: ignore[arg-type]
            job = self.jobs.setdefault(ref.key, Job(ref=ref, gang=gang, pods=PodSubset(self.front_pods)))
            if group is not None:
                self.pins.adopt(job, group)
        self.job_of_pod[pod_key(pod)] = ref.key
        return job

    # -- the job state machine -------------------------------------------------------------------

    async def create(self, pod: Pod) -> None:
        job = await self._job(pod)
        key = pod_key(pod)
        async with job.lock:
            job.pods[key] = pod
            self.gangs.arrived(job, pod)
            if job.failed:
                return
            tomb = self.reports.tombstone(key)
            if tomb is not None and (tomb[0]["metadata"].get("labels") or {}).get(labels.ORIGIN_UID) == pod[
                "metadata"
            ].get("uid"):
                self._notify(key)  # taken away in its member: reported, never re-created
                return
            found = self.reports.member_pod(key)
            if found is not None:
                job.member = job.member or found[0]
                if job.member == found[0]:
                    self.gangs.adopt(job, found[1])  # sent before a restart: its timer goes on
                return
            pinned = self.pins.recorded(job, pod)
            if pinned and (pinned not in self._members() or self._draining(pinned)):
                job.failed = "MemberRemoved"
                self.notify_job(job)
                return
            refusal = self._refusal(pod, pinned)
            if refusal is not None:
                self._forget_pod(job, key)
                self._log.warning("pod refused by member pod security or fence", pod=key, member=pinned or "any")
                raise ProviderInvalid(refusal, reason=podsecurity.REASON)
            if pinned and job.dispatched_at is not None:
                # An elastic pod beyond the gang's minimum (or a plain job's next pod): it goes
                # to the job's member on its own, as capacity allows.
                await self.writer.create_pod(job, job.pods[key], pinned, in_gang=key in job.core)
                return
            known = self._known_pods(job, pinned) if pinned else len(job.pods)
            if job.gang.is_gang:
                await self.gangs.count_native(job, known=known)
            if pinned and (not job.gang.is_gang or known + job.native >= job.gang.min_member):
                # Pinned before a restart: finish the dispatch in the same member.
                job.member = pinned
                job.member_min = max(0, job.gang.min_member - job.native) if job.gang.is_gang else None
                job.core = set(job.pods) if job.member_gang.is_gang else set()
                job.role = forge.gang_role([role_of(p) for p in job.pods.values()])  # type: ignore[arg-type]
                if job.member_gang.is_gang:
                    await self.writer.create_gang(job, pinned)
                for other in list(job.pods.values()):
                    await self.writer.create_pod(job, other, pinned, in_gang=bool(job.core))
                # Sent when its first member pod was created (before the restart, if any was).
                sent = self.gangs.member_since(job, pinned)
                job.dispatched_at = time.monotonic() if sent is None else sent
                self.gangs.start(job)
                return
            if job.gang.is_gang and len(job.pods) + job.native < job.gang.min_member:
                self.notify_job(job)  # waiting: every pod's message names the count
                self.gangs.start(job)  # counts native pods again while it waits
                return
            if job.ready_at is None:
                job.ready_at = self.gangs.ready_since(job) if job.gang.is_gang else time.monotonic()
            await self.dispatch(job)

    def to_adopt(self, key: str) -> bool:
        """Whether `adopt` has anything to do for this pod (a lookup: asked on every status read)."""
        if key in self.job_of_pod:
            return False
        found = self.reports.member_pod(key)
        return found is not None and not found[1].get("spec", {}).get("nodeName")

    async def adopt(self, pod: Pod) -> None:
        """A front-end pod (from the runtime's cache) a restarted provider finds in a member, not
        bound there: the runtime reads it (get_pod) and never creates it again, so its gang's
        timer goes on from here, counting from its member pods' creation
        (federation.dispatch.gang). Bound pods, and pods of jobs already known, cost a lookup."""
        key = pod_key(pod)
        if key in self.job_of_pod:
            return
        found = self.reports.member_pod(key)
        if found is None or found[1].get("spec", {}).get("nodeName"):
            return
        job = await self._job(pod)
        async with job.lock:
            job.pods[key] = pod
            if job.member is None:
                job.member = found[0]
            if job.member == found[0]:
                self.gangs.adopt(job, found[1])

    def _levels(self, names: list[str]) -> dict[str, podsecurity.Level]:
        members = self._members()
        return {n: members[n].config.pod_security for n in names if n in members}

    def _fences(self, pod: Pod, names: list[str]) -> dict[str, list[podsecurity.Violation]]:
        """What keeps the pod out of each tenant member's fence (members without one: none)."""
        members = self._members()
        return {
            n: podsecurity.fence(
                pod, members[n].config.tenancy.allowed_tolerations, ignored=forge.VIRTUAL_TOLERATION_KEYS
            )
            for n in names
            if n in members and members[n].config.tenancy is not None
        }

    def _refusal(self, pod: Pod, pinned: str | None) -> str | None:
        """Why the pod may go nowhere (its job's member, else any member not being drained)
        by pod security or a tenant fence; None when some member admits it."""
        names = [pinned] if pinned else sorted(n for n in self._members() if not self._draining(n))
        needs = self.writer.needs(pod)
        return podsecurity.refusal(pod, self._levels(names), needs, pinned=pinned, fences=self._fences(pod, names))

    def _refusing(self, job: Job) -> set[str]:
        """Members whose pod-security level or tenant fence refuses some pod of the job (placement
        skips them)."""
        names = list(self._members())
        fenced = {n for p in job.pods.values() for n, found in self._fences(p, names).items() if found}
        levels = self._levels(names)
        if all(level == "privileged" for level in levels.values()):
            return fenced
        return fenced | podsecurity.refusing(levels, {self.writer.needs(p) for p in job.pods.values()})

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
        pods = self.reports.pods_in(member)
        there = set()
        if pods is not None:
            label = jobs.job_hash(job.ref)
            there = set(pods.keys_of(label))
        return len(set(job.pods) | there)

    def _split(self, job: Job) -> hybrid.Split:
        """The pods that leave as the gang (the virtual part of its minimum, highest bands
        first) and the elastic rest; a plain job's pods all leave as they come."""
        if not job.gang.is_gang:
            return hybrid.Split(ready=True, core=tuple(job.pods), elastic=(), member_min=1)
        roles = {k: role_of(p) for k, p in job.pods.items()}  # type: ignore[arg-type]
        return hybrid.split(job.gang.min_member, job.native, roles)

    async def dispatch(self, job: Job, *, retry: bool = False) -> None:
        """Place the job (its gang whole) and send it; a gang that finds no room waits for its
        timer, a plain pod is refused for now."""
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
        pods_in = self.reports.pods_in
        reserved = {n: p.reservations.uncounted(c.at) for n, c in capacities.items() if (p := pods_in(n)) is not None}
        found = placement.candidates(capacities, requests, wanted, weights=weights, exclude=excluded, reserved=reserved)
        if not found:
            if not job.gang.is_gang:
                raise ProviderError("no member cluster can host this pod now")
            why = placement.shortfall(capacities, requests, wanted, exclude=excluded, reserved=reserved)
            told, job.unplaced = job.unplaced, why
            if told is None:
                await self.gangs.emit(job, forge.NO_ROOM, f"the gang waits whole at the front end: {why}"[:1000])
            if not retry:
                self.gangs.start(job)  # waits for capacity until the gang's timeout
            if why != told:
                self.notify_job(job)  # its pods say why
            return
        job.unplaced = None
        choice = found[0]
        target = self.reports.pods_in(choice.member)
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
            self.gangs.start(job)

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
        await self.pins.record(job, choice.member)
        if job.member_gang.is_gang:
            await self.writer.create_gang(job, choice.member)
        limit = asyncio.Semaphore(64)

        async def one(key: str) -> None:
            async with limit:
                await self.writer.create_pod(job, job.pods[key], choice.member, in_gang=key in job.core)

        # The gang's core all at once, then the elastic rest.
        await asyncio.gather(*(one(k) for k in core))
        job.dispatched_at = time.monotonic()
        if self.gangs.metrics is not None and job.gang.is_gang:
            self.gangs.metrics.wait.observe(job.dispatched_at - (job.ready_at or job.dispatched_at))
        await asyncio.gather(*(one(k) for k in list(job.pods) if k not in job.core))

    async def unplace(self, job: Job, member: str) -> None:
        """A gang its member did not bind in time: deleted there, the member excluded, the pin
        cleared (federation.dispatch.gang sends it on)."""
        await self.writer.delete_gang(job.ref, member)
        job.excluded.add(member)
        job.member, job.place, job.dispatched_at = None, None, None
        await self.pins.record(job, None)

    def notify_job(self, job: Job) -> None:
        for key in job.pods:
            self._notify(key)

    async def delete(self, pod: Pod) -> bool:
        """Delete the pod's member pod; False if there is none."""
        key = pod_key(pod)
        reports = self.reports
        if reports.tombstones.pop(key, None) is not None:
            reports.placed.pop(key, None)
            self.job_of_pod.pop(key, None)
            return True
        job = reports.job_of(key)
        if job is not None:
            job.pods.discard(key)
            if not job.pods:
                if job.timer is not None:
                    job.timer.cancel()
                self.jobs.pop(job.ref.key, None)
        found = reports.member_pod(key)
        if found is None:
            self.job_of_pod.pop(key, None)
            removed = reports.placed.pop(key, None) is not None
            return job is not None or removed
        member, member_pod = found
        await self.writer.delete_pod(member, member_pod, grace=pod["metadata"].get("deletionGracePeriodSeconds"))
        return True

    def view(self) -> dict[str, dict[str, Any]]:
        """The jobs in the resource view: member, pods, gang minimum, state, network pod."""
        return {
            key: {
                "member": job.member,
                "pods": len(job.pods),
                "gangMin": job.gang.min_member,
                "state": job_state(job),
                "networkPod": job.place.network_pod if job.place else None,
            }
            for key, job in sorted(self.jobs.items())
        }

    def job_states(self) -> dict[str, int]:
        """Jobs by state (waiting, NoMemberFits, dispatched, or why they failed), for the jobs
        gauge; the first three always, so an alert on one has a series to read."""
        counts = {"waiting": 0, forge.NO_ROOM: 0, "dispatched": 0}
        for job in self.jobs.values():
            state = job_state(job)
            counts[state] = counts.get(state, 0) + 1
        return counts
