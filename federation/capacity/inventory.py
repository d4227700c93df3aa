"""Compact inventories of a member cluster: per-node and per-pod records holding only what
capacity needs, kept up to date from watch events (pure; no I/O).

Records are small on purpose (a member may have thousands of nodes and tens of thousands of
pods): a pod is its node name, its requests as a shared tuple, and whether it is ours. A node
keeps all its labels and its NoSchedule/NoExecute taints, and a waiting online pod its node
selector, required node affinity and tolerations, as shared tuples of interned strings
(federation.capacity.fit), so reclaim can judge where it fits as the scheduler would. Usage per
node is maintained incrementally, so one pod event costs a few dictionary updates.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from federation import labels
from federation.capacity import fit, quantities
from vkprovider.kube.relist import Relist

Requests = tuple[tuple[str, int], ...]


@dataclass(slots=True)
class NumaZone:
    name: str
    available: dict[str, int]


@dataclass(slots=True)
class NodeRecord:
    name: str
    ready: bool
    schedulable: bool
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) of NoSchedule/NoExecute taints
    allocatable: dict[str, int]
    gpu_product: str | None = None
    network_pod: str | None = None
    zone: str | None = None
    #: All its labels, shared between nodes that carry the same (fit.node_labels: the hostname
    #: left out when it is the node's name); empty where the source does not carry them (the
    #: capacity agent's messages).
    labels: fit.Labels = ()


@dataclass(slots=True)
class PodRecord:
    node: str
    requests: Requests
    owner: str | None  # the provider that made it (federation.labels.owner_key); None: online


@dataclass(slots=True)
class PendingRecord:
    """An online pod that waits for room and will not preempt: what reclaim can make room for."""

    requests: Requests
    priority: int
    constraints: fit.Constraints  # where it may run beside resources (shared between equal ones)
    name: str  # namespace/name, for people reading why a pod of ours was chosen


def waits_without_preempting(obj: dict[str, Any]) -> bool:
    """Unbound, unschedulable for now, and with preemptionPolicy Never: it waits for room."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if spec.get("nodeName") or spec.get("preemptionPolicy") != "Never" or status.get("phase", "Pending") != "Pending":
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def _interned(value: str | None) -> str | None:
    return sys.intern(value) if value else None


def node_record(
    obj: dict[str, Any], *, network_pod_label: str = labels.NETWORK_POD, interner: fit.Interner | None = None
) -> NodeRecord:
    meta = obj.get("metadata") or {}
    node_labels = meta.get("labels") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    shared = interner or fit.Interner()
    name = sys.intern(meta.get("name", ""))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return NodeRecord(
        name=name,
        ready=ready,
        schedulable=not spec.get("unschedulable", False),
        taints=fit.node_taints(spec, shared),
        allocatable=quantities.vector(status.get("allocatable")),
        gpu_product=_interned(node_labels.get(labels.GPU_PRODUCT)),
        network_pod=_interned(node_labels.get(network_pod_label)),
        zone=_interned(node_labels.get(labels.ZONE)),
        labels=fit.node_labels(name, node_labels, shared),
    )


def unusable_reason(node: NodeRecord, tolerations: tuple[dict[str, Any], ...]) -> str | None:
    """Why our pods may not stay on the node (NotReady, cordoned, a taint our pods do not
    tolerate), or None: the reverse of federation.capacity.summary.eligible, in words."""
    if not node.ready:
        return f"node {node.name} is NotReady"
    if not node.schedulable:
        return f"node {node.name} is cordoned"
    for taint in node.taints:
        if not tolerates(tolerations, taint):
            key, value, effect = taint
            return f"node {node.name} has taint {key}{'=' + value if value else ''}:{effect}"
    return None


def _container_requests(container: dict[str, Any]) -> dict[str, int]:
    return quantities.vector((container.get("resources") or {}).get("requests"))


def pod_requests(spec: dict[str, Any]) -> dict[str, int]:
    """Effective requests as the scheduler computes them: containers and sidecars summed, each
    ordinary init container on top of the sidecars started before it, the larger of the two,
    plus the pod overhead."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        total = quantities.add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for init in spec.get("initContainers") or []:
        requests = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            sidecars = quantities.add(sidecars, requests)
            continue
        for name, value in quantities.add(sidecars, requests).items():
            init_peak[name] = max(init_peak.get(name, 0), value)
    total = quantities.add(total, sidecars)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, 0), value)
    total = quantities.add(total, quantities.vector(spec.get("overhead")))
    total[quantities.PODS] = 1
    return total


def tolerates(tolerations: tuple[dict[str, Any], ...], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != effect:
            continue
        operator = tol.get("operator", "Equal")
        if operator == "Exists" and (not tol.get("key") or tol["key"] == key):
            return True
        if operator == "Equal" and tol.get("key") == key and tol.get("value", "") == value:
            return True
    return False


@dataclass
class Inventory:
    """One member's nodes and pods, and per-node usage by online load and by our pods."""

    network_pod_label: str = labels.NETWORK_POD
    #: Whose pods count as ours (federation.labels.Owner.key): another provider's pods hold the
    #: member's capacity as online load does. None: every provider's (one provider per member).
    owner: str | None = None
    #: Also keep what each provider's pods hold per node (`by_owner`): the capacity agent, which
    #: tells each provider its own share.
    track_owners: bool = False
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    numa: dict[str, tuple[NumaZone, ...]] = field(default_factory=dict)
    online_used: dict[str, dict[str, int]] = field(default_factory=dict)
    ours_used: dict[str, dict[str, int]] = field(default_factory=dict)
    by_owner: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    #: Online pods waiting for room without preempting (keyed like `pods`).
    pending: dict[str, PendingRecord] = field(default_factory=dict)
    _shapes: dict[Requests, Requests] = field(default_factory=dict)
    #: Shares equal label sets, taints and pod constraints between records.
    interner: fit.Interner = field(default_factory=fit.Interner, compare=False, repr=False)
    version: int = 0
    #: Per node, the inventory version of its last change (record, usage or NUMA): lets
    #: consumers (the agent's streams) find what changed without comparing whole records.
    node_versions: dict[str, int] = field(default_factory=dict)

    def touch(self, node: str) -> None:
        """Record that something about `node` changed (its record, usage or NUMA zones)."""
        self.version += 1
        self.node_versions[node] = self.version

    # -- nodes -----------------------------------------------------------------------------------

    def upsert_node(self, obj: dict[str, Any]) -> None:
        record = node_record(obj, network_pod_label=self.network_pod_label, interner=self.interner)
        self.nodes[record.name] = record
        self.touch(record.name)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.node_versions.pop(name, None)
        self.version += 1

    def replace_nodes(self, objs: list[dict[str, Any]]) -> None:
        self.nodes = {}
        self.node_versions = {}
        for obj in objs:
            record = node_record(obj, network_pod_label=self.network_pod_label, interner=self.interner)
            self.nodes[record.name] = record
            self.touch(record.name)

    def ours_on_unusable(self, tolerations: tuple[dict[str, Any], ...]) -> bool:
        """Whether any of our pods sits on a node they may not use (`unusable_reason`)."""
        return any(
            unusable_reason(node, tolerations) is not None and any(self.ours_used.get(name, {}).values())
            for name, node in self.nodes.items()
        )

    # -- NUMA ------------------------------------------------------------------------------------

    def upsert_topology(self, obj: dict[str, Any]) -> None:
        zones = []
        for zone in obj.get("zones") or []:
            if zone.get("type") != "Node":
                continue
            available = {
                r["name"]: quantities.to_canonical(r["name"], r.get("available", 0))
                for r in zone.get("resources") or []
            }
            zones.append(NumaZone(zone.get("name", ""), available))
        name = (obj.get("metadata") or {}).get("name", "")
        self.numa[name] = tuple(zones)
        self.touch(name)

    def replace_topologies(self, objs: list[dict[str, Any]]) -> None:
        self.numa = {}
        for obj in objs:
            self.upsert_topology(obj)

    def delete_topology(self, name: str) -> None:
        self.numa.pop(name, None)
        self.touch(name)

    # -- pods ------------------------------------------------------------------------------------

    def _compact(self, requests: dict[str, int]) -> Requests:
        shape = tuple(sorted(requests.items()))
        return self._shapes.setdefault(shape, shape)

    def _account(self, record: PodRecord, sign: int) -> None:
        ours = record.owner is not None and (self.owner is None or record.owner == self.owner)
        usage = self.ours_used if ours else self.online_used
        used = usage.setdefault(record.node, {})
        for name, value in record.requests:
            used[name] = used.get(name, 0) + sign * value
        if self.track_owners and record.owner is not None:
            held = self.by_owner.setdefault(record.node, {}).setdefault(record.owner, {})
            for name, value in record.requests:
                held[name] = held.get(name, 0) + sign * value
        self.touch(record.node)

    def upsert_pod(self, obj: dict[str, Any]) -> str:
        """Count the pod in (again); its key."""
        meta = obj.get("metadata") or {}
        key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        old = self.pods.pop(key, None)
        if old is not None:
            self._account(old, -1)
        owner = labels.owner_key(meta.get("labels") or {})
        if owner is None and waits_without_preempting(obj):
            self.pending[key] = PendingRecord(
                self._compact(pod_requests(spec)),
                int(spec.get("priority") or 0),
                fit.pod_constraints(spec, self.interner),
                f"{meta.get('namespace')}/{meta.get('name')}",
            )
        else:
            self.pending.pop(key, None)
        # Terminal pods free their node; terminating ones still hold it until they are gone,
        # as the scheduler counts them.
        if node and phase not in ("Succeeded", "Failed"):
            record = PodRecord(sys.intern(node), self._compact(pod_requests(spec)), owner and sys.intern(owner))
            self.pods[key] = record
            self._account(record, +1)
        return key

    def delete_pod(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._forget(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")

    def _forget(self, key: str) -> None:
        self.pending.pop(key, None)
        old = self.pods.pop(key, None)
        if old is not None:
            self._account(old, -1)

    def relist_pods(self) -> Relist:
        """A fresh list of the member's pods, taken in pages (vkprovider.kube.relist): each
        counted in as it comes, then those the list no longer holds counted out."""
        return Relist(self.upsert_pod, self._relisted_pods)

    def _relisted_pods(self, seen: set[str]) -> None:
        for key in [k for k in (*self.pods, *self.pending) if k not in seen]:
            self._forget(key)

    def replace_pods(self, objs: list[dict[str, Any]]) -> None:
        into = self.relist_pods()
        into.page(objs)
        into.done()
