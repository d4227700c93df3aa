"""Which of our pods give capacity back, and why (pure: table- and property-tested, no I/O).

Given one member's nodes, our pods there, what the member must get back (a member-wide
deficit: our pods hold more than the member lends now) and online pods that wait for room
without preempting, `plan` picks victims in three steps:

1. every pod of ours on a node we may not use (`NodeView.unusable`: cordoned, NotReady, a
   taint our pods do not tolerate) goes first, as a drain would take it; what they free counts
   towards the deficit (the deficit already leaves those nodes out, so it is not asked twice);
2. each waiting online pod gets room on one node it fits as kube-scheduler would judge it
   (federation.capacity.fit: resources, node selector, required node affinity, taints): the
   node where the cheapest victims do; no fewer victims there would do;
3. the rest of the deficit, member-wide, with a minimal set of victims: it frees at least the
   need and no victim (nor a gang taken whole) could be spared. Among such sets it prefers, in
   order:
   - the lowest band: worker-max, then worker-min, then PS; a job's pods above its gang minimum
     (elastic workers, plain pods) before any job loses its minimum; a gang never limps: when a
     pod of its minimum must go, the whole gang goes;
   - whole machines, where the need is a machine's worth or more (a node's pods are taken
     together only when all of them fit within what is still needed: never extra victims);
   - a whole NUMA zone (where the member reports which zone a pod runs in);
   - pods that leave their job more homogeneous (from the network pod and GPU model where the
     job has fewest pods);
   - `controller.kubernetes.io/pod-deletion-cost`, lower first; then the fewest victims, then by
     name, so plans repeat.
Pods already under notice are preferred above all, so a plan recomputed each second keeps its
earlier victims while they are still needed and drops them (cancelling their notice) when not.

Minimality comes from greedy choice in the order of the rules, then giving back, newest first,
whatever the need turns out not to require. The planner runs every round on members of
thousands of nodes and tens of thousands of our pods, so it works on indices and only the
resources the need names, sorts only the band where the need is met (a band taken whole needs
no order), and ranks nodes for waiting pods once per kind of pod, re-ranking only the nodes a
choice changed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from federation import labels
from federation.capacity import fit, quantities
from federation.capacity.inventory import NodeRecord

BAND_RANK = {"worker-max": 0, "worker-min": 1, "ps": 2}
#: Tiers, cheapest first, each split by band (0-2): pods already under notice, a job's pods
#: above its minimum, whole gangs (by the gang's highest band).
NOTICED, SURPLUS, GANG = 0, 3, 6
TIERS = 9
#: How many subsets of a gang to try when looking for a smaller part of it that would do.
SUBSETS_TRIED = 4096


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


def _covered(freed: Mapping[str, int], need: Mapping[str, int]) -> bool:
    return all(freed.get(k, 0) >= v for k, v in need.items() if v > 0)


def _coverage(vec: Mapping[str, int], need: Mapping[str, int]) -> float:
    """How much of `need` a vector covers, each resource as a share (0..number of resources)."""
    return sum(min(vec.get(k, 0), v) / v for k, v in need.items() if v > 0)


def _remaining(need: Mapping[str, int], freed: Mapping[str, int]) -> dict[str, int]:
    return {k: v - freed.get(k, 0) for k, v in need.items() if v - freed.get(k, 0) > 0}


@dataclass(slots=True, eq=False)
class _Unit:
    """Victims taken and given back together: a pod with a reason of its own, or a whole gang."""

    pods: list[int]
    reason: str
    forced: bool  # a drain or room for a waiting pod: not given back for the member deficit
    job: str
    whole: bool  # a gang taken whole (below its minimum)


#: What the plan took, in order: a pod taken alone for the deficit (its reason follows from its
#: band: the hot path, no unit made), a unit, or None where it was given back.
Entry = int | _Unit | None
#: How dear room on a node comes for a waiting pod: (worst tier taken, whether it leaves some of
#: ours there, victims, node); (-1, False, 0, node): it fits already.
Cost = tuple[int, bool, int, str]


def _members(entry: int | _Unit) -> list[int]:
    return [entry] if isinstance(entry, int) else entry.pods


class _State:
    """Our pods on one member as the plan takes them: who is left, per node and per job. Pods
    are indices into the list handed in."""

    def __init__(self, nodes: list[NodeView], pods: list[OurPod]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.pods = pods
        self.taken = bytearray(len(pods))
        on_node: dict[str, list[int]] = {}
        job_pods: dict[str, list[int]] = {}
        gang_min: dict[str, int] = {}
        for i, p in enumerate(pods):
            here = on_node.get(p.node)
            if here is None:
                on_node[p.node] = [i]
            else:
                here.append(i)
            mates = job_pods.get(p.job)
            if mates is None:
                job_pods[p.job] = [i]
            else:
                mates.append(i)
            if p.gang_min > 1 and p.gang_min > gang_min.get(p.job, 0):
                gang_min[p.job] = p.gang_min
        self.on_node = on_node
        self.node_left = {n: len(v) for n, v in on_node.items()}
        self.job_pods = job_pods
        self.job_left = {j: len(v) for j, v in job_pods.items()}
        self.gang_min = gang_min  # only jobs with a gang minimum above one
        rank = BAND_RANK.get
        self.gang_band = {j: max(rank(pods[i].band, 1) for i in job_pods[j]) for j in gang_min}
        self.order: list[Entry] = []
        self.version: dict[str, int] = {}  # per node, moved by every change (cached sums follow it)
        self._sums: dict[str, dict[str, int]] = {}
        self._domains: dict[str, dict[tuple[int, str | None], int]] = {}
        self._whys: dict[tuple[int, str], str] = {}
        self._node_domains: dict[str, tuple[tuple[int, str | None], tuple[int, str | None]]] = {}

    # -- what is left ----------------------------------------------------------------------------

    def left_on(self, node: str) -> list[int]:
        taken = self.taken
        return [i for i in self.on_node.get(node, ()) if not taken[i]]

    def ours_on(self, node: str) -> dict[str, int]:
        """What our pods still left on the node hold."""
        held = self._sums.get(node)
        if held is None:
            held = {}
            for i in self.left_on(node):
                for k, v in self.pods[i].requests.items():
                    held[k] = held.get(k, 0) + v
            self._sums[node] = held
        return held

    def tier(self, i: int) -> int:
        p = self.pods[i]
        if p.noticed:
            return NOTICED + BAND_RANK.get(p.band, 1)
        m = self.gang_min.get(p.job)
        if m is None or self.job_left[p.job] > m:
            return SURPLUS + BAND_RANK.get(p.band, 1)
        return GANG + self.gang_band[p.job]

    def below_minimum(self, job: str) -> bool:
        """Whether the job's next pod to go takes its whole gang."""
        m = self.gang_min.get(job)
        return m is not None and self.job_left[job] <= m

    def unit_of(self, i: int) -> list[int]:
        """The pod, or its whole gang when it is below its minimum."""
        job = self.pods[i].job
        if not self.below_minimum(job):
            return [i]
        taken = self.taken
        return [k for k in self.job_pods[job] if not taken[k]]

    def limps(self, job: str, back: int) -> bool:
        """Whether giving `back` pods of the job back would leave it between none and its minimum."""
        m = self.gang_min.get(job)
        return m is not None and 0 < self.job_left[job] + back < m

    # -- taking and giving back ------------------------------------------------------------------

    def _moved(self, i: int, sign: int) -> None:
        p = self.pods[i]
        node, job = p.node, p.job
        self.taken[i] = sign < 0
        self.node_left[node] += sign
        self.job_left[job] += sign
        self._sums.pop(node, None)
        self._domains.pop(job, None)
        self.version[node] = self.version.get(node, 0) + 1

    def take(self, i: int, prefix: str = "", *, forced: bool = False) -> int:
        """The pod (or its gang, below its minimum) as one unit; where it stands in the order."""
        job = self.pods[i].job
        whole = self.below_minimum(job)
        return self.take_exactly(self.unit_of(i), prefix + self.why(i), whole=whole, forced=forced)

    def take_single(self, i: int) -> None:
        """A pod above its job's minimum, alone, for the deficit (the hot path: no unit made)."""
        self._moved(i, -1)
        self.order.append(i)

    def take_all(self, entries: list[int], tier: int) -> tuple[list[int], list[int]]:
        """Every pod of a tier that all goes: those above their job's minimum alone (the hot path
        of `take_single`, inlined), gangs whole; (taken, those whose tier rose meanwhile as their
        job reached its minimum)."""
        pods, taken, node_left, job_left, gang_min = self.pods, self.taken, self.node_left, self.job_left, self.gang_min
        version, order = self.version, self.order
        took: list[int] = []
        later: list[int] = []
        for i in entries:
            if taken[i]:
                continue
            p = pods[i]
            job = p.job
            m = gang_min.get(job)
            if m is not None and job_left[job] <= m:
                if self.tier(i) > tier:
                    later.append(i)
                else:
                    took.extend(_members(self.order[self.take(i)] or 0))
                continue
            taken[i] = 1
            node_left[p.node] -= 1
            job_left[job] -= 1
            version[p.node] = version.get(p.node, 0) + 1
            order.append(i)
            took.append(i)
        self._sums.clear()
        self._domains.clear()
        return took, later

    def take_exactly(self, members: list[int], reason: str, *, whole: bool, forced: bool = False) -> int:
        for k in members:
            self._moved(k, -1)
        self.order.append(_Unit(members, reason, forced, self.pods[members[0]].job, whole))
        return len(self.order) - 1

    def give_back(self, at: int) -> None:
        entry = self.order[at]
        self.order[at] = None
        if entry is not None:
            for k in _members(entry):
                self._moved(k, +1)

    def reason(self, entry: int | _Unit) -> str:
        if isinstance(entry, _Unit):
            return entry.reason
        pod = self.pods[entry]  # taken alone: under notice or above its job's minimum
        text = self._whys.get((-1 if pod.noticed else -2, pod.band))
        if text is None:
            text = self._whys[(-1 if pod.noticed else -2, pod.band)] = self.why(entry)
        return text

    # -- ordering --------------------------------------------------------------------------------

    def why(self, i: int) -> str:
        pod = self.pods[i]
        tier = self.tier(i) if not self.taken[i] else (NOTICED if pod.noticed else SURPLUS)
        memo = (tier // 3, pod.band if tier < GANG else pod.job)
        cached = self._whys.get(memo)
        if cached is None:
            if tier < SURPLUS:
                cached = f"already under notice (band {pod.band})"
            elif tier < GANG:
                cached = f"band {pod.band}, above its job's minimum"
            else:
                cached = (
                    f"band {pod.band}; its gang ({pod.job}) goes whole rather than below its minimum of "
                    f"{self.gang_min[pod.job]}"
                )
            self._whys[memo] = cached
        return cached

    def _domains_of(self, node: str) -> tuple[tuple[int, str | None], tuple[int, str | None]]:
        domains = self._node_domains.get(node)
        if domains is None:
            view = self.nodes.get(node)
            domains = ((0, view.network_pod), (1, view.gpu_model)) if view else ((0, None), (1, None))
            self._node_domains[node] = domains
        return domains

    def _all_node_domains(self) -> dict[str, tuple[tuple[int, str | None], tuple[int, str | None]]]:
        """Every node's (network pod, GPU model), also for nodes of ours the member no longer lists."""
        known = self._node_domains
        if len(known) < len(self.on_node):
            for node in self.on_node:
                if node not in known:
                    self._domains_of(node)
        return known

    def _count_domains(self, jobs: set[str]) -> dict[str, dict[tuple[int, str | None], int]]:
        """Per job, its pods left per network pod and GPU model (jobs of one pod left need none)."""
        domains, job_left, taken, pods = self._domains, self.job_left, self.taken, self.pods
        known = self._all_node_domains()
        for job in jobs:
            if job in domains or job_left[job] <= 1:
                continue
            counts: dict[tuple[int, str | None], int] = {}
            for i in self.job_pods[job]:
                if not taken[i]:
                    a, b = known[pods[i].node]
                    counts[a] = counts.get(a, 0) + 1
                    counts[b] = counts.get(b, 0) + 1
            domains[job] = counts
        return domains

    def numa_whole(self, i: int) -> bool:
        """Whether taking the pod empties its NUMA zone of ours."""
        pod = self.pods[i]
        if pod.numa_zone is None:
            return False
        return all(k == i or self.pods[k].numa_zone != pod.numa_zone for k in self.left_on(pod.node))

    def unit_requests(self, i: int) -> Mapping[str, int]:
        members = self.unit_of(i)
        if len(members) == 1:
            return self.pods[i].requests
        total: dict[str, int] = {}
        for k in members:
            for name, v in self.pods[k].requests.items():
                total[name] = total.get(name, 0) + v
        return total

    def ranked(self, entries: list[int], need: Mapping[str, int]) -> list[int]:
        """Pods of one tier in the order of the rules after the band: whole machine, whole NUMA
        zone, homogeneity (the share of its job in the pod's network pod and GPU model: taken
        from where its job is thinnest, the rest stays more together), deletion cost, most of the
        need, least beyond it, name. Runs over thousands of pods, so all of it inline."""
        wanted = [(k, v) for k, v in need.items() if v > 0]
        pods, node_left, job_left, gang_min = self.pods, self.node_left, self.job_left, self.gang_min
        known = self._all_node_domains()
        domains = self._count_domains({pods[i].job for i in entries})
        single = wanted[0] if len(wanted) == 1 else None
        keyed = []
        for i in entries:
            p = pods[i]
            job = p.job
            left = job_left[job]
            m = gang_min.get(job)
            freed: Mapping[str, int] = p.requests
            if m is not None and left <= m:
                freed, homogeneity = self.unit_requests(i), 0.0  # the whole gang goes
            elif left == 1:
                homogeneity = 2.0
            else:
                counts = domains[job]
                a, b = known[p.node]
                homogeneity = (counts.get(a, 0) + counts.get(b, 0)) / left
            if single is not None:
                got, v = freed.get(single[0], 0), single[1]
                cover, size = (got if got < v else v) / v, got / v
            else:
                cover = size = 0.0
                for name, v in wanted:
                    got = freed.get(name, 0)
                    cover += (got if got < v else v) / v
                    size += got / v
            keyed.append(
                (
                    # the last of ours there first (empties a machine), then the last in its NUMA zone
                    (node_left[p.node] != 1) * 2 + (True if p.numa_zone is None else not self.numa_whole(i)),
                    homogeneity,
                    p.deletion_cost,
                    -cover,
                    size,
                    p.key,
                    i,
                )
            )
        keyed.sort()
        return [k[-1] for k in keyed]


# -- 1. unusable nodes --------------------------------------------------------------------------------


def _drain_unusable(state: _State) -> None:
    """Every pod of ours on a node we may not use goes, as a drain would take it."""
    for node in state.nodes.values():
        if node.unusable is None:
            continue
        for i in state.on_node.get(node.name, ()):
            if not state.taken[i]:
                state.take(i, f"{node.unusable}: our pods there go first; ", forced=True)


# -- 2. waiting online pods ---------------------------------------------------------------------------


class _Room:
    """Room for waiting online pods, one node each. Nodes are ranked once per kind of pod
    (constraints and requests); a choice re-ranks only the node it changed."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.placed: dict[str, dict[str, int]] = {}  # waiting pods placed, per node
        self.kinds: dict[tuple[object, ...], tuple[dict[str, int], set[str], list[tuple[Cost, int, str]]]] = {}
        self._labels: dict[str, dict[str, str]] = {}

    def _fits(self, constraints: fit.Constraints, node: NodeView) -> bool:
        if not (node.ready and node.schedulable):
            return False
        if not constraints.node_selector and constraints.affinity is None:
            return not node.taints or constraints.fits(node.name, {}, node.taints)
        known = self._labels.get(node.name)
        if known is None:
            known = self._labels[node.name] = node.label_map()
        return constraints.fits(node.name, known, node.taints)

    def shortfall(self, node: NodeView, requests: Mapping[str, int]) -> dict[str, int] | None:
        """What our pods on the node must free for the request (empty: it fits now); None when
        even all of them would not do."""
        placed = self.placed.get(node.name, {})
        allocatable, online = node.allocatable, node.online_used
        rooms = []
        for k, v in requests.items():
            room = allocatable.get(k, 0) - online.get(k, 0) - placed.get(k, 0)
            if v > room:
                return None
            rooms.append((k, v - room))
        ours = self.state.ours_on(node.name)
        return {k: gap + ours.get(k, 0) for k, gap in rooms if gap + ours.get(k, 0) > 0}

    def cost(self, node: NodeView, requests: Mapping[str, int]) -> Cost | None:
        """How dear room on the node comes: the worst tier it takes, whether it empties the
        node, how many victims (a dry run in tier order, biggest first); None: no room there.
        Runs for every node a kind of waiting pod may use, so in one pass over our pods there."""
        short = self.shortfall(node, requests)
        if short is None:
            return None
        if not short:
            return (-1, False, 0, node.name)
        state = self.state
        ours = state.left_on(node.name)
        need = list(short.items())
        ladder = []
        for i in ours:
            requests_i = state.pods[i].requests
            cover = 0.0
            for k, n in need:
                a = requests_i.get(k, 0)
                cover += (a if a < n else n) / n
            if cover > 0:
                ladder.append((state.tier(i), -cover, i))
        ladder.sort()
        got = dict.fromkeys(short, 0)
        worst = count = 0
        for tier, _, i in ladder:
            requests_i = state.pods[i].requests
            useful = done = False
            for k, n in need:
                if got[k] < n:
                    useful = useful or requests_i.get(k, 0) > 0
            if not useful:
                continue
            worst, count = tier, count + 1
            done = True
            for k, n in need:
                got[k] += requests_i.get(k, 0)
                done = done and got[k] >= n
            if done:
                break
        return (worst, count < len(ours), count, node.name)

    def _kind(self, pending: PendingPod) -> list[tuple[Cost, int, str]]:
        signature = (pending.constraints, tuple(sorted(pending.requests.items())))
        kind = self.kinds.get(signature)
        if kind is None:
            requests = dict(pending.requests)
            eligible = {n.name for n in self.state.nodes.values() if self._fits(pending.constraints, n)}
            heap: list[tuple[Cost, int, str]] = []
            for name in eligible:
                cost = self.cost(self.state.nodes[name], requests)
                if cost is not None:
                    heap.append((cost, self.state.version.get(name, 0), name))
            heapq.heapify(heap)
            kind = self.kinds[signature] = (requests, eligible, heap)
        return kind[2]

    def _changed(self, name: str) -> None:
        """Re-rank the node for every kind of pod that may go there."""
        self.state.version[name] = self.state.version.get(name, 0) + 1
        for requests, eligible, heap in self.kinds.values():
            if name in eligible:
                cost = self.cost(self.state.nodes[name], requests)
                if cost is not None:
                    heapq.heappush(heap, (cost, self.state.version[name], name))

    def best(self, pending: PendingPod) -> tuple[str, Cost] | None:
        heap = self._kind(pending)
        version = self.state.version
        while heap:
            cost, seen, name = heap[0]
            if seen == version.get(name, 0):
                return name, cost
            heapq.heappop(heap)  # ranked before the node changed
        return None

    def serve(self, pending: PendingPod) -> bool:
        """Room for one waiting pod: victims on the node where they come cheapest. A pod that
        fits somewhere already is not waiting for us: it takes that room (so the next waiting
        pod does not count on it) and no pod of ours goes."""
        best = self.best(pending)
        if best is None:
            return False
        name, cost = best
        if cost[0] >= 0:
            short = self.shortfall(self.state.nodes[name], pending.requests) or {}
            _room_on(self.state, name, short, f"makes room on {name} for waiting online pod {pending.key}: ")
        self.placed[name] = quantities.add(self.placed.get(name, {}), dict(pending.requests))
        self._changed(name)
        return cost[0] >= 0


def _room_on(state: _State, node: str, short: Mapping[str, int], prefix: str) -> None:
    """The cheapest victims on the node that free `short` there; none could be spared."""
    freed: dict[str, int] = {}
    taken: list[int] = []
    while not _covered(freed, short):
        remaining = _remaining(short, freed)
        useful = [i for i in state.left_on(node) if _coverage(state.pods[i].requests, remaining) > 0]
        if not useful:
            break
        cheapest = min(state.tier(i) for i in useful)
        i = state.ranked([i for i in useful if state.tier(i) == cheapest], remaining)[0]
        at = state.take(i, prefix, forced=True)
        taken.append(at)
        freed = quantities.add(freed, _on_node(state, at, node))
    for at in reversed(taken):
        entry = state.order[at]
        assert isinstance(entry, _Unit)
        without = quantities.add(freed, _on_node(state, at, node), -1)
        if _covered(without, short) and not state.limps(entry.job, len(entry.pods)):
            state.give_back(at)
            freed = without


def _on_node(state: _State, at: int, node: str) -> dict[str, int]:
    entry = state.order[at]
    total: dict[str, int] = {}
    for k in _members(entry) if entry is not None else ():
        if state.pods[k].node == node:
            total = quantities.add(total, dict(state.pods[k].requests))
    return total


# -- 3. the member deficit ----------------------------------------------------------------------------


class _Cover:
    """Victims until the member-wide need is freed, then back what it does not require. Works on
    the resources the need names only, as columns of per-pod amounts."""

    def __init__(self, state: _State, need: Mapping[str, int]) -> None:
        self.state = state
        self.names = [k for k, v in need.items() if v > 0]
        self.need = [need[k] for k in self.names]
        self.amounts = [[p.requests.get(k, 0) for p in state.pods] for k in self.names]
        self.freed = [0] * len(self.names)
        for entry in state.order:
            if entry is not None:
                self._add(_members(entry), +1)
        self.buckets: list[list[int]] = [[] for _ in range(TIERS)]
        self.tiers = bytearray(len(state.pods))  # each pod's tier when sorted out; TIERS: frees nothing needed
        self._open: list[str] = []  # nodes that may be emptied at the tier reached
        self._reached: list[str] = []  # all nodes whose pods are all at the tier reached or below
        self._by_tier: list[list[str]] = [[] for _ in range(TIERS + 1)]
        self._totals: dict[str, tuple[int, list[int]]] = {}

    # Loops rather than any()/all() over generators in what runs once per pod: a generator costs
    # more than the test it makes.
    def covered(self) -> bool:
        for f, n in zip(self.freed, self.need, strict=True):  # noqa: SIM110
            if f < n:
                return False
        return True

    def remaining(self) -> dict[str, int]:
        return {k: n - f for k, n, f in zip(self.names, self.need, self.freed, strict=True) if n > f}

    def _add(self, members: Iterable[int], sign: int) -> None:
        for j, col in enumerate(self.amounts):
            self.freed[j] += sign * sum(col[k] for k in members)

    def useful(self, i: int) -> bool:
        for col, f, n in zip(self.amounts, self.freed, self.need, strict=True):  # noqa: SIM110
            if col[i] > 0 and f < n:
                return True
        return False

    def run(self) -> None:
        if self.covered():
            return
        self.sort_out()
        for tier in range(TIERS):
            if self.covered():
                break
            self.whole_nodes(tier)
            self.one_by_one(tier)
        self.prune()

    def sort_out(self) -> None:
        """Each pod left into its tier's bucket (the tier inlined: this runs for every pod)."""
        state = self.state
        taken, tiers, buckets = state.taken, self.tiers, self.buckets
        gang_min, job_left, gang_band = state.gang_min, state.job_left, state.gang_band
        rank = BAND_RANK.get
        cols = self.amounts
        useful: list[int] | list[bool] = cols[0] if len(cols) == 1 else [any(v) for v in zip(*cols, strict=True)]
        node_tier: dict[str, int] = {}
        spare_nodes: set[str] = set()  # with a pod that frees nothing needed: never emptied (an extra victim)
        for i, p in enumerate(state.pods):
            if taken[i]:
                continue
            if not useful[i]:
                tiers[i] = TIERS
                spare_nodes.add(p.node)
                continue
            if p.noticed:
                t = NOTICED + rank(p.band, 1)
            else:
                m = gang_min.get(p.job)
                t = SURPLUS + rank(p.band, 1) if m is None or job_left[p.job] > m else GANG + gang_band[p.job]
            tiers[i] = t
            buckets[t].append(i)
            if t > node_tier.get(p.node, -1):
                node_tier[p.node] = t
        for node, t in node_tier.items():
            if node not in spare_nodes:
                self._by_tier[t].append(node)

    # -- whole machines ------------------------------------------------------------------------------

    def _nodes_by_tier(self) -> list[list[str]]:
        """Nodes by the tier of their dearest pod of ours (`sort_out`)."""
        return self._by_tier

    def _node_total(self, node: str) -> list[int]:
        """What our pods left on the node free of each needed resource (kept while it is unchanged)."""
        version = self.state.version.get(node, 0)
        cached = self._totals.get(node)
        if cached is None or cached[0] != version:
            left = self.state.left_on(node)
            cached = self._totals[node] = (version, [sum(col[i] for i in left) for col in self.amounts])
        return cached[1]

    def _takeable(self, node: str, tier: int) -> list[list[int]] | None:
        """The node's pods as units, if all are takeable at this tier without a job limping."""
        state = self.state
        per_job: dict[str, list[int]] = {}
        for i in state.left_on(node):
            if state.tier(i) > tier:
                return None
            per_job.setdefault(state.pods[i].job, []).append(i)
        units: list[list[int]] = []
        for job, members in per_job.items():
            m = state.gang_min.get(job)
            if m is None or len(members) <= state.job_left[job] - m:
                units.extend([i] for i in members)
            elif len(members) == state.job_left[job]:
                units.append(members)  # the whole gang is here
            else:
                return None
        return units

    def whole_nodes(self, tier: int) -> None:
        """Empty whole nodes whose pods all fit within what is still needed, most first; then
        perhaps one that frees the rest alone (`_last_node`)."""
        self._open.extend(self._nodes_by_tier()[tier])
        self._reached.extend(self._nodes_by_tier()[tier])
        if self.covered() or not self._open:
            return
        state = self.state
        sized = []
        for node in self._open:
            total = self._node_total(node)
            if state.node_left[node] and all(t <= n - f for t, n, f in zip(total, self.need, self.freed, strict=True)):
                sized.append((-sum(t / n for t, n in zip(total, self.need, strict=True)), node, total))
        self._open = [node for _, node, _ in sized]  # the others are worth more than is still needed
        for _, node, total in sorted(sized):
            if any(t > n - f for t, n, f in zip(total, self.need, self.freed, strict=True)):
                continue  # more than is still needed: extra victims
            units = self._takeable(node, tier)
            if units is None:
                continue
            self._empty(node, units)
        if not self.covered():
            self._last_node(tier)

    def _empty(self, node: str, units: list[list[int]]) -> None:
        for members in units:
            reason = f"empties node {node}; {self.state.why(members[0])}"
            self.state.take_exactly(members, reason, whole=len(members) > 1)
            self._add(members, +1)

    def _last_node(self, tier: int) -> None:
        """A node that frees all that is still needed alone, when each of its pods is needed for
        it and it takes no more victims than any choice could (no pod frees more than the
        biggest left): of those, the one that gives back least beyond the need."""
        rem = [n - f for n, f in zip(self.need, self.freed, strict=True)]
        options = []
        for node in self._reached:
            total = self._node_total(node)
            if not self.state.node_left[node] or any(t < r for t, r in zip(total, rem, strict=True)):
                continue
            units = self._takeable(node, tier)
            if units is None or any(self._covers_without(total, members, rem) for members in units):
                continue
            beyond = sum(t / r for t, r in zip(total, rem, strict=True) if r > 0)
            options.append((sum(len(u) for u in units), beyond, node, units))
        if not options:
            return
        fewest = self._fewest_victims(tier, rem)
        best = min((o for o in options if o[0] <= fewest), key=lambda o: (o[1], o[2]), default=None)
        if best is not None:
            self._empty(best[2], best[3])

    def _covers_without(self, total: list[int], members: list[int], rem: list[int]) -> bool:
        return all(t - sum(col[k] for k in members) >= r for t, col, r in zip(total, self.amounts, rem, strict=True))

    def _fewest_victims(self, tier: int, rem: list[int]) -> int:
        """A lower bound on the pods any choice at this tier takes to free `rem`."""
        taken, tiers = self.state.taken, self.tiers
        biggest = [0] * len(rem)
        for t in range(tier + 1):
            for i in self.buckets[t]:
                if not taken[i] and tiers[i] <= tier:
                    for j, col in enumerate(self.amounts):
                        biggest[j] = max(biggest[j], col[i])
        return max((-(-r // b) if b else 1 << 30) for r, b in zip(rem, biggest, strict=True) if r > 0)

    # -- one by one ----------------------------------------------------------------------------------

    def one_by_one(self, tier: int) -> None:
        """Single pods (or whole gangs) of this tier in the order of the rules until covered; in
        no order when all of the tier is needed."""
        state = self.state
        taken, pods = state.taken, state.pods
        entries = [i for i in self.buckets[tier] if not taken[i]]
        if not entries or self.covered():
            return
        short = [n - f for n, f in zip(self.need, self.freed, strict=True)]
        if not any(r > 0 and sum(col[i] for i in entries) >= r for col, r in zip(self.amounts, short, strict=True)):
            took, later = state.take_all(entries, tier)  # all of the tier cannot cover the rest: all goes
            self._add(took, +1)
            for i in later:
                self.buckets[state.tier(i)].append(i)  # its job reached its minimum: its gang comes later
            return
        if tier >= GANG:  # one entry per gang: taking any of its pods takes all of it
            entries = list({pods[i].job: i for i in reversed(entries)}.values())
        entries = state.ranked(entries, self.remaining())  # the tier can cover the rest: in order
        freed, cols, gangs = self.freed, self.amounts, state.gang_min
        for i in entries:
            if self.covered():
                return
            if taken[i]:
                continue
            if pods[i].job in gangs:  # only a gang's pods change tier (as it reaches its minimum)
                t = state.tier(i)
                if t > tier:
                    self.buckets[t].append(i)  # its gang comes later
                    continue
            if state.below_minimum(pods[i].job):
                if any(self.useful(k) for k in state.unit_of(i)):  # the gang frees what is needed
                    self._add(_members(state.order[state.take(i)] or 0), +1)
            elif self.useful(i):
                state.take_single(i)
                for j, col in enumerate(cols):
                    freed[j] += col[i]

    # -- no more than needed -------------------------------------------------------------------------

    def _spare(self, members: list[int]) -> bool:
        """Whether the need stays covered without these pods."""
        for col, f, n in zip(self.amounts, self.freed, self.need, strict=True):
            if f - sum(col[k] for k in members) < n:
                return False
        return True

    def prune(self) -> None:
        """Give back, newest first, what the need does not require; a gang taken whole may be
        cut back to a part above its minimum that does."""
        state = self.state
        order, pods = state.order, state.pods
        single = self.amounts[0] if len(self.amounts) == 1 else None
        for at in range(len(order) - 1, -1, -1):
            entry = order[at]
            if entry is None or (isinstance(entry, _Unit) and entry.forced):
                continue
            if isinstance(entry, int):
                spare = single[entry] <= self.freed[0] - self.need[0] if single else self._spare([entry])
                if spare and not state.limps(pods[entry].job, 1):
                    state.give_back(at)
                    self._add([entry], -1)
            elif self._spare(entry.pods) and not state.limps(entry.job, len(entry.pods)):
                state.give_back(at)
                self._add(entry.pods, -1)
            elif entry.whole:
                self._cut_gang(entry.job)

    def _cut_gang(self, job: str) -> None:
        """A gang taken whole when a part of it above its minimum would do: that part instead."""
        state = self.state
        most = len(state.job_pods[job]) - state.gang_min[job]  # the most it may lose one by one
        if most <= 0 or state.job_left[job] > 0:
            return
        mine = [at for at, e in enumerate(state.order) if e is not None and state.pods[_members(e)[0]].job == job]
        if any(isinstance(state.order[at], _Unit) and state.order[at].forced for at in mine):  # type: ignore[union-attr]
            return
        members = state.job_pods[job]
        base = [f - sum(col[k] for k in members) for col, f in zip(self.amounts, self.freed, strict=True)]
        part = self._part(members, most, base)
        if part is None:
            return
        for at in mine:
            state.give_back(at)
        self._add(members, -1)
        for k in part:
            state.take_single(k)
            self._add([k], +1)
        for at in range(len(state.order) - len(part), len(state.order)):
            entry = state.order[at]
            if isinstance(entry, int) and self._spare([entry]):
                state.give_back(at)
                self._add([entry], -1)

    def _part(self, members: list[int], most: int, base: list[int]) -> list[int] | None:
        """The fewest of the gang's pods (no more than `most`) that, with `base` freed, cover."""
        state = self.state
        order = sorted(members, key=lambda k: (state.tier(k), state.pods[k].deletion_cost, state.pods[k].key))
        tried = 0
        for size in range(1, most + 1):
            for combo in itertools.combinations(order, size):
                tried += 1
                if tried > SUBSETS_TRIED:
                    return None
                if all(
                    b + sum(col[k] for k in combo) >= n for col, b, n in zip(self.amounts, base, self.need, strict=True)
                ):
                    return list(combo)
        return None


def plan(
    *,
    nodes: list[NodeView],
    pods: list[OurPod],
    deficit: Mapping[str, int] | None = None,
    pending: list[PendingPod] | None = None,
) -> Plan:
    """The victims that drain unusable nodes, make room for the `pending` online pods and free
    `deficit` member-wide."""
    result = Plan(deficit={k: v for k, v in (deficit or {}).items() if v > 0})
    if not result.deficit and not pending and not any(n.unusable for n in nodes):
        return result  # nothing to give back (the usual case): every notice can be withdrawn
    state = _State(nodes, pods)
    _drain_unusable(state)
    if pending:
        room = _Room(state)
        for waiting in sorted(pending, key=lambda p: (-p.priority, p.key)):
            if room.serve(waiting):
                result.served.append(waiting.key)
    cover = _Cover(state, result.deficit)
    cover.run()
    result.unmet = cover.remaining()
    victims = result.victims
    alone: dict[tuple[bool, str], str] = {}  # the reason of a pod taken alone: by notice and band
    for entry in state.order:
        if isinstance(entry, int):
            pod = pods[entry]
            reason = alone.get((pod.noticed, pod.band))
            if reason is None:
                reason = alone[(pod.noticed, pod.band)] = state.reason(entry)
            victims.append(Victim(pod, reason))
        elif entry is not None:
            victims.extend(Victim(pods[k], entry.reason) for k in entry.pods)
    emptied = {v.pod.node for v in victims}
    result.nodes_emptied = sorted(n for n in emptied if state.node_left.get(n) == 0)
    return result
