"""Gangs across native and virtual nodes (pure): how much of a job's minimum leaves for a member.

A hybrid job keeps its floor (launcher, workers up to its minimum) on the offline cluster's own
nodes and accelerates on lent capacity. Its minimum counts its pods bound anywhere in the front
end, on native nodes and on our virtual node(s); native pods run where they are, and only the
virtual part goes to a member:

- native pods alone meet the minimum: every virtual pod is elastic; it goes to the job's member
  on its own, as capacity there allows, with no gang object in the member;
- native and virtual pods together meet it: the virtual pods needed to complete it (highest bands
  first) leave as one gang, whose member-side minimum is that count; the rest are elastic. A job
  split 2 + 2 starts whole or not at all: its 2 virtual pods are a gang of 2 in the member;
- otherwise the job waits at the front end, its pods' message naming both counts.

A pod counts as native when it is bound to a node that is not one of this provider's virtual
nodes, has not ended and is not being deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from federation import bands
from federation.jobs import JobRef, job_of

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Split:
    ready: bool
    core: tuple[str, ...]  # virtual pods that leave as the gang
    elastic: tuple[str, ...]  # virtual pods that follow one by one
    member_min: int  # the member gang's minimum: 0 or 1 means no gang object there


def split(minimum: int, native: int, virtual: Mapping[str, str]) -> Split:
    """`virtual`: the job's pods on our virtual node(s), key -> band, in arrival order."""
    need = max(0, minimum - native)
    ranked = sorted(virtual, key=lambda k: -bands.RANK.get(virtual[k], bands.RANK[bands.DEFAULT]))
    if len(ranked) < need:
        return Split(ready=False, core=(), elastic=(), member_min=need)
    return Split(ready=True, core=tuple(ranked[:need]), elastic=tuple(ranked[need:]), member_min=need)


def native_pods(pods: Iterable[Mapping[str, Any]], job: JobRef, virtual_nodes: set[str]) -> set[str]:
    """Keys (ns/name) of the job's pods that hold their place on native nodes."""
    out = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or node in virtual_nodes or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        if job_of(dict(pod)) == job:
            out.add(f"{meta.get('namespace')}/{meta.get('name')}")
    return out
