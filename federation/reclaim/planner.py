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

from collections.abc import Mapping

from federation.reclaim.cover import Cover
from federation.reclaim.ledger import Ledger, drain_unusable
from federation.reclaim.planmodel import BAND_RANK, NodeView, OurPod, PendingPod, Plan, Victim, deficit
from federation.reclaim.room import Room

__all__ = ["BAND_RANK", "NodeView", "OurPod", "PendingPod", "Plan", "Victim", "deficit", "plan"]


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
    state = Ledger(nodes, pods)
    drain_unusable(state)
    if pending:
        room = Room(state)
        for waiting in sorted(pending, key=lambda p: (-p.priority, p.key)):
            if room.serve(waiting):
                result.served.append(waiting.key)
    cover = Cover(state, result.deficit)
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
