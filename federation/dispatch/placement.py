"""Where a job goes (pure): the members that can host its gang as a whole, best first.

A gang fits a member when its pods can be packed onto that member's nodes (first-fit
decreasing by GPUs, then CPU), restricted to the job's GPU model, and for "same network pod"
or "same GPU model" jobs, within one domain of that label. Candidates are ordered by member
weight, then by the tightest fit (least capacity left over in the chosen domain), so big
free areas stay free for big jobs. The member's own scheduler still places every pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from federation.capacity import quantities
from federation.capacity.summary import MemberCapacity, NodeFree
from federation.jobs import GangSpec


@dataclass(frozen=True, slots=True)
class Placement:
    member: str
    network_pod: str | None = None  # the domain chosen for a same-network-pod gang
    gpu_model: str | None = None  # the model chosen for a same-GPU-model gang
    leftover: int = 0  # millicores left in the chosen nodes after the gang (tighter is better)


def _order(request: dict[str, int]) -> tuple[int, int, int]:
    return (request.get(quantities.GPU, 0), request.get(quantities.CPU, 0), request.get(quantities.MEMORY, 0))


def pack(nodes: Iterable[NodeFree], requests: list[dict[str, int]]) -> int | None:
    """Pack the requests onto the nodes (first fit, largest first); the CPU left over, or None."""
    if len(requests) == 1:  # a plain pod, the most common case: no copy of every node's vector
        nodes = list(nodes)
        request = requests[0]
        if not any(quantities.fits(request, n.free) for n in nodes):
            return None
        return sum(n.free.get(quantities.CPU, 0) for n in nodes) - request.get(quantities.CPU, 0)
    free = [dict(n.free) for n in nodes]
    for request in sorted(requests, key=_order, reverse=True):
        for vec in free:
            if quantities.fits(request, vec):
                for name, value in request.items():
                    vec[name] = vec.get(name, 0) - value
                break
        else:
            return None
    return sum(v.get(quantities.CPU, 0) for v in free)


def _domains(nodes: list[NodeFree], attribute: str) -> dict[str | None, list[NodeFree]]:
    out: dict[str | None, list[NodeFree]] = {}
    for node in nodes:
        out.setdefault(getattr(node, attribute), []).append(node)
    return out


def _within_sum(capacity: MemberCapacity, total: dict[str, int], held: dict[str, int] | None) -> bool:
    """The gang's sum within what the member lends in all, less the room pods sent there and not
    yet on a node will take. Each node's free vector is clamped to that sum, but not their
    total: under a cap, two nodes of 6 free cores each lend 6 cores, not 12."""
    if not capacity.lendable:
        return True  # nothing summed (a member with no lendable node): the nodes decide
    return quantities.fits(quantities.add(total, held) if held else total, capacity.lendable)


def candidates(
    capacities: dict[str, MemberCapacity],
    requests: list[dict[str, int]],
    gang: GangSpec,
    *,
    weights: dict[str, int] | None = None,
    exclude: Iterable[str] = (),
    reserved: dict[str, dict[str, int]] | None = None,
) -> list[Placement]:
    """Members able to take all of `requests` at once, best first. `reserved`: what pods already
    sent to a member, not yet on a node there, will take of its lendable sum (no node known)."""
    excluded = set(exclude)
    found: list[tuple[int, int, Placement]] = []
    total: dict[str, int] = {}
    for request in requests:
        total = quantities.add(total, request)
    for name, capacity in capacities.items():
        if name in excluded or not capacity.reachable:
            continue
        if not _within_sum(capacity, total, (reserved or {}).get(name)):
            continue
        nodes = [n for n in capacity.nodes if gang.gpu_model is None or n.gpu_product == gang.gpu_model]
        options: list[Placement] = []
        if gang.same_network:
            for domain, members in _domains(nodes, "network_pod").items():
                left = pack(members, requests) if domain else None
                if left is not None:
                    options.append(Placement(name, network_pod=domain, leftover=left))
        elif gang.same_gpu_model and gang.gpu_model is None:
            for model, members in _domains(nodes, "gpu_product").items():
                left = pack(members, requests) if model else None
                if left is not None:
                    options.append(Placement(name, gpu_model=model, leftover=left))
        else:
            left = pack(nodes, requests)
            if left is not None:
                options.append(Placement(name, gpu_model=gang.gpu_model, leftover=left))
        if options:
            best = min(options, key=lambda p: (p.leftover, p.network_pod or "", p.gpu_model or ""))
            found.append((-(weights or {}).get(name, 1), best.leftover, best))
    return [p for _, _, p in sorted(found, key=lambda t: (t[0], t[1], t[2].member))]


def _amounts(vec: dict[str, int]) -> str:
    """A vector as a reader's list: CPU in cores, memory in GiB, GPUs, nothing zero."""
    parts = []
    if vec.get(quantities.CPU):
        parts.append(f"{vec[quantities.CPU] / 1000:g} CPU")
    if vec.get(quantities.MEMORY):
        gib = vec[quantities.MEMORY] / 2**30
        parts.append(f"{gib:.0f}Gi memory" if gib >= 10 else f"{gib:.2g}Gi memory")
    if vec.get(quantities.GPU):
        parts.append(f"{vec[quantities.GPU]} GPUs")
    return ", ".join(parts) or "nothing"


def shortfall(
    capacities: dict[str, MemberCapacity],
    requests: list[dict[str, int]],
    gang: GangSpec,
    *,
    exclude: Iterable[str] = (),
    reserved: dict[str, dict[str, int]] | None = None,
) -> str:
    """Why no member takes the gang now (when `candidates` found none), one clause per member,
    for the pods' status and Event: what it lends against what the gang needs at once."""
    total: dict[str, int] = {}
    for request in requests:
        total = quantities.add(total, request)
    excluded = set(exclude)
    clauses = []
    for name in sorted(capacities):
        capacity = capacities[name]
        if name in excluded:
            clauses.append(f"{name} excluded (did not take the gang in time, or refuses it)")
        elif not capacity.reachable:
            clauses.append(f"{name} unreachable")
        elif not _within_sum(capacity, total, (reserved or {}).get(name)):
            clauses.append(f"{name} lends {_amounts(capacity.lendable)}")
        else:
            where = f" of GPU model {gang.gpu_model}" if gang.gpu_model else ""
            within = " within one network pod" if gang.same_network else ""
            most = capacity.largest.get("gpu" if total.get(quantities.GPU) else "cpu")
            free = f" (the most free on one node: {_amounts(most)})" if most else ""
            clauses.append(
                f"{name} lends {_amounts(capacity.lendable)} but its nodes{where} cannot hold the pods{within}{free}"
            )
    members = "; ".join(clauses) if clauses else "no member is configured"
    return f"no member can take the gang's {len(requests)} pods ({_amounts(total)}) at once: {members}"
