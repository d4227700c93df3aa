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
        held = (reserved or {}).get(name)
        if held and capacity.lendable and not quantities.fits(quantities.add(total, held), capacity.lendable):
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
