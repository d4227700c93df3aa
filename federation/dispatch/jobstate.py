"""A dispatched job's state (`Job`), when its gang's wait started as the clusters record it, and
what each of its front-end pods reports from it and from its member pod (`reported_status`), all
pure.

Apart from federation.dispatch.dispatcher, which changes the state: the report is a translation, read by
the runtime for every status sync, and is tested without a dispatcher, a member or a lab.

A gang's clock, read from the clusters so a restarted provider neither restarts nor extends its
timeout (federation.dispatch.gang counts from it; the caller passes the time now):
- Waiting at the front end: a pod's binding is the front-end scheduler's PodScheduled condition
  (its lastTransitionTime, set when the pod was bound to the virtual node), or the pod's
  creationTimestamp when it was created bound (spec.nodeName set, no scheduler involved). An
  incomplete gang waits from its first pod's binding; a complete one from the binding that made
  up its minimum.
- Sent to a member and not bound there: from the creation of its first member pod there. The
  member pods' creationTimestamp is the member's own record of the dispatch, rather than an
  annotation of ours: it costs no write, it is there for gangs sent by an older provider, and a
  rollback's fresh pods in the next member start that member's wait anew, as they should.
- Wall times (seconds since the epoch, as the apiservers record them, to the second) become times
  on the monotonic clock the timers run on: now, less their age. A time in the future (another
  cluster's clock ahead of ours) counts as now, never later.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from federation import labels
from federation.dispatch import forge, placement
from federation.jobs import GangSpec, JobRef
from federation.members import disruption, outages
from vkprovider.objects import Pod, PodStatus
from vkprovider.podstatus import failed_status
from vkprovider.podstore import PodSubset


@dataclass(slots=True)
class Job:
    ref: JobRef
    gang: GangSpec
    pods: PodSubset[Pod]  # front-end pods by ns/name, held in the dispatcher's one PodStore
    member: str | None = None
    place: placement.Placement | None = None
    # The gang's clock (monotonic, read from the clusters: see below, so a restarted provider
    # keeps it): its pods' first wait at the front end, its minimum bound there, its dispatch
    # to `member`. Its timeout counts from the last of these it reached.
    waiting_since: float | None = None
    ready_at: float | None = None
    dispatched_at: float | None = None
    excluded: set[str] = field(default_factory=set)
    failed: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    timer: asyncio.Task[None] | None = None
    has_group: bool = False  # the job has a front-end group object (PodGroup): its pin goes there
    recorded: str | None = None  # the member the group object names (vkprovider.io/member)
    core: set[str] = field(default_factory=set)  # pods dispatched as the gang (the rest are elastic)
    role: str = "worker-min"  # the gang core's shared priority role
    native: int = 0  # the job's pods on native nodes, when last counted
    #: The member gang's minimum once dispatched (the virtual part of the job's minimum);
    #: None before, 0 or 1 when the native pods alone meet the minimum (no gang in the member).
    member_min: int | None = None
    incomplete_told: bool = False
    #: Why no member takes the complete gang now (federation.dispatch.placement.shortfall), while
    #: it waits for room; None once placed, or while incomplete.
    unplaced: str | None = None

    @property
    def member_gang(self) -> GangSpec:
        """The gang as the member sees it: the job's, with the virtual part's minimum."""
        if self.member_min is None or self.member_min == self.gang.min_member:
            return self.gang
        return replace(self.gang, min_member=max(1, self.member_min))


def job_state(job: Job) -> str:
    """waiting, NoMemberFits (complete, no member can take it now), dispatched, or why it failed
    (GangTimeout, MemberRemoved)."""
    if job.failed:
        return job.failed
    if job.dispatched_at is not None:
        return "dispatched"
    return forge.NO_ROOM if job.unplaced is not None else "waiting"


# -- the gang's clock ------------------------------------------------------------------------------


def parse_time(value: object) -> float | None:
    """An RFC 3339 time of the API (`2024-05-01T10:00:00Z`) as seconds since the epoch."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def bound_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod was bound to its node (wall time); None if it is not bound or nothing says."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            if condition.get("status") != "True":
                return None
            found = parse_time(condition.get("lastTransitionTime"))
            if found is not None:
                return found
            break
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    return created_at(pod)


def created_at(obj: Mapping[str, Any]) -> float | None:
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


def first_time(times: Iterable[float | None]) -> float | None:
    """The earliest of the known times: an incomplete gang's first wait, or a member's dispatch."""
    known = [t for t in times if t is not None]
    return min(known) if known else None


def nth_time(times: Iterable[float | None], n: int) -> float | None:
    """The `n`-th earliest of the known times (n from 1): when a gang's minimum was bound. The
    latest known when fewer are known (the pods bound before a restart are all known; a pod
    with no time cannot move it earlier)."""
    known = sorted(t for t in times if t is not None)
    if not known:
        return None
    return known[min(max(n, 1), len(known)) - 1]


def to_monotonic(wall: float, *, wall_now: float, monotonic_now: float) -> float:
    """A wall time on the monotonic clock: now, less its age (a future time counts as now)."""
    return monotonic_now - max(0.0, wall_now - wall)


def wait_start(job: Job, *, adopted: float | None, now: float) -> float:
    """When the job's current wait started: its dispatch (`adopted`: its member pods' creation,
    for a job found in its member after a restart), else its minimum bound at the front end, else
    its first wait there."""
    member = job.dispatched_at if job.dispatched_at is not None else adopted if job.member is not None else None
    for since in (member, job.ready_at, job.waiting_since):
        if since is not None:
            return since
    return now


# -- what pods report -------------------------------------------------------------------------------


def _stub(key: str, member_pod: dict[str, Any] | None) -> Pod:
    """A front-end pod to report on when the dispatcher no longer holds it (after a restart):
    its name, and the uid and spec its member copy carries."""
    namespace, _, name = key.partition("/")
    uid = ((member_pod or {}).get("metadata", {}).get("labels") or {}).get(labels.ORIGIN_UID, "")
    spec = (member_pod or {}).get("spec") or {"containers": []}
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": spec}


def reported_status(
    key: str,
    job: Job | None,
    pod: Pod | None,
    *,
    member_pod: tuple[str, dict[str, Any]] | None,
    outage: outages.Outage | None,
    tomb: tuple[dict[str, Any], disruption.Disruption] | None,
    gone_from: str | None,
    members: Callable[[], Container[str]],
) -> PodStatus | None:
    """The status front-end pod `key` reports (None: nothing to report), in order: its member
    pod's, marked lost or possibly stale while its member (`outage`) is out, or how it was
    stopped there; how it was taken away (`tomb`); Failed when the member it ran in
    (`gone_from`) is no longer one of `members` (asked only then: the dispatcher builds that
    view afresh, and this runs for every status sync); its job's failure; a gang's wait for
    its minimum."""
    if member_pod is not None:
        member, found = member_pod
        if outage is not None and outage.state == "lost":
            node = found.get("spec", {}).get("nodeName") or "no node"
            return disruption.disrupted_status(pod or _stub(key, found), outages.lost(member, node, outage))
        stopped = disruption.cause_of(found, member=member, gone=False)
        if stopped is not None:
            return disruption.disrupted_status(pod or _stub(key, found), stopped)
        status = forge.status_from_member(found)
        if outage is not None and status.get("phase") not in outages.TERMINAL:
            # Last known status, and why it may be stale.
            status["conditions"] = [*status.get("conditions", []), outages.unreachable_condition(member, outage)]
        return status
    if tomb is not None:
        last, what = tomb
        return disruption.disrupted_status(pod or _stub(key, last), what)
    if gone_from is not None and gone_from not in members():
        message = f"member {gone_from} was removed; the pod is not moved to another member"
        return failed_status(pod or _stub(key, None), reason="MemberRemoved", message=message)
    if job is None or pod is None:
        return None
    if job.failed == "GangTimeout":
        message = f"no member bound the gang of {job.gang.min_member} within {job.gang.timeout:.0f}s"
        return failed_status(pod, reason="GangTimeout", message=message, exit_code=1)
    if job.failed:
        return failed_status(pod, reason=job.failed, message=f"the job's member {job.failed}", exit_code=1)
    if job.gang.is_gang and job.dispatched_at is None and job.unplaced is not None:
        return forge.no_room_status(job.unplaced)
    if job.gang.is_gang and job.dispatched_at is None:
        bound, minimum = len(job.pods) + job.native, job.gang.min_member
        return forge.waiting_status(bound=min(bound, minimum), minimum=minimum, native=job.native)
    return None
