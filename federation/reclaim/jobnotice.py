"""The whole job told of a notice: `vkprovider.io/reclaim-notice` on every pod of a job with
pods under notice, native ones included.

An elastic trainer (torchrun, Horovod) or a launcher on a native node must learn which workers
leave, and when, before they get SIGTERM, so it can re-form the job without them. The value is
JSON, `{"deadline": <earliest RFC 3339 deadline>, "pods": [{"name": ..., "reclaimAt": ...}]}`,
readable through a downward-API volume; it is rewritten when the set changes and removed when
no pod of the job is under notice any more. The value written last is read back from the
front-end pods after a restart, so a stale notice is still cleared.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from federation import jobs, labels
from federation.jobs import JobRef
from federation.members.member import Member
from federation.reclaim.notices import front_stub
from vkprovider import logs
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound

NativePods = Callable[[JobRef], Awaitable[list[dict[str, Any]]]]


def value(leaving: Mapping[str, str]) -> str | None:
    """The annotation for a job whose pods `leaving` (front-end name -> deadline) are under
    notice; None when none is."""
    if not leaving:
        return None
    pods = [{"name": n, "reclaimAt": leaving[n]} for n in sorted(leaving)]
    return json.dumps({"deadline": min(leaving.values()), "pods": pods}, separators=(",", ":"))


class JobNotices:
    def __init__(self, *, front: Callable[[], KubeClient | None], instance: str) -> None:
        self._front = front
        self.native_pods: NativePods | None = None
        self._written: dict[tuple[str, str], str | None] = {}  # (member, job key) -> value
        self._log = logs.get("reclaim", instance=instance)

    def seen(self, member: str, job_key: str, annotations: Mapping[str, str]) -> None:
        """What a front-end pod of the job carries (after a restart, what to clear)."""
        written = annotations.get(labels.RECLAIM_NOTICE)
        if written and job_key:
            self._written.setdefault((member, job_key), written)

    async def update(self, member: Member, leaving: Mapping[str, dict[str, str]]) -> None:
        """Each job with pods under notice in the member (job key -> front-end name -> deadline)
        told on all its pods; jobs told before and now without notices cleared."""
        keys = {k for m, k in self._written if m == member.name} | set(leaving)
        for job_key in sorted(keys):
            wanted = value(leaving.get(job_key, {}))
            if self._written.get((member.name, job_key)) == wanted:
                continue
            try:
                await self._tell(member, job_key, wanted)
            except ApiError as exc:
                self._log.warning("job notice not written", job=job_key, error=str(exc))
                continue  # tried again next round
            if wanted is None:
                self._written.pop((member.name, job_key), None)
            else:
                self._written[(member.name, job_key)] = wanted

    async def _tell(self, member: Member, job_key: str, wanted: str | None) -> None:
        front = self._front()
        pods = member.pods
        if front is None or pods is None or not job_key:
            return
        targets: list[dict[str, Any]] = []
        ref = JobRef.parse(job_key)
        for _, member_pod in pods.by_origin.scan(pods.keys_of(jobs.job_hash(ref))):
            targets.append(front_stub(member_pod)["metadata"])
        if self.native_pods is not None:
            targets.extend(p["metadata"] for p in await self.native_pods(ref))
        for meta in targets:
            body = {"metadata": {"annotations": {labels.RECLAIM_NOTICE: wanted}, "uid": meta.get("uid")}}
            try:
                await front.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
            except (NotFound, Conflict):
                continue
