"""Step 2 of a plan (pure): room for online pods that wait without preempting, one node each,
where they fit as kube-scheduler would judge them (federation.capacity.fit) and the cheapest
victims do.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from federation.capacity import fit, quantities
from federation.reclaim.ledger import Ledger
from federation.reclaim.planmodel import Cost, NodeView, PendingPod, Unit, covers, members_of, share_of, short_of

# -- 2. waiting online pods ---------------------------------------------------------------------------


class Room:
    """Room for waiting online pods, one node each. Nodes are ranked once per kind of pod
    (constraints and requests); a choice re-ranks only the node it changed."""

    def __init__(self, state: Ledger) -> None:
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
            room_on(self.state, name, short, f"makes room on {name} for waiting online pod {pending.key}: ")
        self.placed[name] = quantities.add(self.placed.get(name, {}), dict(pending.requests))
        self._changed(name)
        return cost[0] >= 0


def room_on(state: Ledger, node: str, short: Mapping[str, int], prefix: str) -> None:
    """The cheapest victims on the node that free `short` there; none could be spared."""
    freed: dict[str, int] = {}
    taken: list[int] = []
    while not covers(freed, short):
        remaining = short_of(short, freed)
        useful = [i for i in state.left_on(node) if share_of(state.pods[i].requests, remaining) > 0]
        if not useful:
            break
        cheapest = min(state.tier(i) for i in useful)
        i = state.ranked([i for i in useful if state.tier(i) == cheapest], remaining)[0]
        at = state.take(i, prefix, forced=True)
        taken.append(at)
        freed = quantities.add(freed, on_node(state, at, node))
    for at in reversed(taken):
        entry = state.order[at]
        assert isinstance(entry, Unit)
        without = quantities.add(freed, on_node(state, at, node), -1)
        if covers(without, short) and not state.limps(entry.job, len(entry.pods)):
            state.give_back(at)
            freed = without


def on_node(state: Ledger, at: int, node: str) -> dict[str, int]:
    entry = state.order[at]
    total: dict[str, int] = {}
    for k in members_of(entry) if entry is not None else ():
        if state.pods[k].node == node:
            total = quantities.add(total, dict(state.pods[k].requests))
    return total
