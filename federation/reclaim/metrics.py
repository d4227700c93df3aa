"""Reclaim's counters and histograms: notices given and withdrawn, pods taken away (by member,
band and cause) and the work they lost, notice lengths, and how long a waiting online pod waited
for its victims."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

NOTICE_BUCKETS = (5, 10, 30, 60, 120, 300, 600)
FREED_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class ReclaimMetrics:
    registry: CollectorRegistry | None = None
    notices: Counter = field(init=False)
    cancelled: Counter = field(init=False)
    reclaimed: Counter = field(init=False)
    lost: Counter = field(init=False)
    notice_length: Histogram = field(init=False)
    pending_to_freed: Histogram = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry or CollectorRegistry()
        self.notices = Counter(
            "vkprovider_reclaim_notices",
            "Checkpoint notices given, by member and band.",
            ["member", "band"],
            registry=r,
        )
        self.cancelled = Counter(
            "vkprovider_reclaim_notices_cancelled", "Notices withdrawn as no longer needed.", ["member"], registry=r
        )
        self.reclaimed = Counter(
            "vkprovider_reclaimed_pods",
            "Member pods taken away, by member, band and cause (planner or the member's own).",
            ["member", "band", "cause"],
            registry=r,
        )
        self.lost = Counter(
            "vkprovider_lost_pod_seconds",
            "How long the pods taken away had run (work lost unless checkpointed), by member, band and cause.",
            ["member", "band", "cause"],
            registry=r,
        )
        self.notice_length = Histogram(
            "vkprovider_reclaim_notice_seconds", "Notice periods given.", ["member"], buckets=NOTICE_BUCKETS, registry=r
        )
        self.pending_to_freed = Histogram(
            "vkprovider_reclaim_pending_to_freed_seconds",
            "From an online pod waiting for room to its victims' deletion.",
            ["member"],
            buckets=FREED_BUCKETS,
            registry=r,
        )
