"""Split gangs: a hybrid gang (part on the front end's native nodes, part on lent capacity)
whose virtual part was taken away below the gang's minimum.

The native part cannot make progress alone, yet nothing ends it: the native kubelet sees
healthy pods. When a report of taken pods leaves a job with fewer live pods (native plus
virtual) than its gang minimum, the job is told with a Warning Event GangBelowMinimum on its
group object (or owner), and its native pods get the condition `vkprovider.io/GangBelowMinimum`.
What happens next is the job's policy, `vkprovider.io/split-gang` on its group object or pods:

- `keep` (the default): the native pods keep running; the job's controller or operator decides;
- `end`: the native pods get `DisruptionTarget` (reason SplitGangBelowMinimum), so a Job's
  podFailurePolicy can ignore them as it ignores the reclaimed ones, and are deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from federation import jobs, labels
from federation.jobs import JobRef
from federation.members.member import Member
from vkprovider.events import EventRecorder
from vkprovider.kube import Conflict, KubeClient, NotFound
from vkprovider.podstatus import now_rfc3339

CONDITION = "vkprovider.io/GangBelowMinimum"
CAUSE = "SplitGangBelowMinimum"


def policy(*objects: dict[str, Any] | None) -> str:
    """The job's split-gang policy: the first object that states one, else keep."""
    for obj in objects:
        value = ((obj or {}).get("metadata") or {}).get("annotations", {}).get(labels.SPLIT_GANG)
        if value in ("keep", "end"):
            return str(value)
    return "keep"


class SplitGangs:
    def __init__(
        self,
        *,
        front: Callable[[], KubeClient | None],
        events: Callable[[], EventRecorder | None],
        native_pods: Callable[[JobRef], Awaitable[list[dict[str, Any]]]] | None = None,
        gang_min: Callable[[str], int | None] = lambda key: None,
    ) -> None:
        self._front = front
        self._events = events
        self.native_pods = native_pods
        self.gang_min = gang_min

    async def check(self, member: Member | None, job_key: str, target: dict[str, Any] | None) -> None:
        """After a job lost pods: tell it and apply its policy if it is now a split gang below
        its minimum. Raises ApiError to be tried again with the report."""
        minimum = self.gang_min(job_key)
        if not minimum or minimum <= 1 or self.native_pods is None or not job_key:
            return
        ref = JobRef.parse(job_key)
        native = await self.native_pods(ref)
        if not native:
            return  # not split: a gang wholly in the member goes whole, as the planner takes it
        virtual = 0
        pods = member.pods if member is not None else None
        if pods is not None:
            for _, member_pod in pods.by_origin.scan(pods.keys_of(jobs.job_hash(ref))):
                live = (member_pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                virtual += int(live and not member_pod["metadata"].get("deletionTimestamp"))
        if virtual + len(native) >= minimum:
            return
        chosen = policy(target, *native)
        message = (
            f"{virtual} pod(s) left on lent capacity and {len(native)} on native nodes, below the gang minimum "
            f"of {minimum}; policy {chosen}: "
            + ("its native pods are ended" if chosen == "end" else "its native pods keep running")
        )
        events = self._events()
        if events is not None and target is not None:
            await events.emit(target, reason="GangBelowMinimum", message=message, warning=True, strict=True)
        for pod in native:
            await self._mark(pod, message, end=chosen == "end")

    async def _mark(self, pod: dict[str, Any], message: str, *, end: bool) -> None:
        front = self._front()
        assert front is not None
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        now = now_rfc3339()
        conditions = [
            {"type": CONDITION, "status": "True", "reason": CAUSE, "message": message, "lastTransitionTime": now}
        ]
        if end:
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": CAUSE,
                    "message": message,
                    "lastTransitionTime": now,
                }
            )
        body = {"metadata": {"uid": meta.get("uid")}, "status": {"conditions": conditions}}
        with contextlib.suppress(NotFound, Conflict):
            # A strategic merge keyed by condition type: the kubelet's own conditions stay.
            await front.patch(f"{path}/status", body, patch_type="strategic")
            if end:
                await front.delete(path, body={"preconditions": {"uid": meta.get("uid")}})
