"""Telling a job that its pods were taken away, whatever took them (our planner after its
notice, the member's scheduler, an eviction, a lost node): a Warning Event PodsReclaimed on the
job's group object (or its owner, else the pod) and `vkprovider.io/last-reclaim` on the job's
remaining pods, so a PS can checkpoint. Reports are batched: each reclaim round sends what the
member watches reported since the last one. A report that fails is kept and sent again next
round until it lands; then the pods it names get `vkprovider.io/job-told`, and a restarted
provider reports every disrupted front-end pod of ours that lacks it (at least once).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from cachetools import TTLCache

from federation import jobs, labels
from federation.jobs import GROUP_RESOURCES, JobRef
from federation.members import disruption
from federation.members.member import Member
from federation.members.pods import MemberPods
from federation.reclaim.metrics import ReclaimMetrics
from federation.reclaim.notices import annotate_front, annotate_member, rfc3339
from federation.reclaim.splitgang import SplitGangs
from federation.reclaim.terms import parse_time
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, KubeClient, NotFound

#: Where a job's controlling owner lives, by kind (the object PodsReclaimed is recorded on).
OWNER_PATHS = {"Job": "batch/v1/jobs", "ReplicaSet": "apps/v1/replicasets", "StatefulSet": "apps/v1/statefulsets"}


class JobReports:
    def __init__(
        self,
        *,
        members: Callable[[], Mapping[str, Member]],
        front: Callable[[], KubeClient | None],
        events: Callable[[], EventRecorder | None],
        metrics: Callable[[], ReclaimMetrics],
    ) -> None:
        self._members = members
        self._front = front
        self._events = events
        self._metrics = metrics
        self._pending: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (member, job key) -> pods
        self._log = logs.get("reclaim")
        self._queued: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=3600)  # front uids reported
        self.split = SplitGangs(front=front, events=events)
        #: Handed each reclaim as a plain mapping (the view's reclaim log, set by the provider).
        self.on_reclaimed: Callable[[dict[str, Any]], object] | None = None
        #: Whether the workload acknowledged the member pod's notice (by uid), as this run saw.
        self.acknowledged: Callable[[str], bool] = lambda uid: False

    def disrupted(self, member: str, member_pod: dict[str, Any], what: disruption.Disruption) -> None:
        """A member pod of ours was taken away (any cause): its job hears of it (batched)."""
        meta = member_pod["metadata"]
        annotations = meta.get("annotations") or {}
        band = annotations.get(labels.BAND) or "worker-min"
        cause = "planner" if what.cause == disruption.PLANNER_REASON else what.cause
        self._metrics().reclaimed.labels(member, band, cause).inc()
        started = parse_time((member_pod.get("status") or {}).get("startTime") or "")
        if started is not None:
            self._metrics().lost.labels(member, band, cause).inc(max(0.0, time.time() - started))
        job = annotations.get(labels.JOB_KEY) or ""
        origin = MemberPods.origin(member_pod)
        self._pending.setdefault((member, job), []).append((origin, what.pod_reason))
        if self.on_reclaimed is not None:
            noticed = annotations.get(labels.RECLAIM_NOTICED_AT)
            deadline = annotations.get(labels.RECLAIM_AT)
            self.on_reclaimed(
                {
                    "at": time.time(),
                    "member": member,
                    "node": (member_pod.get("spec") or {}).get("nodeName") or "",
                    "pod": origin,
                    "job": job,
                    "band": band,
                    "cause": cause,
                    "reason": what.pod_reason,
                    "noticed_at": parse_time(noticed) if noticed else None,
                    "deadline": parse_time(deadline) if deadline else None,
                    "acknowledged": self.acknowledged(meta.get("uid", "")),
                }
            )

    def disrupted_front(self, member: str, front: dict[str, Any], reason: str | None = None) -> None:
        """A front-end pod ended by a disruption its job was not told of yet (found after a
        restart: gone while no provider ran, or the report of the run that ended it did not
        land). Once per pod."""
        meta = front["metadata"]
        uid = meta.get("uid", "")
        if uid in self._queued:
            return
        self._queued[uid] = True
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        reason = reason or (front.get("status") or {}).get("reason") or "Reclaimed"
        self._pending.setdefault((member, jobs.job_of(front).key), []).append((key, reason))

    async def flush(self) -> None:
        """Each job told what it lost since the last flush; a report that fails is kept and
        tried again next round (at least once: a restart may tell a job twice, never not at all)."""
        reports, self._pending = self._pending, {}
        for (member_name, job_key), taken in reports.items():
            try:
                await self._report(member_name, job_key, taken)
            except ApiError as exc:
                self._pending.setdefault((member_name, job_key), []).extend(taken)
                self._log.warning("job report not written; tried again", job=job_key, error=str(exc))

    async def _report(self, member_name: str, job_key: str, taken: list[tuple[str, str]]) -> None:
        members, front = self._members(), self._front()
        assert front is not None
        member = members.get(member_name)
        stamp = rfc3339(time.time())
        names = ", ".join(sorted({k.split("/", 1)[-1] for k, _ in taken}))
        message = f"{len(taken)} pod(s) taken back by member {member_name}: {names}; checkpoint now"
        target = await self.job_object(job_key, taken[0][0])
        events = self._events()
        if events is not None and target is not None:
            await events.emit(target, reason="PodsReclaimed", message=message[:1000], warning=True, strict=True)
        await self.split.check(member, job_key, target)
        if member is not None and job_key:
            value = json.dumps({"at": stamp, "count": len(taken)}, separators=(",", ":"))
            pods = member.pods
            label = jobs.job_hash(JobRef.parse(job_key))
            for _, member_pod in pods.by_origin.scan(pods.keys_of(label)) if pods is not None else ():
                if member_pod["metadata"].get("deletionTimestamp"):
                    continue
                assert pods is not None and pods.client is not None
                await annotate_member(pods.client, member_pod, {labels.LAST_RECLAIM: value})
                await annotate_front(front, member_pod, {labels.LAST_RECLAIM: value})
        for key, _ in taken:  # told: a restart does not tell again
            namespace, _, name = key.partition("/")
            with contextlib.suppress(NotFound):
                await front.patch(
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    {"metadata": {"annotations": {labels.JOB_TOLD: stamp}}},
                )

    async def job_object(self, job_key: str, front_key: str) -> dict[str, Any] | None:
        """The object to tell: the job's group object, else its owner, else the pod."""
        front = self._front()
        assert front is not None
        namespace, _, name = front_key.partition("/")
        ref = JobRef.parse(job_key) if job_key else None
        paths = []
        if ref is not None and ref.source in GROUP_RESOURCES:
            api_version, plural = GROUP_RESOURCES[ref.source]
            paths.append(f"/apis/{api_version}/namespaces/{ref.namespace}/{plural}/{ref.name}")
        if ref is not None and ref.source == "owner":
            kind, _, owner = ref.name.partition("/")
            if kind in OWNER_PATHS:
                group_version, _, resource = OWNER_PATHS[kind].rpartition("/")
                paths.append(f"/apis/{group_version}/namespaces/{ref.namespace}/{resource}/{owner}")
        paths.append(f"/api/v1/namespaces/{namespace}/pods/{name}")
        for path in paths:
            with contextlib.suppress(ApiError):
                return await front.get(path)
        return None
