"""Telling jobs that their member stopped answering: one Warning Event `MemberUnreachable` per
job whose pods run there, on the job's group object or owner (else its first pod), sent from the
provider's publish loop once the member is past its grace (federation.members.outages).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from federation.members.outages import Outage, rfc3339
from vkprovider.events import EventRecorder


class Announcer:
    """One Warning Event `MemberUnreachable` per job whose pods run in a member that stopped
    answering, on the job's group object or owner (else its first pod), sent from the
    provider's publish loop."""

    def __init__(
        self,
        *,
        job_of_pod: Callable[[str], str],
        job_object: Callable[[str, str], Awaitable[dict[str, Any] | None]],
        events: Callable[[], EventRecorder | None],
    ) -> None:
        self._job_of_pod = job_of_pod
        self._job_object = job_object
        self._events = events
        self._news: list[tuple[str, dict[str, str], Outage]] = []

    def add(self, member: str, pods: Mapping[str, str], outage: Outage) -> None:
        """`pods`: the member's pods of ours, front-end key -> job label, as last seen."""
        self._news.append((member, dict(pods), outage))

    async def flush(self) -> None:
        news, self._news = self._news, []
        events = self._events()
        if events is None:
            return
        for member, pods, outage in news:
            jobs: dict[str, list[str]] = {}  # the job label (a hash) -> front-end keys
            for key, label in pods.items():
                jobs.setdefault(label or key, []).append(key)
            for keys in jobs.values():
                job_key = next((j for j in map(self._job_of_pod, keys) if j), "")
                target = await self._job_object(job_key, keys[0])
                if target is None:
                    continue
                message = (
                    f"member {member} has not answered since {rfc3339(outage.since)}: "
                    f"{len(keys)} pod(s) of this job there keep their last known status; "
                    f"they are declared lost after {outage.lost_after:.0f}s without an answer"
                )
                await events.emit(target, reason="MemberUnreachable", message=message, warning=True)
