"""A ClusterQueue's quota for one ResourceFlavor from a virtual node's allocatable (pure).

Only the resources the ClusterQueue already covers for that flavor are set: which resources
Kueue accounts for is the queue's owner's choice, not ours.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from federation.capacity import quantities


def with_quota(spec: Mapping[str, Any], flavor: str, allocatable: Mapping[str, str]) -> dict[str, Any] | None:
    """`spec.resourceGroups` with each covered resource of `flavor` given the node's allocatable
    as its nominalQuota; None when nothing changes (or the queue has no such flavor)."""
    groups = copy.deepcopy(list(spec.get("resourceGroups") or []))
    changed = False
    for group in groups:
        for entry in group.get("flavors") or []:
            if entry.get("name") != flavor:
                continue
            for resource in entry.get("resources") or []:
                name = resource.get("name")
                if name not in allocatable:
                    continue
                wanted = allocatable[name]
                if not _same(name, resource.get("nominalQuota"), wanted):
                    resource["nominalQuota"] = wanted
                    changed = True
    return {"resourceGroups": groups} if changed else None


def _same(name: str, current: Any, wanted: str) -> bool:
    if current is None:
        return False
    try:
        return quantities.to_canonical(name, current) == quantities.to_canonical(name, wanted)
    except ValueError:
        return False
