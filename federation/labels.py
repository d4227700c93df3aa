"""Labels and annotations the federation provider reads and writes (ours live under vkprovider.io/)."""

from __future__ import annotations

#: On every pod we create in a member: marks it as ours (offloaded), not online load.
MANAGED = "vkprovider.io/managed"
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
