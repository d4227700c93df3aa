"""Which job a pod belongs to, and that job's gang (pure).

The job is read, in order, from: the native PodGroup (`spec.schedulingGroup.podGroupName`),
scheduler-plugins (label `scheduling.x-k8s.io/pod-group`), Volcano (annotation
`scheduling.k8s.io/group-name` or `scheduling.volcano.sh/group-name`), Koordinator (label
`pod-group.scheduling.sigs.k8s.io` or annotation `gang.scheduling.koordinator.sh/name`), Kueue pod
groups (`kueue.x-k8s.io/pod-group-name`), JobSet (label `jobset.sigs.k8s.io/jobset-name`: every
replicated Job of one JobSet is one job), else the controlling owner; a bare pod is its own job.
The gang minimum, timeout and constraints come from that source (the group object where it
has one). Roles come from the priority band or a role label.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from federation import bands, labels

NATIVE = "native"
SCHEDULER_PLUGINS = "scheduler-plugins"
VOLCANO = "volcano"
KOORDINATOR = "koordinator"
KUEUE = "kueue"
JOBSET = "jobset"
OWNER = "owner"
POD = "pod"

SP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
KOORD_LABEL = "pod-group.scheduling.sigs.k8s.io"
KOORD_NAME = "gang.scheduling.koordinator.sh/name"
KOORD_MIN = "gang.scheduling.koordinator.sh/min-available"
KOORD_WAIT = "gang.scheduling.koordinator.sh/waiting-time"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"

#: Our annotations (on the group object or the pods) asking for "Same" placement: `"true"` keeps the
#: job in one network pod, or on one GPU model.
SAME_NETWORK = "vkprovider.io/same-network-pod"
SAME_GPU_MODEL = "vkprovider.io/same-gpu-model"
#: Annotation on the group object or the pods: the GPU model (`nvidia.com/gpu.product`) the job needs.
GPU_MODEL = "vkprovider.io/gpu-model"
#: Annotation on the group object or the pods: seconds a member may take to bind the gang (300).
GANG_TIMEOUT = "vkprovider.io/gang-timeout-seconds"
ROLE_LABEL = bands.ROLE_LABEL

#: The group object each source keeps, as (apiVersion, plural).
GROUP_RESOURCES = {
    NATIVE: ("scheduling.k8s.io/v1beta1", "podgroups"),
    SCHEDULER_PLUGINS: ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
    VOLCANO: ("scheduling.volcano.sh/v1beta1", "podgroups"),
    JOBSET: ("jobset.x-k8s.io/v1alpha2", "jobsets"),
}

DEFAULT_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job: where its identity came from and its name, unique within the namespace."""

    namespace: str
    source: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.source}/{self.name}"

    @classmethod
    def parse(cls, key: str) -> JobRef:
        """The job a key names (the inverse of `key`; member pods carry it as an annotation)."""
        namespace, source, name = [*key.split("/", 2), "", ""][:3]
        return cls(namespace, source, name)


@dataclass(frozen=True, slots=True)
class GangSpec:
    min_member: int = 1
    timeout: float = DEFAULT_TIMEOUT
    same_network: bool = False
    same_gpu_model: bool = False
    gpu_model: str | None = None
    topology_key: str | None = None  # the native group's own topology constraint, if any
    checkpoint_seconds: float | None = None  # the notice period the job's group object asks for

    @property
    def is_gang(self) -> bool:
        return self.min_member > 1


def job_hash(job: JobRef) -> str:
    """A label-safe stand-in for a job key (labels hold 63 characters): the job label of its
    member pods (federation.labels.JOB_LABEL)."""
    return hashlib.sha256(job.key.encode()).hexdigest()[:16]


def job_of(pod: dict[str, Any]) -> JobRef:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = meta.get("namespace") or ""
    pod_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if group:
        return JobRef(namespace, NATIVE, group)
    if pod_labels.get(SP_LABEL):
        return JobRef(namespace, SCHEDULER_PLUGINS, pod_labels[SP_LABEL])
    for key in VOLCANO_ANNOTATIONS:
        if annotations.get(key):
            return JobRef(namespace, VOLCANO, annotations[key])
    koord = pod_labels.get(KOORD_LABEL) or annotations.get(KOORD_NAME)
    if koord:
        return JobRef(namespace, KOORDINATOR, koord)
    kueue = pod_labels.get(KUEUE_GROUP) or annotations.get(KUEUE_GROUP)
    if kueue:
        return JobRef(namespace, KUEUE, kueue)
    if pod_labels.get(JOBSET_LABEL):
        return JobRef(namespace, JOBSET, pod_labels[JOBSET_LABEL])
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller"):
            return JobRef(namespace, OWNER, f"{owner.get('kind', '')}/{owner.get('name', '')}")
    return JobRef(namespace, POD, meta.get("name", ""))


def _flag(*maps: dict[str, str], key: str) -> bool:
    return any((m.get(key) or "").lower() == "true" for m in maps)


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def gang_of(job: JobRef, pod: dict[str, Any], group: dict[str, Any] | None) -> GangSpec:
    """The gang of `job` from its group object (if the source has one) and a member pod."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    group_annotations = ((group or {}).get("metadata") or {}).get("annotations") or {}
    group_spec = (group or {}).get("spec") or {}
    timeout = _number(group_annotations.get(GANG_TIMEOUT) or annotations.get(GANG_TIMEOUT), DEFAULT_TIMEOUT)
    minimum = 1
    topology_key = None
    if job.source == NATIVE:
        minimum = int(((group_spec.get("schedulingPolicy") or {}).get("gang") or {}).get("minCount") or 1)
        topology = (group_spec.get("schedulingConstraints") or {}).get("topology") or []
        topology_key = topology[0].get("key") if topology else None
    elif job.source in (SCHEDULER_PLUGINS, VOLCANO):
        minimum = int(group_spec.get("minMember") or 1)
        if job.source == SCHEDULER_PLUGINS and group_spec.get("scheduleTimeoutSeconds"):
            timeout = _number(group_spec["scheduleTimeoutSeconds"], timeout)
    elif job.source == KOORDINATOR:
        minimum = int(_number(annotations.get(KOORD_MIN), 1))
        wait = annotations.get(KOORD_WAIT)
        if wait:
            timeout = _number(wait.rstrip("s"), timeout)
    elif job.source == KUEUE:
        minimum = int(_number(annotations.get(KUEUE_TOTAL), 1))
    elif job.source == JOBSET:
        minimum = jobset_pods(group_spec)
    return GangSpec(
        min_member=max(1, minimum),
        timeout=timeout,
        same_network=_flag(group_annotations, annotations, key=SAME_NETWORK),
        same_gpu_model=_flag(group_annotations, annotations, key=SAME_GPU_MODEL),
        gpu_model=group_annotations.get(GPU_MODEL) or annotations.get(GPU_MODEL),
        topology_key=topology_key,
        checkpoint_seconds=_number(group_annotations.get(labels.CHECKPOINT_SECONDS), 0) or None,
    )


def jobset_pods(spec: dict[str, Any]) -> int:
    """The pods of a JobSet that run at once: each replicated Job's replicas times the pods its
    Job runs at once (parallelism, no more than its completions), as Kueue counts a JobSet's pod
    sets. A JobSet has no gang field of its own: its leader and workers start together or not at all."""
    total = 0
    for replicated in spec.get("replicatedJobs") or []:
        job = ((replicated.get("template") or {}).get("spec")) or {}
        parallelism = int(_number(job.get("parallelism"), 1))
        completions = int(_number(job.get("completions"), parallelism))
        total += int(_number(replicated.get("replicas"), 1)) * min(parallelism, completions)
    return total


def role_of(pod: dict[str, Any]) -> str:
    """ps, worker-min or worker-max (federation.bands)."""
    return bands.band_of(pod)
