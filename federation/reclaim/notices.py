"""Checkpoint notices and their deadlines: the writes reclaim makes on both sides of a victim.

Every step is written front end first, so what users see is never behind what the member does,
and every step is idempotent, so a provider killed at any moment resumes where it was:

1. decide: two reclaim rounds in a row choose the pod (federation.reclaim.reclaimer);
2. announce at the front end: the front-end pod gets `vkprovider.io/reclaim-at` (the RFC 3339
   deadline, readable through a downward-API volume), `vkprovider.io/reclaim-noticed-at` and
   why, and a Warning Event ReclaimNotice. The period is federation.reclaim.terms';
3. arm at the member: the member pod gets the same annotations. Only an armed pod is ever
   deleted, and a pod is armed only after its front-end pod was told;
4. execute: at the deadline (or at once, when the workload acknowledges its checkpoint), the
   pod's last log lines are kept, then the member pod is deleted gracefully (its own
   terminationGracePeriodSeconds) with a UID precondition; the front-end pod ends Failed with
   reason Reclaimed and DisruptionTarget once the member pod is gone
   (federation.members.disruption).

A notice no longer needed is withdrawn in the opposite order (member first, then the front end
with a Normal Event ReclaimCancelled). A provider that died between steps 2 and 3 finds a
front-end notice without its member half: the next round completes it with the same deadline
if the plan still wants the pod, or withdraws it if not.

Why annotations on the pods rather than a record object of our own: the notice must be on the
front-end pod anyway (it is what the workload reads), the member pod's copy is what arms the
deletion, both go away with their pods, and no new kind, RBAC rule or garbage collection is
needed. What this run wrote is also remembered until the watches reflect it, so a plan
recomputed meanwhile cannot notice a pod twice. Which pods, and when, is the reclaimer's.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from federation import labels
from federation.members.member import Member
from federation.members.pods import MemberPods
from federation.reclaim import planner, terms
from federation.reclaim.metrics import ReclaimMetrics
from federation.reclaim.terms import parse_time
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import Conflict, KubeClient, NotFound

#: Seconds added to every notice for the notice writes themselves, so the front-end pod has
#: carried its notice for at least the notice period when the member pod is deleted.
NOTICE_MARGIN = 2.0

__all__ = ["NOTICE_MARGIN", "Notices", "annotate_front", "annotate_member", "front_stub", "parse_time", "rfc3339"]


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(ts: float) -> str:
    """RFC 3339 with milliseconds: a deadline is kept to the millisecond, not rounded."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class _Notice:
    deadline: float
    stamp: str
    noticed_at: float
    seconds: float
    front_at: float | None = None  # when the front-end pod got it (this run)
    armed: bool = False  # the member pod carries it (this run wrote it)


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


async def annotate_front(front: KubeClient, member_pod: dict[str, Any], annotations: dict[str, str | None]) -> bool:
    """The front-end pod of `member_pod` annotated (None removes), if it is still that pod;
    False when it is gone or replaced."""
    meta = front_stub(member_pod)["metadata"]
    body = {"metadata": {"annotations": annotations, "uid": meta["uid"]}}
    try:
        await front.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
    except (NotFound, Conflict):
        return False
    return True


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


def _annotations(member_pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((member_pod.get("metadata") or {}).get("annotations") or {})


#: What a notice writes on both pods (None removes it: a withdrawal).
_NOTICE_KEYS = (labels.RECLAIM_AT, labels.RECLAIM_NOTICED_AT, labels.RECLAIM_REASON)


class Notices:
    def __init__(
        self,
        *,
        front: Callable[[], KubeClient | None],
        events: Callable[[], EventRecorder | None],
        metrics: Callable[[], ReclaimMetrics],
        instance: str,
        keep_logs: Callable[[Member, dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self._front = front
        self._events = events
        self._metrics = metrics
        self._keep_logs = keep_logs
        self._notices: dict[str, _Notice] = {}  # member pod uid -> notice given in this run
        self._cancelled: set[str] = set()  # uids whose notice this run withdrew (until seen)
        self._deleted: set[str] = set()  # uids this run deleted
        self._log = logs.get("reclaim", instance=instance)

    # -- what stands -----------------------------------------------------------------------------

    def stands(self, uid: str, member_ann: Mapping[str, str], front_ann: Mapping[str, str]) -> bool:
        """The pod is under notice: on either side (a front-end notice whose member half a
        restart interrupted counts), or by this run, and not withdrawn."""
        if uid in self._cancelled:
            return False
        return bool(member_ann.get(labels.RECLAIM_AT) or front_ann.get(labels.RECLAIM_AT)) or uid in self._notices

    def armed(self, member_pod: dict[str, Any]) -> bool:
        """The member pod carries its notice: it may be deleted at the deadline."""
        uid = member_pod["metadata"].get("uid", "")
        if uid in self._cancelled:
            return False
        notice = self._notices.get(uid)
        return (notice is not None and notice.armed) or bool(_annotations(member_pod).get(labels.RECLAIM_AT))

    def next_deadline(self, now: float) -> float | None:
        """The soonest deadline this run gave that is still to come."""
        return min((n.deadline for n in self._notices.values() if n.deadline > now), default=None)

    def deadline(self, member_pod: dict[str, Any], front_ann: Mapping[str, str]) -> float | None:
        """The deadline this run gave, else the member pod's, else a half-written front-end one."""
        uid = member_pod["metadata"].get("uid", "")
        if uid in self._cancelled:
            return None
        notice = self._notices.get(uid)
        if notice is not None:
            return notice.deadline
        stamp = _annotations(member_pod).get(labels.RECLAIM_AT) or front_ann.get(labels.RECLAIM_AT)
        return parse_time(stamp) if stamp else None

    def noticed_at(self, member_pod: dict[str, Any], front_ann: Mapping[str, str]) -> float | None:
        uid = member_pod["metadata"].get("uid", "")
        notice = self._notices.get(uid)
        if notice is not None:
            return notice.noticed_at
        stamp = _annotations(member_pod).get(labels.RECLAIM_NOTICED_AT) or front_ann.get(labels.RECLAIM_NOTICED_AT)
        return parse_time(stamp) if stamp else None

    def front_served(self, uid: str, now: float) -> bool:
        notice = self._notices.get(uid)
        if notice is None or notice.front_at is None:
            return True  # given before a restart: the deadline alone rules
        return now >= notice.front_at + notice.seconds

    def forget_seen(self, by_key: dict[str, dict[str, Any]], front_ann: Callable[[str], Mapping[str, str]]) -> None:
        """Drop this run's memory of withdrawals both watches now reflect."""
        for key, member_pod in by_key.items():
            uid = member_pod["metadata"].get("uid", "")
            if uid not in self._cancelled:
                continue
            if not (_annotations(member_pod).get(labels.RECLAIM_AT) or front_ann(key).get(labels.RECLAIM_AT)):
                self._cancelled.discard(uid)

    def period(self, member: Member, member_pod: dict[str, Any]) -> terms.Period:
        reclaim = member.config.reclaim
        return terms.period(
            _annotations(member_pod), default=reclaim.notice_seconds, maximum=reclaim.max_notice_seconds
        )

    # -- the writes ------------------------------------------------------------------------------

    async def give(
        self,
        member: Member,
        member_pod: dict[str, Any],
        victim: planner.Victim,
        *,
        now: float,
        front_ann: Mapping[str, str],
    ) -> float | None:
        """The notice, front end first, then the member pod; its deadline (None: the front-end
        pod is gone, nothing to arm). A front-end notice a restart left without its member half
        keeps its deadline and is not announced again."""
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        period = self.period(member, member_pod)
        resumed = front_ann.get(labels.RECLAIM_AT)
        stamp = resumed or rfc3339_ms(now + period.seconds + NOTICE_MARGIN)
        deadline = parse_time(stamp) or now + period.seconds + NOTICE_MARGIN
        noticed_stamp = front_ann.get(labels.RECLAIM_NOTICED_AT) if resumed else None
        noticed_stamp = noticed_stamp or rfc3339_ms(now)
        reason = (front_ann.get(labels.RECLAIM_REASON) if resumed else None) or victim.reason[:500]
        wanted: dict[str, str | None] = {
            labels.RECLAIM_AT: stamp,
            labels.RECLAIM_NOTICED_AT: noticed_stamp,
            labels.RECLAIM_REASON: reason,
        }
        front, events, metrics = self._front(), self._events(), self._metrics()
        assert front is not None
        self._cancelled.discard(uid)
        if not resumed and not await annotate_front(front, member_pod, wanted):
            return None
        notice = _Notice(
            deadline=deadline, stamp=stamp, noticed_at=parse_time(noticed_stamp) or now, seconds=period.seconds
        )
        notice.front_at = None if resumed else time.time()
        self._notices[uid] = notice
        if not resumed and events is not None:
            message = (
                f"reclaim at {stamp} (notice {period.seconds:.0f}s): member {member.name} node {victim.pod.node} "
                f"gives capacity back to online load; chosen because: {reason}"
            )
            await events.emit(front_stub(member_pod), reason="ReclaimNotice", message=message, warning=True)
            if period.problem:
                await events.emit(front_stub(member_pod), reason="InvalidNotice", message=period.problem, warning=True)
        if not await annotate_member(_client(member), member_pod, wanted):
            return deadline
        notice.armed = True
        if not resumed:
            metrics.notices.labels(member.name, victim.pod.band).inc()
            metrics.notice_length.labels(member.name).observe(period.seconds)
        self._log.info(
            "reclaim notice",
            cluster=member.name,
            pod=MemberPods.origin(member_pod),
            deadline=stamp,
            why=reason,
            resumed=bool(resumed),
        )
        return deadline

    async def move(self, member: Member, member_pod: dict[str, Any], deadline: float) -> str:
        """The deadline moved (an extension), front end first; the new stamp."""
        uid = member_pod["metadata"].get("uid", "")
        stamp = rfc3339_ms(deadline)
        front = self._front()
        assert front is not None
        await annotate_front(front, member_pod, {labels.RECLAIM_AT: stamp})
        await annotate_member(_client(member), member_pod, {labels.RECLAIM_AT: stamp})
        notice = self._notices.get(uid)
        if notice is not None:
            notice.deadline, notice.stamp = deadline, stamp
        else:
            noticed = self.noticed_at(member_pod, {}) or time.time()
            self._notices[uid] = _Notice(deadline, stamp, noticed, self.period(member, member_pod).seconds, armed=True)
        return stamp

    async def withdraw(self, member: Member, member_pod: dict[str, Any]) -> bool:
        """The notice taken back, member first (disarmed), then the front end with a Normal
        Event; False when the member pod is gone or replaced (nothing to withdraw)."""
        uid = member_pod["metadata"].get("uid", "")
        cleared: dict[str, str | None] = dict.fromkeys(_NOTICE_KEYS)
        if not await annotate_member(_client(member), member_pod, cleared):
            return False
        self._notices.pop(uid, None)
        self._cancelled.add(uid)
        front, events = self._front(), self._events()
        assert front is not None
        await annotate_front(front, member_pod, cleared)
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
        """The member pod deleted (its last log lines kept first); False when this run deleted
        it already or it is not armed."""
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        if uid in self._deleted or not self.armed(member_pod):
            return False
        if self._keep_logs is not None:
            await self._keep_logs(member, member_pod)
        client = _client(member)
        # No gracePeriodSeconds: the pod's own terminationGracePeriodSeconds (SIGTERM, its grace).
        body = {"preconditions": {"uid": uid}}
        with contextlib.suppress(NotFound, Conflict):
            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
        self._deleted.add(uid)
        self._log.info("reclaimed", cluster=member.name, pod=MemberPods.origin(member_pod), node=victim.pod.node)
        return True
