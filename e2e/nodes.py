"""Simulated nodes: hardware profiles and the Node and NodeResourceTopology objects the lab
creates for members and, on request, for the offline cluster itself (pure builders; KWOK then
keeps the nodes Ready and runs their pods).

Labels follow what real online clusters carry: GPU Feature Discovery's `nvidia.com/gpu.product`,
the well-known zone and region labels, and a network-pod label (several nodes share one network
pod, the unit of "same network" placement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from e2e.components import KWOK_NODE_ANNOTATION

NETWORK_POD_LABEL = "vkprovider.io/network-pod"
PROFILE_LABEL = "vkprovider.io/lab-profile"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
#: What a node's capacity is: the offline cluster's own nodes carry `native` (hybrid jobs put
#: some pods there and the rest on a virtual node); members' nodes do not carry it.
CAPACITY_LABEL = "vkprovider.io/capacity"
NATIVE_CAPACITY = "native"
KUBELET_VERSION = "v1.37.2"
#: The node annotation metrics-server reads for the path of a kubelet's resource metrics.
RESOURCE_METRICS_PATH = "metrics.k8s.io/resource-metrics-path"


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One machine type. Allocatable is capacity less a system reserve, as kubelets report it."""

    name: str
    cpu: int  # cores
    memory_gi: int
    numa: int
    gpus: int = 0
    gpu_product: str | None = None
    reserved_cpu_m: int = 1000
    reserved_memory_gi: int = 8
    pods: int = 110


PROFILES: dict[str, Profile] = {
    "cpu": Profile(name="cpu", cpu=96, memory_gi=384, numa=2),
    "gpu-v100": Profile(name="gpu-v100", cpu=80, memory_gi=512, numa=2, gpus=8, gpu_product="Tesla-V100-SXM2-32GB"),
    "gpu-t4": Profile(name="gpu-t4", cpu=64, memory_gi=256, numa=2, gpus=4, gpu_product="Tesla-T4"),
}

#: Profiles of member-1, member-2, member-3 by default; further members cycle.
DEFAULT_MEMBER_PROFILES = ("cpu", "gpu-v100", "gpu-t4")
NODES_PER_NETWORK_POD = 5
ZONES = ("a", "b")


def member_profile(index: int) -> str:
    """Profile of member number `index` (1-based) when none is given."""
    return DEFAULT_MEMBER_PROFILES[(index - 1) % len(DEFAULT_MEMBER_PROFILES)]


def node_name(cluster: str, index: int) -> str:
    return f"{cluster}-node-{index:03d}"


def network_pod(cluster: str, index: int) -> str:
    return f"{cluster}-np{index // NODES_PER_NETWORK_POD}"


def node_ip(member_index: int, index: int) -> str:
    # Every simulated node is at 127.0.0.1: the apiserver proxies `kubectl logs` and `exec` to a
    # node's address and port (daemonEndpoints), where KWOK's kubelet server listens for all of
    # them. It listens on loopback only: it runs commands on this machine for `exec`.
    del member_index, index
    return "127.0.0.1"


def resources(profile: Profile) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of one node."""
    capacity = {
        "cpu": str(profile.cpu),
        "memory": f"{profile.memory_gi}Gi",
        "pods": str(profile.pods),
        "ephemeral-storage": "1Ti",
    }
    allocatable = {
        "cpu": f"{profile.cpu * 1000 - profile.reserved_cpu_m}m",
        "memory": f"{profile.memory_gi - profile.reserved_memory_gi}Gi",
        "pods": str(profile.pods),
        "ephemeral-storage": "1000Gi",
    }
    if profile.gpus:
        capacity[GPU_RESOURCE] = allocatable[GPU_RESOURCE] = str(profile.gpus)
    return capacity, allocatable


def build_node(
    *,
    cluster: str,
    member_index: int,
    index: int,
    profile: Profile,
    extra_labels: Mapping[str, str] | None = None,
    kubelet_port: int | None = None,
) -> dict[str, Any]:
    """One node; `member_index` picks its address and pod CIDR block (0 for the offline cluster).
    With `kubelet_port`, the apiserver proxies `pods/log` (and the streams) to that port: KWOK's
    kubelet server, which answers for every node it manages."""
    name = node_name(cluster, index)
    capacity, allocatable = resources(profile)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": profile.name,
        "topology.kubernetes.io/region": cluster,
        "topology.kubernetes.io/zone": f"{cluster}-{ZONES[index % len(ZONES)]}",
        NETWORK_POD_LABEL: network_pod(cluster, index),
        PROFILE_LABEL: profile.name,
        "type": "kwok",
    }
    if profile.gpu_product:
        labels[GPU_PRODUCT_LABEL] = profile.gpu_product
        labels["nvidia.com/gpu.count"] = str(profile.gpus)
        labels["nvidia.com/gpu.present"] = "true"
    labels.update(extra_labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION: "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                # Where metrics-server finds this node's resource metrics on KWOK's server
                # (e2e/kwok/metrics.yaml), which answers for every node it manages.
                RESOURCE_METRICS_PATH: f"/metrics/nodes/{name}/metrics/resource",
            },
        },
        "spec": {
            "podCIDR": f"10.{100 + member_index}.{index}.0/24",
            "podCIDRs": [f"10.{100 + member_index}.{index}.0/24"],
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": [
                {"type": "InternalIP", "address": node_ip(member_index, index)},
                {"type": "Hostname", "address": name},
            ],
            **({"daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}}} if kubelet_port else {}),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "kwok",
                "kernelVersion": "6.1.0-lab",
                "osImage": "vkprovider lab (kwok)",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        },
    }


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def build_node_topology(*, node: str, profile: Profile) -> dict[str, Any]:
    """The NodeResourceTopology an exporter (NFD topology-updater) would publish for the node:
    one zone per NUMA cell with its share of CPUs, memory and GPUs."""
    cpus = _split(profile.cpu * 1000 - profile.reserved_cpu_m, profile.numa)
    memory = _split((profile.memory_gi - profile.reserved_memory_gi) * 1024, profile.numa)
    gpus = _split(profile.gpus, profile.numa)
    zones = []
    for cell in range(profile.numa):
        per_cell_cpu = profile.cpu // profile.numa
        zone_resources = [
            {
                "name": "cpu",
                "capacity": str(per_cell_cpu),
                "allocatable": f"{cpus[cell]}m",
                "available": f"{cpus[cell]}m",
            },
            {
                "name": "memory",
                "capacity": f"{profile.memory_gi * 1024 // profile.numa}Mi",
                "allocatable": f"{memory[cell]}Mi",
                "available": f"{memory[cell]}Mi",
            },
        ]
        if profile.gpus:
            n = str(gpus[cell])
            zone_resources.append({"name": GPU_RESOURCE, "capacity": n, "allocatable": n, "available": n})
        zones.append(
            {
                "name": f"node-{cell}",
                "type": "Node",
                "costs": [
                    {"name": f"node-{other}", "value": 10 if other == cell else 20} for other in range(profile.numa)
                ],
                "resources": zone_resources,
            }
        )
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    }
