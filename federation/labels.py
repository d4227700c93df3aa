"""Labels and annotations the federation provider reads and writes (ours live under vkprovider.io/),
and the path of its own API: the vocabulary every package of federation/ shares, so none of them
imports another's module for a name."""

from __future__ import annotations

from collections.abc import Mapping

#: On every object we create in a member: marks it as offloaded work, not online load.
MANAGED = "vkprovider.io/managed"
#: Which provider instance (its virtual node's name) made an object in a member; also the label
#: of that instance's virtual nodes, which the routing webhook selects.
INSTANCE = "vkprovider.io/instance"
#: Which front end made an object in a member: the UID of its kube-system namespace. Two offline
#: clusters may both name their node vk-pool; with this label neither takes the other's pods.
FRONT_END = "vkprovider.io/front-end"
#: On member pods (federation.dispatch.forge writes them): the front-end pod each one runs,
#: its UID, namespace and name.
ORIGIN_UID = "vkprovider.io/origin-uid"
ORIGIN_NAMESPACE = "vkprovider.io/origin-namespace"
ORIGIN_NAME = "vkprovider.io/origin-name"
#: Label on member pods: their job, as a hash (federation.jobs.job_hash).
JOB_LABEL = "vkprovider.io/job"
#: Annotation on member pods: their job's key (kind, namespace, name).
JOB_KEY = "vkprovider.io/job-key"
#: The member a front-end pod (or its job's group object) is pinned to; on per-member virtual
#: nodes, the member behind the node.
MEMBER = "vkprovider.io/member"
#: On ConfigMaps, Secrets and Services copied into a member for our pods.
REFLECTED = "vkprovider.io/reflected"
#: Member node labels the shapes are grouped by (configurable per member; these are the defaults).
GPU_PRODUCT = "nvidia.com/gpu.product"
#: Member node label (the default key): the network pod (a high-bandwidth domain) a node is in.
NETWORK_POD = "vkprovider.io/network-pod"
ZONE = "topology.kubernetes.io/zone"
#: Colocation stacks' reclaimable resources, and the canonical resource each stands for.
COLOCATION_RESOURCES = {
    "kubernetes.io/batch-cpu": "cpu",  # Koordinator, in millicores
    "kubernetes.io/batch-memory": "memory",  # Koordinator, bytes
    "resource.katalyst.kubewharf.io/reclaimed_millicpu": "cpu",  # Katalyst, millicores
    "resource.katalyst.kubewharf.io/reclaimed_memory": "memory",  # Katalyst, bytes
}

#: Reclaim (federation.reclaim): the RFC 3339 deadline of a checkpoint notice, on the front-end
#: and member pod (readable through a downward-API volume).
RECLAIM_AT = "vkprovider.io/reclaim-at"
#: Why the pod was chosen for reclaim, on both pods beside its deadline.
RECLAIM_REASON = "vkprovider.io/reclaim-reason"
#: On a job's remaining pods after some were taken away: `{"at": ..., "count": N}` of the last reclaim.
LAST_RECLAIM = "vkprovider.io/last-reclaim"
#: When the notice was given (RFC 3339), on both pods: the start its period and any extension
#: count from, after a restart too.
RECLAIM_NOTICED_AT = "vkprovider.io/reclaim-noticed-at"
#: On every pod of a job with pods under notice, native ones included: which pods leave and
#: when (JSON), so an elastic trainer can re-form before SIGTERM.
RECLAIM_NOTICE = "vkprovider.io/reclaim-notice"
#: Notice period a pod (or its job's PodGroup) asks for, in seconds.
CHECKPOINT_SECONDS = "vkprovider.io/checkpoint-seconds"
#: Set by the workload on its front-end pod under notice (RFC 3339): its checkpoint is written,
#: release the pod now.
CHECKPOINTED_AT = "vkprovider.io/checkpointed-at"
#: Set by the workload on its front-end pod under notice: seconds more its checkpoint needs
#: (up to the member's maximum notice).
CHECKPOINT_EXTEND = "vkprovider.io/checkpoint-extend"
#: On a gang's front-end pods: the job was told GangIncomplete (once, across restarts).
GANG_INCOMPLETE_TOLD = "vkprovider.io/gang-incomplete-told"
#: On a front-end pod ended by a disruption: its job was told (PodsReclaimed, last-reclaim).
JOB_TOLD = "vkprovider.io/job-told"
#: A hybrid job's policy when its virtual part falls below the gang minimum: "keep" (report
#: only, the default) or "end" (its native pods are ended too), on the PodGroup or the pods.
SPLIT_GANG = "vkprovider.io/split-gang"
#: On member pods: the pod's band, so a restarted provider can plan without the front end.
BAND = "vkprovider.io/band"
#: On member pods: its job's gang minimum, for the same reason.
GANG_MIN = "vkprovider.io/gang-min"
#: The ReplicaSet controller's hint; the planner uses it as a tie-breaker.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

#: MemberCluster objects in the front end (federation/crds/memberclusters.yaml).
MEMBERS_PATH = "/apis/vkprovider.io/v1alpha1/memberclusters"
#: A tenant's member namespaces are recorded in a ConfigMap of this name in its home namespace
#: (it may not list namespaces): written by federation.tenancy, read by members and the drain.
TENANT_REGISTRY = "vkprovider-namespaces"


def tenant_home(tenant: str) -> str:
    """A tenant's home namespace in a member (its account, token binding and registry)."""
    return f"vkprovider-tenant-{tenant}"


def tenant_registry(tenant: str) -> str:
    """The path of a tenant's registry of member namespaces."""
    return f"/api/v1/namespaces/{tenant_home(tenant)}/configmaps/{TENANT_REGISTRY}"


class Owner:
    """Who made an object in a member: one provider instance of one front end. The instance is
    known from the settings, the front end once the provider reaches it (`identify`); objects
    are made only after that, and carry both."""

    def __init__(self, instance: str, front_end: str = "") -> None:
        self.instance = instance
        self.front_end = front_end

    def identify(self, front_end: str) -> None:
        self.front_end = front_end

    def labels(self) -> dict[str, str]:
        """The labels every object we make in a member carries (and our watches select)."""
        out = {MANAGED: "true", INSTANCE: self.instance}
        if self.front_end:
            out[FRONT_END] = self.front_end
        return out

    def selector(self, extra: Mapping[str, str] | None = None) -> str:
        """A label selector of our objects, narrowed by `extra` (label key -> value)."""
        return ",".join(f"{k}={v}" for k, v in {**self.labels(), **(extra or {})}.items())

    def owns(self, object_labels: Mapping[str, str]) -> bool:
        return all(object_labels.get(k) == v for k, v in self.labels().items())

    @property
    def key(self) -> str:
        """The owner as one string, as `owner_key` reads it off an object."""
        return f"{self.front_end}/{self.instance}"

    def __repr__(self) -> str:
        return f"Owner({self.instance!r}, {self.front_end!r})"


def owner_key(object_labels: Mapping[str, str]) -> str | None:
    """The key of whoever made an object (None: not made by any provider, online work)."""
    if object_labels.get(MANAGED) != "true":
        return None
    return f"{object_labels.get(FRONT_END, '')}/{object_labels.get(INSTANCE, '')}"
