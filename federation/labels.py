"""Labels and annotations the federation provider reads and writes (ours live under vkprovider.io/),
and the path of its own API: the vocabulary every package of federation/ shares, so none of them
imports another's module for a name."""

from __future__ import annotations

#: On every pod we create in a member: marks it as ours (offloaded), not online load.
MANAGED = "vkprovider.io/managed"
#: Which provider instance (its virtual node's name) made an object in a member; also the label
#: of that instance's virtual nodes, which the routing webhook selects.
INSTANCE = "vkprovider.io/instance"
#: On member pods (federation.dispatch.forge writes them): the front-end pod each one runs.
ORIGIN_UID = "vkprovider.io/origin-uid"
ORIGIN_NAMESPACE = "vkprovider.io/origin-namespace"
ORIGIN_NAME = "vkprovider.io/origin-name"
#: On member pods: their job (label: a hash, federation.jobs.job_hash; annotation: the key).
JOB_LABEL = "vkprovider.io/job"
JOB_KEY = "vkprovider.io/job-key"
#: The member a front-end pod (or its job's group object) is pinned to; on per-member virtual
#: nodes, the member behind the node.
MEMBER = "vkprovider.io/member"
#: On ConfigMaps, Secrets and Services copied into a member for our pods.
REFLECTED = "vkprovider.io/reflected"
#: Member node labels the shapes are grouped by (configurable per member; these are the defaults).
GPU_PRODUCT = "nvidia.com/gpu.product"
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
#: and member pod (readable through a downward-API volume), and the last reclaim a job saw.
RECLAIM_AT = "vkprovider.io/reclaim-at"
RECLAIM_REASON = "vkprovider.io/reclaim-reason"
LAST_RECLAIM = "vkprovider.io/last-reclaim"
#: Notice period a pod (or its job's PodGroup) asks for, in seconds.
CHECKPOINT_SECONDS = "vkprovider.io/checkpoint-seconds"
#: On member pods: the pod's band and its job's gang minimum, so a restarted provider can plan
#: without the front end.
BAND = "vkprovider.io/band"
GANG_MIN = "vkprovider.io/gang-min"
#: The ReplicaSet controller's hint; the planner uses it as a tie-breaker.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

#: MemberCluster objects in the front end (federation/crds/memberclusters.yaml).
MEMBERS_PATH = "/apis/vkprovider.io/v1alpha1/memberclusters"
