"""Pure translation between the front end and a member: a front-end pod to the member pod that
runs it, a job's gang to the member's gang object, and a member pod's status back.

To the member:
- namespace by the member's mapping; the same pod name (rendezvous names keep working);
- identity labels and annotations under vkprovider.io/ (front-end pod uid, job, member, owner:
  the provider instance and its front end);
- stripped: nodeName, the virtual node's tolerations and selectors, scheduling gates, front-end
  gang keys and service-account token volumes (the member's own account is used instead);
- schedulerName of the member; priority in the member's offline band, by role (federation.bands);
- the pod's band, its job's gang minimum and notice period as annotations (for reclaim);
- colocation resource names when the member lends through a colocation stack;
- NUMA and topology annotations, and Guaranteed integer CPUs, untouched;
- the member's gang keys, and "Same" constraints as the gang's topology or a nodeSelector.
Back: phase, conditions, container statuses, pod IP, start time, reason and message.
"""

from __future__ import annotations

from typing import Any

from federation import bands, labels
from federation.capacity import quantities
from federation.dispatch.placement import Placement
from federation.jobs import GangSpec, JobRef, job_hash
from vkprovider.objects import Pod, PodStatus

VIRTUAL_TOLERATION_KEYS = ("virtual-kubelet.io/provider",)
VIRTUAL_SELECTOR_PREFIXES = ("vkprovider.io/", "gpu.vkprovider.io/")
FRONT_GANG_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
FRONT_GANG_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
COLOCATION_NAMES = {"cpu": "kubernetes.io/batch-cpu", "memory": "kubernetes.io/batch-memory"}


def gang_role(roles: list[str]) -> str:
    """The role whose class a gang's core shares: the highest among its pods."""
    return max(roles, key=lambda r: bands.RANK.get(r, 2), default=bands.DEFAULT)


def gang_name(job: JobRef) -> str:
    return f"vkp-{job_hash(job)}"


def member_namespace(namespace: str, prefix: str) -> str:
    return f"{prefix}{namespace}"[:63]


def _translate_resources(resources: dict[str, Any], colocation: bool) -> dict[str, Any]:
    if not colocation:
        return resources
    out: dict[str, Any] = {}
    for kind in ("requests", "limits"):
        values = dict(resources.get(kind) or {})
        for name, batch in COLOCATION_NAMES.items():
            if name in values:
                quantity = values.pop(name)
                # Koordinator counts batch-cpu in millicores, batch-memory in bytes.
                values[batch] = str(quantities.to_canonical(name, quantity))
        if values:
            out[kind] = values
    return out


def _strip_token_volumes(spec: dict[str, Any]) -> None:
    """Drop projected service-account token volumes: front-end tokens mean nothing there."""
    tokens = {
        v["name"]
        for v in spec.get("volumes") or []
        if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])
    }
    if not tokens:
        return
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in tokens]
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") not in tokens]
            container["volumeMounts"] = mounts


def to_member(
    pod: Pod,
    *,
    job: JobRef,
    gang: GangSpec,
    role: str,
    member: str,
    owner: labels.Owner,
    namespace_prefix: str,
    gang_api: str,
    scheduler_name: str,
    service_account: str,
    colocation: bool,
    placement: Placement | None,
    network_pod_label: str,
    in_gang: bool = True,
    gang_role: str | None = None,
) -> dict[str, Any]:
    """The member pod that runs `pod`. Pods of the gang's core share the gang's priority class
    (`gang_role`; the native gang refuses mixed priorities); elastic pods beyond the minimum
    join no gang and keep their own role's class."""
    meta = pod["metadata"]
    # Copied only where changed below (the spec and its containers; lists replaced, not edited):
    # the rest is shared with the front-end pod, which nothing here or after writes to. A deep
    # copy of every spec was about 2 % of the provider's CPU per dispatched pod.
    spec = dict(pod["spec"])
    for group in ("containers", "initContainers"):
        if spec.get(group):
            spec[group] = [dict(container) for container in spec[group]]
    for field in ("nodeName", "schedulingGates", "schedulingGroup", "priority", "preemptionPolicy", "overhead"):
        spec.pop(field, None)
    spec["tolerations"] = [t for t in spec.get("tolerations") or [] if t.get("key") not in VIRTUAL_TOLERATION_KEYS]
    selector = {
        k: v
        for k, v in (spec.get("nodeSelector") or {}).items()
        if not k.startswith(VIRTUAL_SELECTOR_PREFIXES) and k not in ("type", "kubernetes.io/hostname")
    }
    if placement is not None and placement.network_pod and not (gang_api == "native" and gang.is_gang):
        selector[network_pod_label] = placement.network_pod
    model = gang.gpu_model or (placement.gpu_model if placement else None)
    if model:
        selector[labels.GPU_PRODUCT] = model
    spec["nodeSelector"] = selector
    spec.pop("nodeName", None)
    spec["schedulerName"] = "volcano" if gang_api == "volcano" and gang.is_gang else scheduler_name
    in_gang = in_gang and gang.is_gang
    effective_role = gang_role if in_gang and gang_role else role
    spec["priorityClassName"] = bands.class_name(effective_role)
    spec["serviceAccountName"] = service_account
    spec.pop("serviceAccount", None)
    spec["automountServiceAccountToken"] = False
    _strip_token_volumes(spec)
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            if "resources" in container:
                container["resources"] = _translate_resources(container["resources"], colocation)
    member_labels = {
        k: v for k, v in (meta.get("labels") or {}).items() if k not in FRONT_GANG_LABELS and k != labels.JOB_LABEL
    }
    member_labels.update({**owner.labels(), labels.ORIGIN_UID: meta.get("uid", ""), labels.JOB_LABEL: job_hash(job)})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in FRONT_GANG_ANNOTATIONS}
    annotations.update(
        {
            labels.ORIGIN_NAMESPACE: meta.get("namespace", ""),
            labels.ORIGIN_NAME: meta.get("name", ""),
            labels.JOB_KEY: job.key,
            labels.MEMBER: member,
            # What a restarted provider's reclaim planner needs without the front end.
            labels.BAND: role,
            labels.GANG_MIN: str(gang.min_member if gang.is_gang else 0),
        }
    )
    if gang.checkpoint_seconds and labels.CHECKPOINT_SECONDS not in annotations:
        annotations[labels.CHECKPOINT_SECONDS] = f"{gang.checkpoint_seconds:g}"
    if in_gang:
        name = gang_name(job)
        if gang_api == "native":
            spec["schedulingGroup"] = {"podGroupName": name}
        elif gang_api == "scheduler-plugins":
            member_labels["scheduling.x-k8s.io/pod-group"] = name
        else:
            annotations["scheduling.k8s.io/group-name"] = name
            annotations["scheduling.volcano.sh/group-name"] = name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.get("name"),
            "namespace": member_namespace(meta.get("namespace", ""), namespace_prefix),
            "labels": member_labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def gang_object(
    job: JobRef,
    gang: GangSpec,
    *,
    namespace: str,
    gang_api: str,
    placement: Placement | None,
    network_pod_label: str,
    owner: labels.Owner,
    role: str = "worker-min",
) -> dict[str, Any]:
    """The member's gang object, created before the pods so its scheduler keeps the gang."""
    meta = {
        "name": gang_name(job),
        "namespace": namespace,
        "labels": {**owner.labels(), labels.JOB_LABEL: job_hash(job)},
        "annotations": {labels.JOB_KEY: job.key},
    }
    if gang_api == "native":
        spec: dict[str, Any] = {
            "schedulingPolicy": {"gang": {"minCount": gang.min_member}},
            "priorityClassName": bands.class_name(role),
        }
        key = network_pod_label if gang.same_network else gang.topology_key
        if key:
            spec["schedulingConstraints"] = {"topology": [{"key": key}]}
        return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": spec}
    if gang_api == "scheduler-plugins":
        spec = {"minMember": gang.min_member, "scheduleTimeoutSeconds": int(gang.timeout)}
        return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta, "spec": spec}
    spec = {
        "minMember": gang.min_member,
        "queue": "default",
        "priorityClassName": bands.class_name(role),
    }
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": spec}


GANG_PATHS = {
    "native": ("scheduling.k8s.io/v1beta1", "podgroups"),
    "scheduler-plugins": ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
    "volcano": ("scheduling.volcano.sh/v1beta1", "podgroups"),
}

STATUS_FIELDS = (
    "phase",
    "reason",
    "message",
    "containerStatuses",
    "initContainerStatuses",
    "podIP",
    "podIPs",
    "startTime",
)
#: DisruptionTarget is not mapped here: federation.members.disruption writes it with the terminal phase.
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")


def status_from_member(member_pod: dict[str, Any]) -> PodStatus:
    """The front-end status of a pod from its member pod (hostIP is the runtime's to set). Nested
    values are the member pod's own, not copies: the runtime copies what it keeps
    (vkprovider.podstatus.desired_status); a copy here as well copied every status twice."""
    status = member_pod.get("status") or {}
    out: dict[str, Any] = {k: status[k] for k in STATUS_FIELDS if k in status}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") in OWN_CONDITIONS]
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if not member_pod.get("spec", {}).get("nodeName") and out.get("phase", "Pending") == "Pending":
        message = (scheduled or {}).get("message") or "waiting for the member's scheduler"
        out["reason"] = "MemberScheduling"
        out["message"] = message[:500]
    out["conditions"] = conditions
    return out  # type: ignore[return-value]


def waiting_status(*, bound: int, minimum: int, native: int = 0) -> PodStatus:
    where = f" ({native} on native nodes)" if native else ""
    message = f"{bound} of {minimum} pods of the gang are bound{where}; the gang leaves for a member when all are"
    return {
        "phase": "Pending",
        "reason": "WaitingForGang",
        "message": message,
        "conditions": [{"type": "Ready", "status": "False", "reason": "WaitingForGang", "message": message}],
    }


#: A complete gang no member can take now: it waits whole at the front end (the reason on its
#: pods, and its Event's).
NO_ROOM = "NoMemberFits"


def no_room_status(message: str) -> PodStatus:
    return {
        "phase": "Pending",
        "reason": NO_ROOM,
        "message": message[:1000],
        "conditions": [{"type": "Ready", "status": "False", "reason": NO_ROOM, "message": message[:1000]}],
    }
