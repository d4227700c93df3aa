"""The workload's answers to a notice: an acknowledged checkpoint releases the pod at once, an
extension moves its deadline (up to the member's maximum), and each answer is answered with an
Event on the front-end pod (the rules are federation.reclaim.terms').

No pooling system we know of lets the workload say "done" or "not yet": without it, a job that
checkpoints in 5 s still waits out a 300 s notice, and one that needs 400 s is killed mid-write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cachetools import TTLCache

from federation.members.member import Member
from federation.reclaim import terms
from federation.reclaim.notices import NOTICE_MARGIN, Notices, front_stub
from vkprovider.events import EventRecorder


class Answers:
    def __init__(self, *, notices: Notices, events: Callable[[], EventRecorder | None]) -> None:
        self._notices = notices
        self._events = events
        self._told: set[tuple[str, str, str]] = set()  # (member pod uid, Event reason, value)
        #: Member pods released early on their workload's word (uid), for the reclaim log.
        self._acknowledged: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=3600)

    def acknowledged(self, uid: str) -> bool:
        return uid in self._acknowledged

    async def _tell(self, member_pod: dict[str, Any], reason: str, message: str, *, value: str, warning: bool) -> None:
        uid = member_pod["metadata"].get("uid", "")
        if (uid, reason, value) in self._told:
            return
        self._told.add((uid, reason, value))
        events = self._events()
        if events is not None:
            await events.emit(front_stub(member_pod), reason=reason, message=message, warning=warning)

    async def release_now(self, member: Member, member_pod: dict[str, Any], front: Mapping[str, str]) -> bool:
        """Whether the workload released its pod under notice (its checkpoint is written); an
        extension it asked for is granted or refused on the way."""
        noticed_at = self._notices.noticed_at(member_pod, front)
        if noticed_at is None:
            return False
        acked = terms.acknowledged(front, noticed_at=noticed_at)
        if isinstance(acked, str):
            await self._tell(member_pod, "InvalidCheckpointAnswer", acked, value=acked, warning=True)
        elif acked:
            message = "the workload acknowledged its checkpoint: the pod is released before its deadline"
            await self._tell(member_pod, "CheckpointAcknowledged", message, value="", warning=False)
            self._acknowledged[member_pod["metadata"].get("uid", "")] = True
            return True
        period = self._notices.period(member, member_pod)
        maximum = member.config.reclaim.max_notice_seconds
        asked = terms.extension(
            front, noticed_at=noticed_at, base=period.seconds, maximum=maximum, margin=NOTICE_MARGIN
        )
        if isinstance(asked, str):
            await self._tell(member_pod, "InvalidCheckpointAnswer", asked, value=asked, warning=True)
            return False
        current = self._notices.deadline(member_pod, front)
        if asked is None or current is None or asked.deadline <= current + 0.01:
            return False
        stamp = await self._notices.move(member, member_pod, asked.deadline)
        if asked.refused:
            message = (
                f"asked for {asked.asked:g}s of notice in all; member {member.name} allows at most {maximum:g}s: "
                f"extended to the maximum, reclaim at {stamp}"
            )
            await self._tell(member_pod, "CheckpointExtensionRefused", message, value=stamp, warning=True)
        else:
            message = f"notice extended to {asked.granted:g}s as asked: reclaim at {stamp}"
            await self._tell(member_pod, "CheckpointExtended", message, value=stamp, warning=False)
        return False
