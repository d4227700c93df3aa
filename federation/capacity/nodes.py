"""The virtual nodes' status: which node each member feeds, and what each node shows.

One pooled node for all members, or one node per member (`virtual_nodes: per-member`). A
node's capacity = allocatable = what its reachable members can lend plus what our pods
already use there (their summaries, federation.capacity.summary), damped against noise; its labels
name the GPU models behind it (and, per member, the member); its capacity-shapes annotation
carries each member's shapes (largest pod per node, GPUs per model, free capacity per network
pod and NUMA zone), which the front-end scheduler cannot see but users and the dashboard read;
its MembersReachable condition names the members whose capacity is withdrawn. The node stays
Ready while a member is away: pods on the others keep running.

Kept apart from the members (federation.members.fleet) and from when to publish (the
provider's publish loop): this module holds what was published last and tells the runtime
which nodes changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from federation import labels
from federation.capacity import quantities
from federation.capacity.summary import TRACKED, MemberCapacity
from vkprovider.provider import NodeStatus

#: Labels of a virtual node, one per GPU model its members lend (`gpu.vkprovider.io/<model>: "true"`),
#: for node selectors and affinity on the model.
GPU_LABEL_PREFIX = "gpu.vkprovider.io/"
#: Annotation of a virtual node: its capacity shapes as JSON (largest pod per member node, GPUs per
#: model, free capacity per network pod and NUMA zone).
CAPACITY_SHAPES = "vkprovider.io/capacity-shapes"


@dataclass
class Damper:
    """Hysteresis for published capacity: decreases are published at once (never over-admit);
    an increase waits until it exceeds `relative` of the published value (or `absolute` units)
    or has held for `hold` seconds, so noise does not flap the node."""

    relative: float = 0.02
    absolute: dict[str, int] = field(default_factory=lambda: {quantities.CPU: 1000, quantities.MEMORY: 2**30})
    hold: float = 10.0
    published: dict[str, int] = field(default_factory=dict)
    _pending_since: float | None = None

    def update(self, computed: dict[str, int], now: float) -> tuple[dict[str, int], bool]:
        """(what to publish, whether it changed)."""
        if computed == self.published:
            self._pending_since = None
            return self.published, False
        names = set(computed) | set(self.published)
        decrease = any(computed.get(n, 0) < self.published.get(n, 0) for n in names)
        big = any(
            abs(computed.get(n, 0) - self.published.get(n, 0))
            > max(self.relative * self.published.get(n, 0), self.absolute.get(n, 0))
            for n in names
        )
        if self._pending_since is None:
            self._pending_since = now
        if decrease or big or not self.published or now - self._pending_since >= self.hold:
            self.published = dict(computed)
            self._pending_since = None
            return self.published, True
        return self.published, False


class _Enabled(Protocol):
    @property
    def enabled(self) -> bool: ...


class Lender(Protocol):
    """What a node's status reads of one member (federation.members.member.Member)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> _Enabled: ...

    @property
    def draining(self) -> bool: ...

    @property
    def reachable(self) -> bool: ...

    @property
    def lends(self) -> bool:
        """Reachable, and our pods can go there (its credential accepted)."""
        ...

    @property
    def summary(self) -> MemberCapacity | None: ...


class VirtualNodes:
    """The nodes of instance `instance` over `members` (the provider's own dict, read live)."""

    def __init__(self, instance: str, members: Mapping[str, Lender], *, per_member: bool, damping_hold: float) -> None:
        self.instance, self.per_member, self.damping_hold = instance, per_member, damping_hold
        self._members = members
        self._dampers: dict[str, Damper] = {}
        self.published: dict[str, NodeStatus] = {}
        self._callbacks: list[Callable[[str], None]] = []

    def names(self) -> list[str]:
        if not self.per_member:
            return [self.instance]
        return [self.node_of(name) for name, m in sorted(self._members.items()) if m.config.enabled or m.draining]

    def node_of(self, member: str) -> str:
        return f"{self.instance}-{member}" if self.per_member else self.instance

    def members_of(self, node: str) -> list[Lender]:
        if not self.per_member:
            return [m for m in self._members.values() if m.config.enabled]
        return [
            m for name, m in self._members.items() if self.node_of(name) == node and (m.config.enabled or m.draining)
        ]

    def status(self, node: str) -> NodeStatus:
        """What was published last for `node`, or (before the first publish) what it would be."""
        return self.published.get(node) or node_status(self.members_of(node), self.instance, self.per_member)

    def view(self) -> dict[str, Any]:
        """Each published node's capacity, labels, conditions and members (the resource view)."""
        out = {}
        for node in self.names():
            status = self.published.get(node)
            if status is not None:
                out[node] = {
                    "capacity": status.capacity,
                    "labels": status.labels,
                    "conditions": status.conditions,
                    "members": [m.name for m in self.members_of(node)],
                }
        return out

    def notify(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)

    def publish(self, now: float) -> None:
        """Recompute every node from its members' summaries; notify nodes whose status changed
        (capacity past the damper, or labels, annotations, conditions)."""
        for node in self.names():
            computed = node_status(self.members_of(node), self.instance, self.per_member)
            damper = self._dampers.setdefault(node, Damper(hold=self.damping_hold))
            published, changed = damper.update(quantities.vector(computed.capacity), now)
            computed.capacity = {k: quantities.format_quantity(k, v) for k, v in sorted(published.items())}
            previous = self.published.get(node)
            self.published[node] = computed
            if changed or previous is None or _meta_differs(previous, computed):
                for callback in self._callbacks:
                    callback(node)


def node_status(members: list[Lender], instance: str, per_member: bool) -> NodeStatus:
    """A node's status from its members' latest summaries (undamped)."""
    total: dict[str, int] = {}
    models: set[str] = set()
    shapes: dict[str, Any] = {}
    unreachable = []
    for member in members:
        summary = member.summary
        if not member.reachable:
            unreachable.append(member.name)
        if summary is None or not member.lends:
            continue
        total = quantities.add(total, summary.capacity)
        models |= {m for m, n in summary.gpus_total_by_model.items() if n}
        shapes[member.name] = {
            "largest": {k: _fmt(v) for k, v in summary.largest.items()},
            "gpusByModel": summary.gpus_by_model,
            "networkPods": {k: _fmt(v, brief=True) for k, v in sorted(summary.network_pods.items())},
            "numaLargestZone": _fmt(summary.numa_largest, brief=True),
        }
    for name in TRACKED:
        total.setdefault(name, 0)
    node_labels = {f"{GPU_LABEL_PREFIX}{model}": "true" for model in sorted(models)}
    node_labels[labels.INSTANCE] = instance  # what the routing webhook selects
    if per_member and members:
        node_labels[labels.MEMBER] = members[0].name
        if len(models) == 1:
            node_labels["nvidia.com/gpu.product"] = next(iter(models))
    message = (
        "all members reachable" if not unreachable else f"unreachable, capacity withdrawn: {', '.join(unreachable)}"
    )
    return NodeStatus(
        capacity={k: quantities.format_quantity(k, max(0, v)) for k, v in sorted(total.items())},
        labels=node_labels,
        annotations={CAPACITY_SHAPES: json.dumps(shapes, sort_keys=True, separators=(",", ":"))},
        conditions=[
            {
                "type": "MembersReachable",
                "status": "False" if unreachable else "True",
                "reason": "MemberUnreachable" if unreachable else "AllReachable",
                "message": message,
            }
        ],
    )


def _fmt(vec: dict[str, int], *, brief: bool = False) -> dict[str, str]:
    keep = (quantities.CPU, quantities.MEMORY, quantities.GPU) if brief else TRACKED
    return {k: quantities.format_quantity(k, v) for k, v in sorted(vec.items()) if k in keep}


def _meta_differs(a: NodeStatus, b: NodeStatus) -> bool:
    return a.labels != b.labels or a.annotations != b.annotations or a.conditions != b.conditions
