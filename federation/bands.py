"""Priority bands: where offline work sits, at the front end and in every member (pure).

At the front end a pod's band comes from its `vkprovider.io/role` label, else its priority:

| band | front-end priority | what it is | reclaimed |
|---|---|---|---|
| ps | 2001-3000 | parameter servers, launchers: a job dies without them | last |
| worker-min | 1001-2000 (and the default) | workers up to the job's minimum | second |
| worker-max | 1-1000 | elastic workers between minimum and maximum | first |

In a member, each band runs under its own PriorityClass, all below the member's online
threshold (`reclaim.onlineThreshold`, default 0: any class >= 0 is online), at threshold - 1000
(ps), - 2000 (worker-min) and - 3000 (worker-max). Why:

- offline pods never preempt online ones: the scheduler preempts only strictly lower priorities,
  and every online pod is at or above the threshold;
- online pods preempt ours natively when they find no room (the immediate path of reclaim), and
  take the lowest band first, as the member's scheduler picks the lowest-priority victims;
- a lower band never preempts a higher one (lower priority cannot preempt);
- whether a higher offline band (PS) may preempt a lower one (workers) of ours in the member is
  the member's choice, `reclaim.offlinePreemption`: off by default (every class has
  preemptionPolicy Never), because with it on a PS could also preempt other tenants' batch pods
  that sit below the threshold.

The values are fixed when a member's classes are first created (a PriorityClass's value cannot
change): changing a member's threshold later needs its vkprovider-* classes deleted there.
"""

from __future__ import annotations

from typing import Any

PS = "ps"
WORKER_MIN = "worker-min"
WORKER_MAX = "worker-max"
BANDS = (PS, WORKER_MIN, WORKER_MAX)
DEFAULT = WORKER_MIN
#: Label on a front-end pod naming its band (`ps`, `worker-min`, `worker-max`); without it, its priority decides.
ROLE_LABEL = "vkprovider.io/role"

#: Front-end priority ranges (inclusive) of each band.
RANGES = {PS: (2001, 3000), WORKER_MIN: (1001, 2000), WORKER_MAX: (1, 1000)}
#: How far below the member's online threshold each band's class sits.
OFFSETS = {PS: 1000, WORKER_MIN: 2000, WORKER_MAX: 3000}
#: Higher keeps longer (gang cores share the highest band among their pods).
RANK = {PS: 3, WORKER_MIN: 2, WORKER_MAX: 1}


def band_of(pod: dict[str, Any]) -> str:
    """The pod's band, from its role label or its front-end priority."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    if pod_labels.get(ROLE_LABEL) in BANDS:
        return str(pod_labels[ROLE_LABEL])
    priority = (pod.get("spec") or {}).get("priority")
    if isinstance(priority, int):
        for band, (low, high) in RANGES.items():
            if low <= priority <= high:
                return band
    return DEFAULT


def class_name(band: str) -> str:
    return f"vkprovider-{band if band in BANDS else DEFAULT}"


def priority_classes(*, threshold: int = 0, offline_preemption: bool = False) -> list[dict[str, Any]]:
    """The member's PriorityClasses for our bands."""
    out = []
    for band in BANDS:
        policy = "PreemptLowerPriority" if offline_preemption and band != WORKER_MAX else "Never"
        out.append(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": class_name(band), "labels": {"vkprovider.io/managed": "true"}},
                "value": threshold - OFFSETS[band],
                "preemptionPolicy": policy,
                "description": f"vkprovider offline band {band}: below every online class (>= {threshold})",
            }
        )
    return out
