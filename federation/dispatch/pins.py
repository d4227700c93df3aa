"""Pinning: the member a job went to, recorded durably at the front end before any of it reaches
the member, and read back after a restart.

A job with a front-end group object (a PodGroup of a dialect federation.jobs knows) is pinned
there, in one write; a gang without one on each of its pods. Other jobs need no write: their
member pods carry the job label (federation.labels.JOB_LABEL), which a restart reads, and each
front-end pod gets the pin annotation with its next status write. The annotation is
vkprovider.io/member in every case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from federation import jobs, labels
from federation.dispatch.jobstate import Job
from federation.jobs import GROUP_RESOURCES, JobRef
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound
from vkprovider.objects import Pod

#: Front-end pods patched at once when a gang without a group object is pinned.
CONCURRENCY = 32


def _group_path(job: JobRef) -> str:
    api_version, plural = GROUP_RESOURCES[job.source]
    return f"/apis/{api_version}/namespaces/{job.namespace}/{plural}/{job.name}"


class Pins:
    def __init__(self, *, front: Callable[[], KubeClient | None], running_job: Callable[[str], str | None]) -> None:
        self._front = front
        self._running_job = running_job  # job label -> a member that runs pods of it

    async def group(self, job: JobRef) -> dict[str, Any] | None:
        """The job's front-end group object, if its source has one and it exists."""
        front = self._front()
        if job.source not in GROUP_RESOURCES or front is None:
            return None
        try:
            return await front.get(_group_path(job))
        except ApiError:
            return None

    def adopt(self, job: Job, group: dict[str, Any]) -> None:
        """A new job's group object: its pin goes there, and says where the job went before."""
        job.has_group = True
        job.recorded = ((group.get("metadata") or {}).get("annotations") or {}).get(labels.MEMBER)

    async def record(self, job: Job, member: str | None) -> None:
        """Record (None: clear) the job's member before any of it reaches the member."""
        front = self._front()
        assert front is not None
        if job.has_group:
            try:
                await front.patch(_group_path(job.ref), {"metadata": {"annotations": {labels.MEMBER: member}}})
            except NotFound:
                job.has_group = False  # deleted meanwhile: pin the pods instead
            else:
                job.recorded = member
                return
        if not job.gang.is_gang:
            return
        limit = asyncio.Semaphore(CONCURRENCY)

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

    def recorded(self, job: Job, pod: Pod) -> str | None:
        """Where the job went, if anywhere: this run's choice, else the durable record (the
        group object's pin, or the pod's), else a member that runs pods of the job."""
        if job.member:
            return job.member
        recorded = job.recorded if job.has_group else (pod["metadata"].get("annotations") or {}).get(labels.MEMBER)
        if recorded:
            return recorded
        return self._running_job(jobs.job_hash(job.ref))
