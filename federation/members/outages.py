"""Member outages (pure): two clocks, and what the front end shows of our pods in a member
that stopped answering.

A member apiserver that stops answering is not a member whose pods stopped: an apiserver
restart, a control-plane failover or a network blip leaves the pods running there. So the
provider keeps two clocks, after the node lifecycle's defaults (a node whose kubelet stops
reporting is NotReady after 40 s; its pods are evicted after their `tolerationSeconds` for
`node.kubernetes.io/unreachable`, 300 s by default, and keep running meanwhile):

- unreachable under `unreachable_grace` (30 s): its capacity is lent, our front-end pods there
  show what the member reports;
- under `pods_lost_after` (300 s): its capacity is withdrawn; the pods keep their last known
  status plus the condition `vkprovider.io/MemberReachable=False` (member, since when), and each
  job gets one Warning Event `MemberUnreachable`;
- from `pods_lost_after` on: the pods end Failed, reason `MemberLost`, with `DisruptionTarget`
  (reason `MemberUnreachable`), so a Job's podFailurePolicy can treat it as a disruption.

The clocks survive a restart: the condition's `lastTransitionTime` is the member's last answer,
so a restarted provider reads from its front-end pods when each member stopped answering and
counts from there (`recorded_since`); a member that stopped answering while no provider ran (or
within the grace, before anything was recorded) is counted from the restart, and the messages
say so. A member never listed since the start is known from the front-end pods pinned to it
(their `vkprovider.io/member` annotation), so its pods get the condition and end lost all the
same.

When the member answers again its pods are listed afresh: every change of the gap is reported
(a pod that completed shows Succeeded, one deleted there fails with the member's cause), the
condition goes, and nothing is created again.

Who acts on an outage: federation.members.fleet follows the clocks, federation.members.announcer
tells the jobs, federation.dispatch reports the pods.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from federation.members.disruption import Disruption
from vkprovider.objects import PodCondition

CONDITION = "vkprovider.io/MemberReachable"
LOST_REASON = "MemberLost"
LOST_CAUSE = "MemberUnreachable"
TERMINAL = ("Succeeded", "Failed")

State = Literal["reachable", "unreachable", "lost"]


@dataclass(frozen=True)
class Outage:
    state: State
    since: float  # wall time of the member's last answer
    lost_after: float
    #: Nothing recorded when this process started: counted from the start, not the last answer.
    from_restart: bool = False


def member_state(unreachable_for: float, *, grace: float, lost_after: float) -> State:
    if unreachable_for > lost_after:
        return "lost"
    if unreachable_for > grace:
        return "unreachable"
    return "reachable"


def follow(
    current: Outage | None,
    unreachable_for: float,
    *,
    grace: float,
    lost_after: float,
    recorded: float | None = None,
    from_restart: bool = False,
) -> Outage | None:
    """The member's outage after a look at its clock (None: reachable); `since` stays the
    moment it stopped answering, or is the one `recorded` before a restart."""
    state = member_state(unreachable_for, grace=grace, lost_after=lost_after)
    if state == "reachable":
        return None
    if recorded is not None:
        since = recorded
    else:
        since = current.since if current is not None else time.time() - unreachable_for
    return Outage(state=state, since=since, lost_after=lost_after, from_restart=from_restart)


def recorded_since(conditions: Sequence[Mapping[str, Any]] | None) -> float | None:
    """When a front-end pod's member stopped answering, as an earlier process recorded it on the
    pod (the MemberReachable condition's lastTransitionTime is the member's last answer)."""
    for cond in conditions or []:
        if cond.get("type") == CONDITION and cond.get("status") == "False":
            stamp = str(cond.get("lastTransitionTime") or "")
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def _counted(outage: Outage) -> str:
    if outage.from_restart:
        return f"since the provider started at {rfc3339(outage.since)} (no earlier record of the outage)"
    return f"since {rfc3339(outage.since)}"


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unreachable_condition(member: str, outage: Outage) -> PodCondition:
    since = rfc3339(outage.since)
    return {
        "type": CONDITION,
        "status": "False",
        "reason": "MemberUnreachable",
        "message": f"member {member} has not answered {_counted(outage)}; the pod keeps its last known status "
        f"and is declared lost after {outage.lost_after:.0f}s without an answer",
        "lastTransitionTime": since,
    }


def lost(member: str, node: str, outage: Outage) -> Disruption:
    message = (
        f"member {member}, node {node}: the member has not answered {_counted(outage)} "
        f"(over {outage.lost_after:.0f}s); the pod is not moved to another member"
    )
    return Disruption(cause=LOST_CAUSE, pod_reason=LOST_REASON, message=message)
