"""Checkpoint notices and their deadlines: the writes reclaim makes on both sides of a victim.

1. notice: the member pod, then the front-end pod, get `vkprovider.io/reclaim-at` (the RFC 3339
   deadline, readable through a downward-API volume) and the front-end pod a Warning Event
   ReclaimNotice saying why it was chosen. The notice period is the pod's
   `vkprovider.io/checkpoint-seconds`, else its job's PodGroup's (carried onto member pods at
   dispatch), else the member's default, capped by the member's maximum;
2. at the deadline the member pod is deleted gracefully (its own terminationGracePeriodSeconds:
   SIGTERM and its grace), with a UID precondition; the front-end pod ends Failed with reason
   Reclaimed once the member pod is gone (federation.members.disruption);
3. a notice no longer needed is withdrawn: annotations removed, a Normal Event ReclaimCancelled,
   the pod keeps running.

The annotations are the state: a restart reads the same deadlines from the member pods. What
this run wrote is also remembered until the member watch reflects it, so a plan recomputed
meanwhile cannot notice a pod twice. Which pods, and when, is federation.reclaim.reclaimer's.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from federation import labels
from federation.config import MemberConfig
from federation.members.member import Member
from federation.members.pods import MemberPods
from federation.reclaim import planner
from federation.reclaim.metrics import ReclaimMetrics
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import Conflict, KubeClient, NotFound

#: Seconds added to every notice for the notice writes themselves, so the front-end pod has
#: carried its notice for at least the notice period when the member pod is deleted.
NOTICE_MARGIN = 2.0


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(ts: float) -> str:
    """RFC 3339 with milliseconds: a deadline is kept to the millisecond, not rounded."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def notice_seconds(annotations: dict[str, str], config: MemberConfig) -> float:
    """The pod's (or its job's, carried onto the member pod) notice period, within the member's
    maximum; the member's default otherwise."""
    wanted = annotations.get(labels.CHECKPOINT_SECONDS)
    seconds = config.reclaim.notice_seconds
    if wanted:
        with contextlib.suppress(ValueError):
            seconds = max(0.0, float(wanted))
    return min(seconds, config.reclaim.max_notice_seconds)


@dataclass
class _Notice:
    deadline: float
    seconds: float
    front_at: float | None = None  # when the front-end pod got it (this run)


def front_stub(member_pod: dict[str, Any]) -> dict[str, Any]:
    """The front-end pod a member pod runs, as far as its labels tell (for patches and Events)."""
    meta = member_pod["metadata"]
    annotations = meta.get("annotations") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": annotations.get(labels.ORIGIN_NAMESPACE, ""),
            "name": annotations.get(labels.ORIGIN_NAME, ""),
            "uid": (meta.get("labels") or {}).get(labels.ORIGIN_UID, ""),
        },
    }


async def annotate_front(front: KubeClient, member_pod: dict[str, Any], annotations: dict[str, str | None]) -> None:
    """The front-end pod of `member_pod` annotated (None removes), if it is still that pod."""
    meta = front_stub(member_pod)["metadata"]
    body = {"metadata": {"annotations": annotations, "uid": meta["uid"]}}
    with contextlib.suppress(NotFound, Conflict):
        await front.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)


async def annotate_member(client: KubeClient, member_pod: dict[str, Any], annotations: dict[str, Any]) -> bool:
    """The member pod annotated (None removes); False when it is gone or replaced."""
    meta = member_pod["metadata"]
    body = {"metadata": {"annotations": annotations, "uid": meta.get("uid")}}
    try:
        await client.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
    except (NotFound, Conflict):
        return False
    return True


def _client(member: Member) -> KubeClient:
    pods = member.pods
    assert pods is not None and pods.client is not None
    return pods.client


class Notices:
    def __init__(
        self,
        *,
        front: Callable[[], KubeClient | None],
        events: Callable[[], EventRecorder | None],
        metrics: Callable[[], ReclaimMetrics],
        instance: str,
    ) -> None:
        self._front = front
        self._events = events
        self._metrics = metrics
        self._notices: dict[str, _Notice] = {}  # member pod uid -> notice given in this run
        self._cancelled: set[str] = set()  # uids whose notice this run withdrew (until seen)
        self._deleted: set[str] = set()  # uids this run deleted
        self._log = logs.get("reclaim", instance=instance)

    def stands(self, uid: str, annotations: dict[str, str]) -> bool:
        """The member pod is under notice (as written there, or by this run, and not withdrawn)."""
        return (bool(annotations.get(labels.RECLAIM_AT)) or uid in self._notices) and uid not in self._cancelled

    def next_deadline(self, now: float) -> float | None:
        """The soonest deadline this run gave that is still to come."""
        return min((n.deadline for n in self._notices.values() if n.deadline > now), default=None)

    def deadline(self, member_pod: dict[str, Any]) -> float | None:
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        if uid in self._cancelled:
            return None
        notice = self._notices.get(uid)
        if notice is not None:
            return notice.deadline
        stamp = (meta.get("annotations") or {}).get(labels.RECLAIM_AT)
        return parse_time(stamp) if stamp else None

    def front_served(self, uid: str, now: float) -> bool:
        notice = self._notices.get(uid)
        if notice is None or notice.front_at is None:
            return True  # given before a restart: the deadline alone rules
        return now >= notice.front_at + notice.seconds

    def forget_seen(self, by_key: dict[str, dict[str, Any]]) -> None:
        """Drop this run's memory of writes the member watch now reflects."""
        for member_pod in by_key.values():
            meta = member_pod["metadata"]
            uid = meta.get("uid", "")
            has = bool((meta.get("annotations") or {}).get(labels.RECLAIM_AT))
            if uid in self._cancelled and not has:
                self._cancelled.discard(uid)

    async def give(self, member: Member, member_pod: dict[str, Any], victim: planner.Victim, *, now: float) -> float:
        """The notice (member pod first, then the front-end pod and its Event); its deadline."""
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        seconds = notice_seconds(meta.get("annotations") or {}, member.config)
        # A margin for the notice writes themselves; milliseconds, as written.
        stamp = rfc3339_ms(now + seconds + NOTICE_MARGIN)
        deadline = parse_time(stamp) or now + seconds + NOTICE_MARGIN
        reason = victim.reason[:500]
        wanted = {labels.RECLAIM_AT: stamp, labels.RECLAIM_REASON: reason}
        if not await annotate_member(_client(member), member_pod, wanted):
            return deadline
        notice = _Notice(deadline=deadline, seconds=seconds)
        self._notices[uid] = notice
        self._cancelled.discard(uid)
        front, events, metrics = self._front(), self._events(), self._metrics()
        assert front is not None
        await annotate_front(front, member_pod, {labels.RECLAIM_AT: stamp})
        notice.front_at = time.time()
        if events is not None:
            message = (
                f"reclaim at {stamp} (notice {seconds:.0f}s): member {member.name} node {victim.pod.node} "
                f"gives capacity back to online load; chosen because: {reason}"
            )
            await events.emit(front_stub(member_pod), reason="ReclaimNotice", message=message, warning=True)
        metrics.notices.labels(member.name, victim.pod.band).inc()
        metrics.notice_length.labels(member.name).observe(seconds)
        self._log.info(
            "reclaim notice", cluster=member.name, pod=MemberPods.origin(member_pod), deadline=stamp, why=reason
        )
        return deadline

    async def withdraw(self, member: Member, member_pod: dict[str, Any]) -> bool:
        """The notice taken back on both sides, with a Normal Event; False when the member pod
        is gone or replaced (nothing to withdraw)."""
        uid = member_pod["metadata"].get("uid", "")
        cleared = {labels.RECLAIM_AT: None, labels.RECLAIM_REASON: None}
        if not await annotate_member(_client(member), member_pod, cleared):
            return False
        self._notices.pop(uid, None)
        self._cancelled.add(uid)
        front, events = self._front(), self._events()
        assert front is not None
        await annotate_front(front, member_pod, {labels.RECLAIM_AT: None})
        if events is not None:
            await events.emit(
                front_stub(member_pod),
                reason="ReclaimCancelled",
                message=f"member {member.name} no longer needs the capacity back; the pod keeps running",
            )
        self._metrics().cancelled.labels(member.name).inc()
        self._log.info("reclaim notice withdrawn", cluster=member.name, pod=MemberPods.origin(member_pod))
        return True

    async def execute(self, member: Member, member_pod: dict[str, Any], victim: planner.Victim) -> bool:
        """The member pod deleted at its deadline; False when this run deleted it already."""
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        if uid in self._deleted:
            return False
        client = _client(member)
        # No gracePeriodSeconds: the pod's own terminationGracePeriodSeconds (SIGTERM, its grace).
        body = {"preconditions": {"uid": uid}}
        try:
            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
        except (NotFound, Conflict):
            pass
        self._deleted.add(uid)
        self._log.info("reclaimed", cluster=member.name, pod=MemberPods.origin(member_pod), node=victim.pod.node)
        return True
