"""Why a member pod went away, and what the front end shows for it (pure).

Whatever takes a member pod away, the front-end pod ends Failed in one status write that
carries `DisruptionTarget=True` (so a Job's podFailurePolicy can ignore it), a pod reason
controllers understand, and a message naming the member, the node and what took it. The
cause is read from the member pod's last state, as the member left it:

| member side | DisruptionTarget reason (front end) | pod reason |
|---|---|---|
| its scheduler preempted the pod | PreemptionByScheduler | Preempted |
| the eviction API | EvictionByEvictionAPI | Evicted |
| taint eviction | DeletionByTaintManager | Evicted |
| the kubelet (node pressure, shutdown) | TerminationByKubelet | Evicted |
| its node was deleted (pod GC) | DeletionByPodGC | Reclaimed |
| our reclaim planner, after its notice | ReclaimedForOnlineLoad | Reclaimed |
| deleted by hand (no condition) | DeletedInMember | Reclaimed |
| gone while no provider watched, under notice | ReclaimedForOnlineLoad | Reclaimed |
| gone while no provider watched, no notice | GoneWhileProviderDown | Reclaimed |

A member pod that went away while the provider was down leaves no last state to read: the
front-end pod's own annotations say what was known (a notice it carried means our reclaim
took it); otherwise the message says so plainly. Either way DisruptionTarget is set, so a Job
ignoring disruptions does not count a failure (never the runtime's ProviderPodLost).

The provider never re-creates such a pod: the job's controller decides what replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from federation import labels
from vkprovider.objects import Pod, PodStatus
from vkprovider.podstatus import failed_status, now_rfc3339

PLANNER_REASON = "ReclaimedForOnlineLoad"
BY_HAND = "DeletedInMember"
GONE_UNSEEN = "GoneWhileProviderDown"

_POD_REASON = {
    "PreemptionByScheduler": "Preempted",
    "EvictionByEvictionAPI": "Evicted",
    "DeletionByTaintManager": "Evicted",
    "TerminationByKubelet": "Evicted",
    "DeletionByPodGC": "Reclaimed",
    PLANNER_REASON: "Reclaimed",
    BY_HAND: "Reclaimed",
    GONE_UNSEEN: "Reclaimed",
}
_WHAT = {
    "PreemptionByScheduler": "preempted by the member's scheduler",
    "EvictionByEvictionAPI": "evicted through the member's eviction API",
    "DeletionByTaintManager": "evicted by a NoExecute taint on the member's node",
    "TerminationByKubelet": "terminated by the member's kubelet",
    "DeletionByPodGC": "removed with its member node",
    PLANNER_REASON: "reclaimed for online load after its notice",
    BY_HAND: "deleted in the member",
    GONE_UNSEEN: "gone from the member while the provider was down; its last state is unknown",
}


@dataclass(frozen=True)
class Disruption:
    cause: str  # the DisruptionTarget reason written at the front end
    pod_reason: str  # Preempted, Evicted or Reclaimed
    message: str


def _member_condition(member_pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in (member_pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return dict(cond)
    return None


def cause_of(member_pod: dict[str, Any], *, member: str, gone: bool) -> Disruption | None:
    """Why the member pod stopped, or None if it did not stop for a disruption (it is still
    running, or ended by itself: completed or failed in its own right)."""
    meta = member_pod.get("metadata") or {}
    status = member_pod.get("status") or {}
    node = (member_pod.get("spec") or {}).get("nodeName") or "no node"
    condition = _member_condition(member_pod)
    phase = status.get("phase")
    if condition is None and not gone:
        return None
    if condition is None and phase in ("Succeeded", "Failed"):
        return None  # ended by itself, then deleted: its own status says how
    if condition is not None:
        cause = str(condition.get("reason") or "DisruptionTarget")
        detail = str(condition.get("message") or "")
    elif (meta.get("annotations") or {}).get(labels.RECLAIM_AT):
        annotations = meta.get("annotations") or {}
        why = annotations.get(labels.RECLAIM_REASON)
        cause, detail = PLANNER_REASON, f"notice deadline {annotations[labels.RECLAIM_AT]}"
        detail += f"; {why}" if why else ""
    else:
        cause, detail = BY_HAND, ""
    if not gone and phase not in ("Succeeded", "Failed"):
        return None  # marked for disruption, not yet stopped: the front end keeps its status
    what = _WHAT.get(cause, f"disrupted in the member ({cause})")
    message = f"member {member}, node {node}: {what}" + (f" ({detail})" if detail else "")
    return Disruption(cause=cause, pod_reason=_POD_REASON.get(cause, "Reclaimed"), message=message[:1000])


def gone_unseen(front: dict[str, Any], *, member: str) -> Disruption:
    """Why a front-end pod's member pod is gone, when it went while no provider watched."""
    annotations = (front.get("metadata") or {}).get("annotations") or {}
    if annotations.get(labels.RECLAIM_AT):
        cause = PLANNER_REASON
        detail = f"notice deadline {annotations[labels.RECLAIM_AT]}; the provider restarted meanwhile"
    else:
        cause, detail = GONE_UNSEEN, ""
    message = f"member {member}: {_WHAT[cause]}" + (f" ({detail})" if detail else "")
    return Disruption(cause=cause, pod_reason=_POD_REASON[cause], message=message[:1000])


def disrupted_status(front: Pod, disruption: Disruption) -> PodStatus:
    """The front-end pod's terminal status: Failed, the reason, and DisruptionTarget, in one."""
    status = failed_status(front, reason=disruption.pod_reason, message=disruption.message)
    status["conditions"] = [
        *status.get("conditions", []),
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": disruption.cause,
            "message": disruption.message,
            "lastTransitionTime": now_rfc3339(),
        },
    ]
    return status
