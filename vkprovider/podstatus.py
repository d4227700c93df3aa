"""Pure decisions about pods: what status the API should show, whether two specs differ in a
way the provider must hear about, and the statuses the runtime writes on its own (failures,
lost pods). No I/O: table-tested without an event loop.
"""

from __future__ import annotations

import datetime
from typing import Any

from vkprovider.objects import ContainerStatus, Pod, PodCondition, PodStatus, clone

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: A deleted pod's containers, stopped with it where the provider can no longer tell their exit.
DELETED = "The container was stopped with its deleted pod; its exit code is not known"

#: Status fields the runtime owns and writes; everything else (PodScheduled from the
#: scheduler, DisruptionTarget from controllers, ...) belongs to other writers.
OWNED_FIELDS = (
    "phase",
    "reason",
    "message",
    "containerStatuses",
    "initContainerStatuses",
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
    "startTime",
)
OWNED_CONDITIONS = frozenset({"Initialized", "Ready", "ContainersReady", "PodReadyToStartContainers"})
#: Conditions under our own domain are the provider's to state (vkprovider.io/MemberReachable):
#: written as it reports them and removed when it stops, like the kubelet's own.
PROVIDER_CONDITION_PREFIX = "vkprovider.io/"
#: Shared with other writers, as the kubelet shares it: the runtime writes the provider's only
#: together with a terminal phase (one write: Failed and why), and otherwise keeps what is there.
DISRUPTION = "DisruptionTarget"

#: The mutable parts of a pod spec and metadata (what an update can change).
MUTABLE_SPEC_FIELDS = ("activeDeadlineSeconds", "tolerations", "ephemeralContainers")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_terminal(pod: Pod) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL_PHASES


def is_accepted(pod: Pod) -> bool:
    """True once the runtime has reported the pod started: from then on the provider must have
    it, and its absence means the pod was lost (never re-created)."""
    return bool(pod.get("status", {}).get("startTime"))


def _container_images(containers: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    return [(c.get("name", ""), c.get("image", "")) for c in containers or []]


def pods_equal(a: Pod, b: Pod) -> bool:
    """Equal on everything an update can change (images, labels, annotations, deadlines...)."""
    sa, sb = a["spec"], b["spec"]
    if _container_images(sa.get("containers")) != _container_images(sb.get("containers")):
        return False
    if _container_images(sa.get("initContainers")) != _container_images(sb.get("initContainers")):
        return False
    if any(sa.get(f) != sb.get(f) for f in MUTABLE_SPEC_FIELDS):
        return False
    ma, mb = a["metadata"], b["metadata"]
    return bool(ma.get("labels") == mb.get("labels") and ma.get("annotations") == mb.get("annotations"))


def _conditions_by_type(status: PodStatus) -> dict[str, PodCondition]:
    return {c["type"]: c for c in status.get("conditions", []) if "type" in c}


def desired_status(api_pod: Pod, provider_status: PodStatus, *, host_ip: str) -> PodStatus:
    """The status to show in the API: the provider's, with the node's host IP, the conditions
    other writers own kept as they are, and transition times kept while a condition holds."""
    current = api_pod.get("status", {})
    desired: PodStatus = {}
    desired.update(clone({f: provider_status[f] for f in OWNED_FIELDS if f in provider_status}))  # type: ignore[typeddict-item,literal-required]
    desired["hostIP"] = host_ip
    desired["hostIPs"] = [{"ip": host_ip}]
    if "startTime" not in desired and current.get("startTime"):
        desired["startTime"] = current["startTime"]
    old = _conditions_by_type(current)
    conditions: list[PodCondition] = []
    provided = _conditions_by_type(provider_status)
    terminal = provider_status.get("phase") in TERMINAL_PHASES
    owned = OWNED_CONDITIONS | ({DISRUPTION} if terminal and DISRUPTION in provided else set())
    owned |= {t for t in (*provided, *old) if t.startswith(PROVIDER_CONDITION_PREFIX)}
    for ctype, cond in provided.items():
        if ctype not in owned:
            continue
        merged: PodCondition = dict(cond)  # type: ignore[assignment]
        prior = old.get(ctype)
        if prior and prior.get("status") == cond.get("status") and prior.get("lastTransitionTime"):
            merged["lastTransitionTime"] = prior["lastTransitionTime"]
        conditions.append(merged)
    for ctype, cond in old.items():
        if ctype not in owned:
            conditions.append(cond)
    desired["conditions"] = sorted(conditions, key=lambda c: c.get("type", ""))
    return desired


def disrupted(status: PodStatus) -> bool:
    """A terminal status that says the pod was taken away (a DisruptionTarget condition)."""
    return status.get("phase") in TERMINAL_PHASES and any(
        c.get("type") == DISRUPTION and c.get("status") == "True" for c in status.get("conditions", [])
    )


def _comparable(status: PodStatus) -> dict[str, Any]:
    out: dict[str, Any] = {f: status.get(f) for f in OWNED_FIELDS}
    out["conditions"] = sorted(
        ((c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions", [])),
        key=lambda t: str(t[0]),
    )
    return out


def status_differs(current: PodStatus, desired: PodStatus) -> bool:
    return _comparable(current) != _comparable(desired)


def status_patch(current: PodStatus, desired: PodStatus) -> dict[str, Any]:
    """A merge patch of the status subresource: owned fields replaced (null when gone) and the
    whole conditions list written back, other writers' conditions included as read."""
    patch: dict[str, Any] = {}
    for field in OWNED_FIELDS:
        if field in desired:
            patch[field] = desired[field]  # type: ignore[literal-required]
        elif field in current:
            patch[field] = None
    patch["conditions"] = desired.get("conditions", [])
    return {"status": patch}


def annotation_changes(current: dict[str, str] | None, wanted: dict[str, str | None]) -> dict[str, str | None]:
    """The part of `wanted` the pod does not show yet, as merge-patch values (None removes)."""
    current = current or {}
    return {k: v for k, v in wanted.items() if current.get(k) != v and (v is not None or k in current)}


def _terminated(pod: Pod, *, exit_code: int, reason: str, message: str) -> list[ContainerStatus]:
    previous = {c.get("name"): c for c in pod.get("status", {}).get("containerStatuses", [])}
    out: list[ContainerStatus] = []
    for container in pod["spec"].get("containers", []):
        name = container.get("name", "")
        old = previous.get(name, {})
        started = old.get("state", {}).get("running", {}).get("startedAt")
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "message": message}
        terminated["finishedAt"] = now_rfc3339()
        if started:
            terminated["startedAt"] = started
        out.append(
            {
                "name": name,
                "image": container.get("image", ""),
                "imageID": old.get("imageID", ""),
                "ready": False,
                "started": False,
                "restartCount": old.get("restartCount", 0),
                "state": {"terminated": terminated},
            }
        )
    return out


def failed_status(pod: Pod, *, reason: str, message: str, exit_code: int = 137) -> PodStatus:
    """Failed with a reason: for pods lost or evicted on the provider side."""
    now = now_rfc3339()
    status: PodStatus = {
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "containerStatuses": _terminated(pod, exit_code=exit_code, reason=reason, message=message),
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastTransitionTime": now},
        ],
    }
    start = pod.get("status", {}).get("startTime")
    if start:
        status["startTime"] = start
    return status


def deleted_status(pod: Pod, provided: PodStatus | None, *, host_ip: str) -> PodStatus:
    """The terminal status a deleted pod is given before it goes, as the kubelet gives it (so a Job
    that waits for its pods to fail, podReplacementPolicy Failed or a podFailurePolicy, counts it
    and drops its finalizer): the provider's own if the pod ended there, else Failed with its
    containers' exit not known."""
    if provided and provided.get("phase") in TERMINAL_PHASES:
        return desired_status(pod, provided, host_ip=host_ip)
    status = failed_status(pod, reason="ContainerStatusUnknown", message=DELETED)
    del status["reason"], status["message"]  # the kubelet names no pod-level reason for a deletion
    return status


def provider_failed_status(pod: Pod, message: str) -> PodStatus:
    """A create the provider refused: Pending (retried) or, with restartPolicy Never, Failed."""
    never = pod["spec"].get("restartPolicy") == "Never"
    status: PodStatus = {"phase": "Failed" if never else "Pending", "reason": "ProviderFailed", "message": message}
    if never:
        status["containerStatuses"] = _terminated(pod, exit_code=1, reason="ProviderFailed", message=message)
    return status
