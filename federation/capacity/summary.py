"""What a member can lend, as sums and as shapes (pure arithmetic over an Inventory).

Capacity models, chosen per member:
- requests headroom: per eligible node (Ready, schedulable, every NoSchedule/NoExecute taint
  tolerated by our pods), allocatable minus the requests of online pods and of our pods minus a
  reserve (a watermark share of allocatable kept for online bursts);
- colocation: the reclaimable resources a colocation stack publishes on the node (Koordinator
  batch-cpu/batch-memory, Katalyst reclaimed_millicpu/reclaimed_memory) minus what batch pods
  already request, as canonical cpu and memory; other resources (GPUs, pods) as headroom.
Time windows scale what is lent by time of day (windows may cross midnight) or cap it; a hard
cap per member bounds the sums. Windows and caps bound the *total* lent, our running pods
included: the member allows `allowed` = min(multiplier x the nodes' budgets, cap), where a
node's budget is what it could lend if none of our pods ran there; what is lendable on top is
allowed minus what our pods hold. When our pods hold more than is allowed (online load grew
into the reserve, a window closed, a cap fell), reclaim gives the difference back
(federation.reclaim.planner). Our own pods count as used capacity, never as online load: the virtual
node's allocatable is what is lendable plus what our pods already use.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from federation import labels
from federation.capacity import quantities
from federation.capacity.inventory import Inventory, NodeRecord, tolerates

TRACKED = (quantities.CPU, quantities.MEMORY, quantities.GPU, quantities.PODS, "ephemeral-storage")


@dataclass(frozen=True)
class TimeWindow:
    """From `start` to `end` (local wall-clock "HH:MM"; end before start crosses midnight)."""

    start: datetime.time
    end: datetime.time
    multiplier: float = 1.0
    cap: dict[str, int] = field(default_factory=dict)

    def active(self, at: datetime.time) -> bool:
        if self.start <= self.end:
            return self.start <= at < self.end
        return at >= self.start or at < self.end


@dataclass(frozen=True)
class CapacityPolicy:
    model: Literal["requests", "colocation"] = "requests"
    reserve_percent: float = 10.0
    tolerations: tuple[dict[str, Any], ...] = ()
    windows: tuple[TimeWindow, ...] = ()
    cap: dict[str, int] = field(default_factory=dict)


def eligible(node: NodeRecord, policy: CapacityPolicy) -> bool:
    return node.ready and node.schedulable and all(tolerates(policy.tolerations, t) for t in node.taints)


def _colocation_free(node: NodeRecord, used: dict[str, int]) -> dict[str, int]:
    """Reclaimable cpu/memory left on the node, keyed by canonical name."""
    free: dict[str, int] = {}
    for name, canonical in labels.COLOCATION_RESOURCES.items():
        if name in node.allocatable:
            free[canonical] = free.get(canonical, 0) + node.allocatable[name] - used.get(name, 0)
    return free


def node_free(
    node: NodeRecord,
    *,
    online_used: dict[str, int],
    ours_used: dict[str, int],
    policy: CapacityPolicy,
) -> dict[str, int]:
    """What one eligible node can lend now (never negative)."""
    free: dict[str, int] = {}
    for name, allocatable in node.allocatable.items():
        if name in labels.COLOCATION_RESOURCES:
            continue
        reserve = int(allocatable * policy.reserve_percent / 100) if name in (quantities.CPU, quantities.MEMORY) else 0
        free[name] = allocatable - online_used.get(name, 0) - ours_used.get(name, 0) - reserve
    if policy.model == "colocation":
        both = quantities.add(online_used, ours_used)
        free.update(_colocation_free(node, both))
    return {name: max(0, value) for name, value in free.items()}


def ours_canonical(used: dict[str, int]) -> dict[str, int]:
    """Our pods' usage with colocation resource names folded into canonical ones."""
    out: dict[str, int] = {}
    for name, value in used.items():
        canonical = labels.COLOCATION_RESOURCES.get(name, name)
        out[canonical] = out.get(canonical, 0) + value
    return out


def _window_factor(policy: CapacityPolicy, now: datetime.time) -> tuple[float, dict[str, int]]:
    factor, cap = 1.0, dict(policy.cap)
    for window in policy.windows:
        if window.active(now):
            factor *= window.multiplier
            for name, value in window.cap.items():
                cap[name] = min(cap.get(name, value), value)
    return factor, cap


@dataclass
class NodeFree:
    """One node's lendable resources and the labels placement groups by (the Python API)."""

    name: str
    free: dict[str, int]
    gpu_product: str | None
    network_pod: str | None
    zone: str | None


@dataclass
class MemberCapacity:
    """A member's summary: sums, shapes, and per-node free vectors for placement."""

    name: str
    reachable: bool = True
    lendable: dict[str, int] = field(default_factory=dict)
    ours_used: dict[str, int] = field(default_factory=dict)
    nodes_total: int = 0
    nodes_eligible: int = 0
    largest: dict[str, dict[str, int]] = field(default_factory=dict)  # by "cpu", "memory", "gpu"
    gpus_by_model: dict[str, int] = field(default_factory=dict)  # free GPUs per model
    gpus_total_by_model: dict[str, int] = field(default_factory=dict)  # allocatable GPUs per model
    network_pods: dict[str, dict[str, int]] = field(default_factory=dict)  # free per network pod
    numa_largest: dict[str, int] = field(default_factory=dict)  # most free in one NUMA zone
    numa_zones: int = 0
    nodes: list[NodeFree] = field(default_factory=list)
    #: What the member allows our pods to hold in all (windows and caps applied).
    allowed: dict[str, int] = field(default_factory=dict)
    #: What online pods request, summed over all nodes (the tide's online load).
    online_used: dict[str, int] = field(default_factory=dict)
    #: GPUs our pods hold, per model.
    ours_gpus_by_model: dict[str, int] = field(default_factory=dict)
    #: When it was computed (monotonic): it counts the pods the inventory held then.
    at: float = field(default_factory=time.monotonic)

    @property
    def capacity(self) -> dict[str, int]:
        """What the member lends now ("lent"): what is free to place (`lendable`) plus what our
        pods hold; the virtual node's capacity for this member."""
        return quantities.add(self.lendable, self.ours_used)

    def fits_one(self, request: dict[str, int]) -> bool:
        return any(quantities.fits(request, n.free) for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        def fmt(vec: dict[str, int]) -> dict[str, str]:
            return {k: quantities.format_quantity(k, v) for k, v in sorted(vec.items())}

        return {
            "name": self.name,
            "reachable": self.reachable,
            # The figures of docs/concepts/pooling.md: lent = used + free.
            "lent": fmt(self.capacity),
            "used": fmt(self.ours_used),
            "free": fmt(self.lendable),
            "online": fmt(self.online_used),
            "nodes": {"total": self.nodes_total, "eligible": self.nodes_eligible},
            "largest": {k: fmt(v) for k, v in self.largest.items()},
            "gpusByModel": dict(sorted(self.gpus_by_model.items())),
            "gpusTotalByModel": dict(sorted(self.gpus_total_by_model.items())),
            "networkPods": {k: fmt(v) for k, v in sorted(self.network_pods.items())},
            "numa": {"zones": self.numa_zones, "largestZone": fmt(self.numa_largest)},
        }


def _limits(
    budget: dict[str, int], ours: dict[str, int], factor: float, cap: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """(allowed in all, what is left to lend on top of our pods) from the nodes' budgets."""
    allowed = {k: int(v * factor) if factor != 1.0 else v for k, v in budget.items()}
    allowed = {k: min(v, cap[k]) if k in cap else v for k, v in allowed.items()}
    remaining = {k: max(0, v - ours.get(k, 0)) for k, v in allowed.items()}
    return allowed, remaining


def _clamp(vec: dict[str, int], limit: dict[str, int]) -> dict[str, int]:
    return {k: min(v, limit[k]) if k in limit else v for k, v in vec.items()}


def _finish(
    summary: MemberCapacity, remaining: dict[str, int], lendable: dict[str, int], network: dict[str, dict[str, int]]
) -> MemberCapacity:
    """Bound the sums and shapes by what is left to lend (no node offers more than the member)."""
    if any(any(v > remaining.get(k, v) for k, v in n.free.items()) for n in summary.nodes):
        summary.nodes = [
            NodeFree(n.name, _clamp(n.free, remaining), n.gpu_product, n.network_pod, n.zone) for n in summary.nodes
        ]
    summary.lendable = _clamp(lendable, remaining)
    summary.network_pods = {k: _clamp(v, remaining) for k, v in network.items()}
    gpu_limit = remaining.get(quantities.GPU)
    if gpu_limit is not None:
        summary.gpus_by_model = {k: min(v, gpu_limit) for k, v in summary.gpus_by_model.items()}
    summary.largest = _largest(summary.nodes)
    return _normalize(summary)


def summarize(
    name: str,
    inventory: Inventory,
    policy: CapacityPolicy,
    *,
    now: datetime.time | None = None,
) -> MemberCapacity:
    """The member's capacity from its inventory (O(nodes); called coalesced, not per event)."""
    now = now or datetime.datetime.now().time()
    factor, cap = _window_factor(policy, now)
    summary = MemberCapacity(name=name, nodes_total=len(inventory.nodes))
    ours_total: dict[str, int] = {}
    for used in inventory.ours_used.values():
        ours_total = quantities.add(ours_total, ours_canonical(used))
    summary.ours_used = {k: v for k, v in ours_total.items() if v}
    lendable: dict[str, int] = {}
    budget: dict[str, int] = {}
    network: dict[str, dict[str, int]] = {}
    for node in inventory.nodes.values():
        if node.gpu_product and quantities.GPU in node.allocatable:
            summary.gpus_total_by_model[node.gpu_product] = (
                summary.gpus_total_by_model.get(node.gpu_product, 0) + node.allocatable[quantities.GPU]
            )
        summary.online_used = quantities.add(summary.online_used, inventory.online_used.get(node.name, {}))
        held = _gpus_held(node, inventory)
        if held:
            summary.ours_gpus_by_model[held[0]] = summary.ours_gpus_by_model.get(held[0], 0) + held[1]
        if not eligible(node, policy):
            continue
        summary.nodes_eligible += 1
        online = inventory.online_used.get(node.name, {})
        free = node_free(node, online_used=online, ours_used=inventory.ours_used.get(node.name, {}), policy=policy)
        budget = quantities.add(budget, node_free(node, online_used=online, ours_used={}, policy=policy))
        summary.nodes.append(NodeFree(node.name, free, node.gpu_product, node.network_pod, node.zone))
        lendable = quantities.add(lendable, free)
        if node.gpu_product and free.get(quantities.GPU):
            summary.gpus_by_model[node.gpu_product] = (
                summary.gpus_by_model.get(node.gpu_product, 0) + free[quantities.GPU]
            )
        if node.network_pod:
            network[node.network_pod] = quantities.add(network.get(node.network_pod, {}), free)
        for zone in inventory.numa.get(node.name, ()):
            summary.numa_zones += 1
            for rname, value in zone.available.items():
                summary.numa_largest[rname] = max(summary.numa_largest.get(rname, 0), value)
    summary.allowed, remaining = _limits(budget, summary.ours_used, factor, cap)
    return _finish(summary, remaining, lendable, network)


def _gpus_held(node: NodeRecord, inventory: Inventory) -> tuple[str, int] | None:
    """(model, GPUs our pods hold on the node), when they hold any."""
    count = ours_canonical(inventory.ours_used.get(node.name, {})).get(quantities.GPU, 0)
    return (node.gpu_product or "unknown", count) if count else None


def _nonzero(vec: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in vec.items() if v}


def _normalize(summary: MemberCapacity) -> MemberCapacity:
    """One form for equal summaries however they were computed: no zero entries."""
    summary.lendable = _nonzero(summary.lendable)
    summary.gpus_by_model = _nonzero(summary.gpus_by_model)
    summary.gpus_total_by_model = _nonzero(summary.gpus_total_by_model)
    summary.network_pods = {k: _nonzero(v) for k, v in sorted(summary.network_pods.items()) if any(v.values())}
    summary.numa_largest = _nonzero(summary.numa_largest)
    summary.online_used = _nonzero(summary.online_used)
    summary.ours_gpus_by_model = _nonzero(summary.ours_gpus_by_model)
    return summary


def _largest(nodes: list[NodeFree]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key, resource in (("cpu", quantities.CPU), ("memory", quantities.MEMORY), ("gpu", quantities.GPU)):
        # Ties go to the highest name, so the answer does not depend on iteration order.
        best = max(nodes, key=lambda n, r=resource: (n.free.get(r, 0), n.name), default=None)  # type: ignore[misc]
        if best is not None and best.free.get(resource, 0) > 0:
            out[key] = {k: v for k, v in best.free.items() if k in TRACKED}
    return out


@dataclass
class _NodeShare:
    version: int
    eligible: bool
    free: NodeFree
    budget: dict[str, int]
    total_gpus: tuple[str, int] | None
    numa_zones: int
    numa: tuple[tuple[str, int], ...]
    online: dict[str, int]
    held_gpus: tuple[str, int] | None


class Summarizer:
    """`summarize`, incrementally: only nodes whose inventory version moved are recomputed and
    their share of the sums swapped, so a publish after a few events costs little even for
    thousands of nodes. A change of policy or of the active time window recomputes everything.
    Results equal `summarize` (a property test checks it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._key: tuple[Any, ...] | None = None
        self._reset()

    def _reset(self) -> None:
        self._shares: dict[str, _NodeShare] = {}
        self._lendable: dict[str, int] = {}
        self._budget: dict[str, int] = {}
        self._gpus: dict[str, int] = {}
        self._gpus_total: dict[str, int] = {}
        self._network: dict[str, dict[str, int]] = {}
        self._online: dict[str, int] = {}
        self._held_gpus: dict[str, int] = {}

    def _apply(self, share: _NodeShare, sign: int) -> None:
        free = share.free
        self._online = quantities.add(self._online, share.online, sign)
        if share.held_gpus:
            model, count = share.held_gpus
            self._held_gpus[model] = self._held_gpus.get(model, 0) + sign * count
        self._lendable = quantities.add(self._lendable, free.free, sign)
        self._budget = quantities.add(self._budget, share.budget, sign)
        if free.gpu_product and free.free.get(quantities.GPU):
            self._gpus[free.gpu_product] = self._gpus.get(free.gpu_product, 0) + sign * free.free[quantities.GPU]
        if share.total_gpus:
            model, count = share.total_gpus
            self._gpus_total[model] = self._gpus_total.get(model, 0) + sign * count
        if free.network_pod:
            self._network[free.network_pod] = quantities.add(self._network.get(free.network_pod, {}), free.free, sign)

    def _share(self, inventory: Inventory, node: NodeRecord, version: int, policy: CapacityPolicy) -> _NodeShare:
        total = None
        if node.gpu_product and quantities.GPU in node.allocatable:
            total = (node.gpu_product, node.allocatable[quantities.GPU])
        online = dict(inventory.online_used.get(node.name, {}))  # a copy: the inventory changes its own in place
        held = _gpus_held(node, inventory)
        if not eligible(node, policy):
            return _NodeShare(version, False, NodeFree(node.name, {}, None, None, None), {}, total, 0, (), online, held)
        vec = node_free(node, online_used=online, ours_used=inventory.ours_used.get(node.name, {}), policy=policy)
        budget = node_free(node, online_used=online, ours_used={}, policy=policy)
        zones = inventory.numa.get(node.name, ())
        numa = tuple((r, v) for z in zones for r, v in z.available.items())
        free = NodeFree(node.name, vec, node.gpu_product, node.network_pod, node.zone)
        return _NodeShare(version, True, free, budget, total, len(zones), numa, online, held)

    def summarize(
        self, inventory: Inventory, policy: CapacityPolicy, *, now: datetime.time | None = None
    ) -> MemberCapacity:
        now = now or datetime.datetime.now().time()
        factor, cap = _window_factor(policy, now)
        key = (id(inventory), policy)
        if key != self._key:
            self._reset()
            self._key = key
        versions = inventory.node_versions
        for name in [n for n in self._shares if n not in inventory.nodes]:
            self._apply(self._shares.pop(name), -1)
        for name, node in inventory.nodes.items():
            version = versions.get(name, -1)
            old = self._shares.get(name)
            if old is not None and old.version == version:
                continue
            if old is not None:
                self._apply(old, -1)
            share = self._share(inventory, node, version, policy)
            self._shares[name] = share
            self._apply(share, +1)
        summary = MemberCapacity(name=self.name, nodes_total=len(inventory.nodes))
        ours_total: dict[str, int] = {}
        for used in inventory.ours_used.values():
            ours_total = quantities.add(ours_total, ours_canonical(used))
        summary.ours_used = {k: v for k, v in ours_total.items() if v}
        summary.nodes = [s.free for s in self._shares.values() if s.eligible]
        summary.nodes_eligible = len(summary.nodes)
        summary.gpus_by_model = {k: v for k, v in self._gpus.items() if v}
        summary.gpus_total_by_model = {k: v for k, v in self._gpus_total.items() if v}
        summary.online_used = dict(self._online)
        summary.ours_gpus_by_model = dict(self._held_gpus)
        for share in self._shares.values():
            summary.numa_zones += share.numa_zones
            if share.numa:
                for rname, value in share.numa:
                    summary.numa_largest[rname] = max(summary.numa_largest.get(rname, 0), value)
        summary.allowed, remaining = _limits(self._budget, summary.ours_used, factor, cap)
        return _finish(summary, remaining, self._lendable, {k: dict(v) for k, v in self._network.items()})
