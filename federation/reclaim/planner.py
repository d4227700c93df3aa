"""Which of our pods give capacity back, and why (pure: table-tested, no I/O).

Given one member's nodes, our pods there, what the member must get back (a member-wide
deficit: our pods hold more than the member lends now) and online pods that wait for room
without preempting, `plan` picks the cheapest victims:

- lowest band first: worker-max, then worker-min, then PS last;
- a job's pods above its gang minimum (elastic workers, plain pods) before any job loses its
  minimum; a gang never limps: when a pod of its minimum must go, the whole gang goes;
- whole machines first: victims that empty a node completely; then a whole NUMA zone (where the
  member reports which zone a pod runs in); then pods that leave their job more homogeneous
  (from the network pod and GPU model where the job has fewest pods);
- `controller.kubernetes.io/pod-deletion-cost` as a tie-breaker, lower first;
- no more than needed: choices that turn out unnecessary are dropped again, newest first.
Pods already under notice are taken first, so a plan recomputed each second keeps its
earlier victims while they are still needed and drops them (cancelling their notice) when not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from federation.capacity import quantities

BAND_RANK = {"worker-max": 0, "worker-min": 1, "ps": 2}
NOTICED_TIER = -1  # pods already under notice: taken before anything else
SURPLUS_TIER = 0  # a job's pods above its minimum
GANG_TIER = 1  # a whole gang, below its minimum


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

    def matches(self, selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
        """Whether a pending pod's node selector can match, as far as we know the labels."""
        known = {**labels, "kubernetes.io/hostname": self.name}
        return all(known.get(k) == v for k, v in selector.items() if k in known or k.startswith("vkprovider.io/"))


@dataclass(frozen=True, slots=True)
class PendingPod:
    """An online pod that waits for room and will not preempt (preemptionPolicy: Never)."""

    key: str
    requests: Mapping[str, int]
    priority: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Victim:
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


def _sum(pods: Iterable[OurPod]) -> dict[str, int]:
    total: dict[str, int] = {}
    for pod in pods:
        total = quantities.add(total, dict(pod.requests))
    return total


def _remaining(need: Mapping[str, int], freed: Mapping[str, int]) -> dict[str, int]:
    return {k: v - freed.get(k, 0) for k, v in need.items() if v - freed.get(k, 0) > 0}


@dataclass
class _Group:
    """Victims chosen together (one pod, a whole node, a whole gang): kept or dropped as one."""

    pods: list[OurPod]
    reason: str
    forced: bool = False  # chosen for a pending pod on its node: not pruned by the member deficit


class _State:
    def __init__(self, nodes: list[NodeView], pods: list[OurPod]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.left: dict[str, OurPod] = {p.key: p for p in pods}  # not (yet) chosen
        on_node: dict[str, set[str]] = {}
        by_job: dict[str, set[str]] = {}
        job_left: dict[str, int] = {}
        job_min: dict[str, int] = {}
        job_band: dict[str, int] = {}  # a gang's rank: its highest band
        rank = BAND_RANK.get
        for p in pods:
            job, key = p.job, p.key
            on_node.setdefault(p.node, set()).add(key)
            by_job.setdefault(job, set()).add(key)
            job_left[job] = job_left.get(job, 0) + 1
            if p.gang_min > 1 and p.gang_min > job_min.get(job, 0):
                job_min[job] = p.gang_min
            else:
                job_min.setdefault(job, 0)
            band = rank(p.band, 1)
            if band > job_band.get(job, -1):
                job_band[job] = band
        self.on_node, self.by_job, self.job_left, self.job_min, self.job_band = (
            on_node,
            by_job,
            job_left,
            job_min,
            job_band,
        )
        #: Per job, how many of its pods are left per network pod and GPU model (for homogeneity;
        #: computed when first asked, dropped when the job's pods change).
        self._domains: dict[str, dict[tuple[str, str | None], int]] = {}
        self._node_domains: dict[str, tuple[tuple[str, str | None], tuple[str, str | None]]] = {}
        self._ours_sum: dict[str, dict[str, int]] = {}
        self.groups: list[_Group] = []

    # -- what can be taken ----------------------------------------------------------------------

    def surplus(self, job: str) -> int:
        return self.job_left[job] - self.job_min[job]

    def tier_of(self, pod: OurPod) -> tuple[int, int]:
        if pod.noticed:
            return (NOTICED_TIER, BAND_RANK.get(pod.band, 1))
        if self.surplus(pod.job) > 0:
            return (SURPLUS_TIER, BAND_RANK.get(pod.band, 1))
        return (GANG_TIER, self.job_band[pod.job])

    def gang(self, job: str) -> list[OurPod]:
        return [self.left[k] for k in sorted(self.by_job.get(job, ()))]

    def _domains_of(self, pod: OurPod) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
        domains = self._node_domains.get(pod.node)
        if domains is None:
            node = self.nodes.get(pod.node)
            domains = ("np", node.network_pod if node else None), ("gpu", node.gpu_model if node else None)
            self._node_domains[pod.node] = domains
        return domains

    def _job_domains(self, job: str) -> dict[tuple[str, str | None], int]:
        counts = self._domains.get(job)
        if counts is None:
            counts = {}
            left, domains_of = self.left, self._domains_of
            for key in self.by_job.get(job, ()):
                network_pod, gpu_model = domains_of(left[key])
                counts[network_pod] = counts.get(network_pod, 0) + 1
                counts[gpu_model] = counts.get(gpu_model, 0) + 1
            self._domains[job] = counts
        return counts

    def take(self, group: _Group) -> None:
        for pod in group.pods:
            del self.left[pod.key]
            self.on_node[pod.node].discard(pod.key)
            self.by_job[pod.job].discard(pod.key)
            self.job_left[pod.job] -= 1
            self._domains.pop(pod.job, None)
            self._ours_sum.pop(pod.node, None)
        self.groups.append(group)

    def give_back(self, group: _Group) -> None:
        self.groups.remove(group)
        for pod in group.pods:
            self.left[pod.key] = pod
            self.on_node.setdefault(pod.node, set()).add(pod.key)
            self.by_job.setdefault(pod.job, set()).add(pod.key)
            self.job_left[pod.job] += 1
            self._domains.pop(pod.job, None)
            self._ours_sum.pop(pod.node, None)

    def ours_on(self, node: str) -> dict[str, int]:
        """What our pods still left on the node hold (kept up to date as pods are taken)."""
        held = self._ours_sum.get(node)
        if held is None:
            held = self._ours_sum[node] = _sum(self.left[k] for k in self.on_node.get(node, ()))
        return held

    def physical_free(self, node: NodeView) -> dict[str, int]:
        ours, online = self.ours_on(node.name), node.online_used
        return {k: v - online.get(k, 0) - ours.get(k, 0) for k, v in node.allocatable.items()}

    # -- ordering --------------------------------------------------------------------------------

    def homogeneity(self, pod: OurPod) -> float:
        """Lower first: the share of its job in the pod's network pod and GPU model (taking a pod
        from where its job is thinnest leaves the rest more together)."""
        if self.surplus(pod.job) <= 0:
            return 0.0  # the whole job goes: nothing of it stays behind to keep together
        total = max(1, self.job_left.get(pod.job, 1))
        counts = self._job_domains(pod.job)
        return sum(counts.get(domain, 0) for domain in self._domains_of(pod)) / total

    def numa_whole(self, pod: OurPod, chosen: set[str]) -> bool:
        """Whether taking the pod (with those already chosen) empties its NUMA zone of ours."""
        if pod.numa_zone is None:
            return False
        same = [k for k in self.on_node.get(pod.node, ()) if self.left[k].numa_zone == pod.numa_zone]
        return all(k == pod.key or k in chosen for k in same)

    def unit_requests(self, pod: OurPod) -> dict[str, int]:
        """What taking the pod frees: the pod, or its whole gang when below its minimum."""
        if self.surplus(pod.job) > 0:
            return dict(pod.requests)
        return _sum(self.left[k] for k in self.by_job[pod.job])

    def pod_key(self, pod: OurPod, *, need: Mapping[str, int], chosen: set[str]) -> tuple[object, ...]:
        tier = self.tier_of(pod)
        freed = pod.requests if self.surplus(pod.job) > 0 else self.unit_requests(pod)
        cover = size = 0.0
        for name, wanted in need.items():
            if wanted > 0:
                got = freed.get(name, 0)
                cover += (got if got < wanted else wanted) / wanted
                size += got / wanted  # least given back beyond the need
        return (
            tier,
            pod.numa_zone is None or not self.numa_whole(pod, chosen),
            self.homogeneity(pod),
            pod.deletion_cost,
            -cover,
            size,
            pod.key,
        )


def _why(tier: tuple[int, int], pod: OurPod) -> str:
    band = f"band {pod.band}"
    if tier[0] == NOTICED_TIER:
        return f"already under notice ({band})"
    if tier[0] == SURPLUS_TIER:
        return f"{band}, above its job's minimum"
    return f"{band}; its gang ({pod.job}) goes whole rather than below its minimum of {pod.gang_min}"


def _tiers() -> list[tuple[int, int]]:
    return [(t, b) for t in (NOTICED_TIER, SURPLUS_TIER, GANG_TIER) for b in sorted(set(BAND_RANK.values()))]


def _units(state: _State, tier: tuple[int, int], nodes: set[str] | None) -> list[OurPod]:
    """Pods takeable one by one at this tier or below (gang pods come as whole gangs)."""
    out = []
    for pod in state.left.values():
        if nodes is not None and pod.node not in nodes:
            continue
        t = state.tier_of(pod)
        if t <= tier:
            out.append(pod)
    return out


def _take_unit(state: _State, pod: OurPod, reason_prefix: str, *, forced: bool = False) -> _Group:
    tier = state.tier_of(pod)
    if state.surplus(pod.job) <= 0:  # below its minimum (also a gang noticed earlier): all of it
        group = _Group(state.gang(pod.job), f"{reason_prefix}{_why(tier, pod)}", forced=forced)
    else:
        group = _Group([pod], f"{reason_prefix}{_why(tier, pod)}", forced=forced)
    state.take(group)
    return group


def _node_takeable(state: _State, node: str, tier: tuple[int, int]) -> list[OurPod] | None:
    """All our pods on the node, if every one is takeable one by one at this tier without
    pushing its job below its minimum (gangs go whole, elsewhere); else None."""
    keys = state.on_node.get(node)
    if not keys:
        return None
    pods = [state.left[k] for k in keys]
    per_job: dict[str, int] = {}
    for p in pods:
        if state.tier_of(p) > tier:
            return None
        per_job[p.job] = per_job.get(p.job, 0) + 1
    if any(state.surplus(j) < n for j, n in per_job.items()):
        return None
    return pods


def _whole_nodes(state: _State, tier: tuple[int, int], need: dict[str, int], freed: dict[str, int]) -> None:
    """Empty whole nodes whose every pod of ours is takeable one by one at this tier: the ones
    that cover most first (fewest nodes in all), and for the last part, the smallest node that
    covers it alone (least given back beyond the need)."""
    if _covered(freed, need):
        return
    remaining = _remaining(need, freed)
    sizes: list[tuple[float, str]] = []
    for node in state.on_node:
        pods = _node_takeable(state, node, tier)
        if pods is not None:
            cover = _coverage(_sum(pods), remaining)
            if cover > 0:
                sizes.append((cover, node))
    sizes.sort(key=lambda s: (-s[0], s[1]))
    for _, candidate in sizes:
        if _covered(freed, need):
            return
        remaining = _remaining(need, freed)
        node = candidate
        pods = _node_takeable(state, node, tier)
        if pods is None:
            continue
        total = _sum(pods)
        if _covered(total, remaining):
            # This one covers the rest alone: the smallest node that does instead.
            alone = []
            for other in state.on_node:
                other_pods = _node_takeable(state, other, tier)
                if other_pods is None:
                    continue
                other_total = _sum(other_pods)
                if _covered(other_total, remaining):
                    alone.append((sum(other_total.get(k, 0) / v for k, v in remaining.items()), other, other_pods))
            _, node, pods = min(alone, key=lambda a: (a[0], a[1]))
        if _coverage(_sum(pods), remaining) <= 0:
            continue
        pods.sort(key=lambda p: p.key)
        reasons = sorted({_why(state.tier_of(p), p) for p in pods})
        state.take(_Group(pods, f"empties node {node}: " + "; ".join(reasons)))
        freed.update(quantities.add(freed, _sum(pods)))


def _one_by_one(
    state: _State, tier: tuple[int, int], need: dict[str, int], freed: dict[str, int], nodes: set[str] | None
) -> None:
    """Single pods (or whole gangs), in the order of the rules, until the need is covered."""
    if _covered(freed, need):
        return
    remaining = _remaining(need, freed)
    units = [p for p in _units(state, tier, nodes) if _coverage(p.requests, remaining) > 0]
    units.sort(key=lambda p: state.pod_key(p, need=remaining, chosen=set()))
    chosen: set[str] = set()
    for pod in units:
        if _covered(freed, need):
            return
        if pod.key not in state.left or _coverage(pod.requests, _remaining(need, freed)) <= 0:
            continue
        group = _take_unit(state, pod, "")
        for p in group.pods:
            chosen.add(p.key)
            freed.update(quantities.add(freed, dict(p.requests)))


def _prune(state: _State, need: Mapping[str, int], groups: list[_Group]) -> None:
    """Give back, newest first, what the need turns out not to require."""
    freed = _sum(p for g in groups for p in g.pods)
    for group in reversed(list(groups)):
        if group.forced:
            continue
        without = quantities.add(freed, _sum(group.pods), -1)
        # Giving a pod back must not leave its job between none and its minimum (a limping gang).
        back: dict[str, int] = {}
        for pod in group.pods:
            back[pod.job] = back.get(pod.job, 0) + 1
        if any(0 < state.job_left[j] + n < state.job_min[j] for j, n in back.items()):
            continue
        if _covered(without, need):
            freed = without
            groups.remove(group)
            state.give_back(group)


def _place(state: _State, node: NodeView, pending: PendingPod) -> None:
    """The pending pod takes room on the node: later pending pods see it used."""
    state.nodes[node.name] = NodeView(
        node.name,
        node.allocatable,
        quantities.add(dict(node.online_used), dict(pending.requests)),
        node.ready,
        node.schedulable,
        node.network_pod,
        node.gpu_model,
        node.zone,
    )


def _serve_pending(state: _State, pending: PendingPod, labels_of: Mapping[str, Mapping[str, str]]) -> bool:
    """Make room on one node for a pending online pod: the node where the cheapest victims do.
    A pod that fits somewhere already is not waiting for us: it takes that room (so the next
    pending pod does not count on it) and no pod of ours goes."""
    options = []
    feasible: list[tuple[NodeView, dict[str, int]]] = []
    wanted = pending.requests.items()
    selector = pending.node_selector
    for node in state.nodes.values():
        if not (node.ready and node.schedulable) or (selector and not node.matches(selector, labels_of[node.name])):
            continue
        ours_there, online, allocatable = state.ours_on(node.name), node.online_used, node.allocatable
        need = {}
        for k, v in wanted:
            short = v - (allocatable.get(k, 0) - online.get(k, 0) - ours_there.get(k, 0))
            if short > 0:
                need[k] = short
        if not need:
            _place(state, node, pending)
            return False
        if _covered(ours_there, need):
            feasible.append((node, need))
    for node, need in feasible:
        ours = [state.left[k] for k in state.on_node.get(node.name, ())]
        # Dry run: the victims this node would need, cheapest tier and biggest first (a cost
        # estimate to compare nodes; the real choice below orders by every rule).
        picked: list[OurPod] = []
        got: dict[str, int] = {}
        for pod in sorted(ours, key=lambda p: (state.tier_of(p), -_coverage(p.requests, need), p.key)):
            if _covered(got, need):
                break
            if _coverage(pod.requests, _remaining(need, got)) <= 0:
                continue
            picked.append(pod)
            got = quantities.add(got, dict(pod.requests))
        worst = max(state.tier_of(p) for p in picked)
        empties = len(picked) == len(ours)
        options.append(((worst, not empties, len(picked), node.name), node, need))
    if not options:
        return False
    _, node, need = min(options, key=lambda o: o[0])
    freed: dict[str, int] = {}
    chosen: set[str] = set()
    while not _covered(freed, need):
        ours = [state.left[k] for k in state.on_node.get(node.name, ())]
        useful = [p for p in ours if _coverage(p.requests, _remaining(need, freed)) > 0]
        if not useful:
            break
        pod = min(useful, key=lambda p: state.pod_key(p, need=_remaining(need, freed), chosen=chosen))
        group = _take_unit(state, pod, f"makes room on {node.name} for waiting online pod {pending.key}: ", forced=True)
        for p in group.pods:
            chosen.add(p.key)
            if p.node == node.name:
                freed = quantities.add(freed, dict(p.requests))
    _place(state, node, pending)
    return True


def plan(
    *,
    nodes: list[NodeView],
    pods: list[OurPod],
    deficit: Mapping[str, int] | None = None,
    pending: list[PendingPod] | None = None,
) -> Plan:
    """The victims that free `deficit` member-wide and room for the `pending` online pods."""
    result = Plan(deficit={k: v for k, v in (deficit or {}).items() if v > 0})
    if not result.deficit and not pending:
        return result  # nothing to give back (the usual case): every notice can be withdrawn
    state = _State(nodes, pods)
    labels_of: dict[str, dict[str, str]] = {}
    if pending:
        for n in nodes:
            known = (
                ("nvidia.com/gpu.product", n.gpu_model),
                ("vkprovider.io/network-pod", n.network_pod),
                ("topology.kubernetes.io/zone", n.zone),
            )
            labels_of[n.name] = {k: v for k, v in known if v}
    for waiting in sorted(pending or [], key=lambda p: (-p.priority, p.key)):
        if _serve_pending(state, waiting, labels_of):
            result.served.append(waiting.key)
    need = dict(result.deficit)
    freed = _sum(p for g in state.groups for p in g.pods)
    groups_before = len(state.groups)
    noticed = any(p.noticed for p in state.left.values())
    present = {BAND_RANK.get(p.band, 1) for p in state.left.values()}
    for tier in _tiers():
        if _covered(freed, need):
            break
        if (tier[0] == NOTICED_TIER and not noticed) or tier[1] not in present:
            continue  # nothing of ours sits at this tier: no need to look
        _whole_nodes(state, tier, need, freed)
        _one_by_one(state, tier, need, freed, None)
    _prune(state, need, state.groups[groups_before:])
    freed = _sum(p for g in state.groups for p in g.pods)
    result.unmet = _remaining(need, freed)
    for group in state.groups:
        for pod in group.pods:
            result.victims.append(Victim(pod, group.reason))
    before = {p.node for p in pods}
    after = {p.node for p in state.left.values()}
    result.nodes_emptied = sorted(before - after)
    return result
