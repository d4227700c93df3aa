"""The planner's ledger (pure): our pods on one member as a plan takes them, who is left per
node and per job, in what order they were taken and why, and how candidates rank by the rules
(federation.reclaim.planner). Step 1, draining unusable nodes, is here too.
"""

from __future__ import annotations

from collections.abc import Mapping

from federation.reclaim.planmodel import (
    BAND_RANK,
    GANG,
    NOTICED,
    SURPLUS,
    Entry,
    NodeView,
    OurPod,
    Unit,
    members_of,
)


class Ledger:
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
                    took.extend(members_of(self.order[self.take(i)] or 0))
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
        self.order.append(Unit(members, reason, forced, self.pods[members[0]].job, whole))
        return len(self.order) - 1

    def give_back(self, at: int) -> None:
        entry = self.order[at]
        self.order[at] = None
        if entry is not None:
            for k in members_of(entry):
                self._moved(k, +1)

    def reason(self, entry: int | Unit) -> str:
        if isinstance(entry, Unit):
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
                within = got <= v
            else:
                cover = size = 0.0
                within = True
                for name, v in wanted:
                    got = freed.get(name, 0)
                    cover += (got if got < v else v) / v
                    size += got / v
                    within = within and got <= v
            keyed.append(
                (
                    # the last of ours there first (empties a machine), then the last in its NUMA zone;
                    # a machine only where the need is its worth or more: one bigger than the need
                    # ranks as any pod, so a smaller pod that does is taken instead
                    (node_left[p.node] != 1 or not within) * 2
                    + (True if p.numa_zone is None else not self.numa_whole(i)),
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


def drain_unusable(state: Ledger) -> None:
    """Every pod of ours on a node we may not use goes, as a drain would take it."""
    for node in state.nodes.values():
        if node.unusable is None:
            continue
        for i in state.on_node.get(node.name, ()):
            if not state.taken[i]:
                state.take(i, f"{node.unusable}: our pods there go first; ", forced=True)
