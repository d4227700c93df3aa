"""What the reclaim planner (federation.reclaim.planner) is given and what it answers (pure):
our pods, the member's nodes, online pods waiting for room, the plan; and the small vector
arithmetic and bookkeeping types its steps share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from federation import labels
from federation.capacity import fit
from federation.capacity.inventory import NodeRecord

BAND_RANK = {"worker-max": 0, "worker-min": 1, "ps": 2}
#: Tiers, cheapest first, each split by band (0-2): pods already under notice, a job's pods
#: above its minimum, whole gangs (by the gang's highest band).
NOTICED, SURPLUS, GANG = 0, 3, 6
TIERS = 9


@dataclass(frozen=True, slots=True)
class OurPod:
    key: str  # the member pod, namespace/name
    node: str
    requests: Mapping[str, int]
    band: str = "worker-min"
    job: str = ""
    gang_min: int = 0  # the job's gang minimum (0 or 1: no gang)
    deletion_cost: int = 0
    numa_zone: str | None = None
    noticed: bool = False


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    allocatable: Mapping[str, int]
    online_used: Mapping[str, int]
    ready: bool = True
    schedulable: bool = True
    network_pod: str | None = None
    gpu_model: str | None = None
    zone: str | None = None
    labels: fit.Labels = ()  # all its labels (fit.node_labels: the hostname implied)
    taints: tuple[fit.Taint, ...] = ()  # NoSchedule and NoExecute taints
    #: Why our pods may not stay there (cordoned, NotReady, a taint they do not tolerate), or
    #: None: they may. Our pods on such a node are the first victims.
    unusable: str | None = None

    @classmethod
    def of(cls, record: NodeRecord, *, online_used: Mapping[str, int], unusable: str | None) -> NodeView:
        """The planner's view of an inventory node."""
        return cls(
            record.name,
            record.allocatable,
            online_used,
            record.ready,
            record.schedulable,
            record.network_pod,
            record.gpu_product,
            record.zone,
            record.labels,
            record.taints,
            unusable,
        )

    def label_map(self) -> dict[str, str]:
        """Its labels for matching: all it has, the hostname, and the ones we know it by."""
        known = fit.label_map(self.name, self.labels)
        for key, value in (
            (labels.GPU_PRODUCT, self.gpu_model),
            (labels.NETWORK_POD, self.network_pod),
            (labels.ZONE, self.zone),
        ):
            if value:
                known.setdefault(key, value)
        return known


@dataclass(frozen=True, slots=True)
class PendingPod:
    """An online pod that waits for room and will not preempt (preemptionPolicy: Never)."""

    key: str
    requests: Mapping[str, int]
    priority: int = 0
    constraints: fit.Constraints = fit.ANYWHERE


class Victim(NamedTuple):
    """A pod chosen and why (a tuple: plans of thousands of victims are made every round)."""

    pod: OurPod
    reason: str


@dataclass
class Plan:
    victims: list[Victim] = field(default_factory=list)
    deficit: dict[str, int] = field(default_factory=dict)  # what the member must get back
    unmet: dict[str, int] = field(default_factory=dict)  # what no choice of victims could free
    served: list[str] = field(default_factory=list)  # pending online pods room is made for
    nodes_emptied: list[str] = field(default_factory=list)

    @property
    def keys(self) -> set[str]:
        return {v.pod.key for v in self.victims}


def deficit(held: Mapping[str, int], allowed: Mapping[str, int]) -> dict[str, int]:
    """What our pods hold beyond what the member lends now, per resource."""
    return {k: v - allowed.get(k, 0) for k, v in held.items() if v > allowed.get(k, 0)}


def covers(freed: Mapping[str, int], need: Mapping[str, int]) -> bool:
    return all(freed.get(k, 0) >= v for k, v in need.items() if v > 0)


def share_of(vec: Mapping[str, int], need: Mapping[str, int]) -> float:
    """How much of `need` a vector covers, each resource as a share (0..number of resources)."""
    return sum(min(vec.get(k, 0), v) / v for k, v in need.items() if v > 0)


def short_of(need: Mapping[str, int], freed: Mapping[str, int]) -> dict[str, int]:
    return {k: v - freed.get(k, 0) for k, v in need.items() if v - freed.get(k, 0) > 0}


@dataclass(slots=True, eq=False)
class Unit:
    """Victims taken and given back together: a pod with a reason of its own, or a whole gang."""

    pods: list[int]
    reason: str
    forced: bool  # a drain or room for a waiting pod: not given back for the member deficit
    job: str
    whole: bool  # a gang taken whole (below its minimum)


#: What the plan took, in order: a pod taken alone for the deficit (its reason follows from its
#: band: the hot path, no unit made), a unit, or None where it was given back.
Entry = int | Unit | None
#: How dear room on a node comes for a waiting pod: (worst tier taken, whether it leaves some of
#: ours there, victims, node); (-1, False, 0, node): it fits already.
Cost = tuple[int, bool, int, str]


def members_of(entry: int | Unit) -> list[int]:
    return [entry] if isinstance(entry, int) else entry.pods
