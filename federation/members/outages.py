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

When the member answers again its pods are listed afresh: every change of the gap is reported
(a pod that completed shows Succeeded, one deleted there fails with the member's cause), the
condition goes, and nothing is created again.

Who acts on an outage: federation.members.fleet follows the clocks, federation.members.announcer
tells the jobs, federation.dispatch reports the pods.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Literal

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


def member_state(unreachable_for: float, *, grace: float, lost_after: float) -> State:
    if unreachable_for > lost_after:
        return "lost"
    if unreachable_for > grace:
        return "unreachable"
    return "reachable"


def follow(current: Outage | None, unreachable_for: float, *, grace: float, lost_after: float) -> Outage | None:
    """The member's outage after a look at its clock (None: reachable); `since` stays the
    moment it stopped answering."""
    state = member_state(unreachable_for, grace=grace, lost_after=lost_after)
    if state == "reachable":
        return None
    since = current.since if current is not None else time.time() - unreachable_for
    return Outage(state=state, since=since, lost_after=lost_after)


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unreachable_condition(member: str, outage: Outage) -> PodCondition:
    since = rfc3339(outage.since)
    return {
        "type": CONDITION,
        "status": "False",
        "reason": "MemberUnreachable",
        "message": f"member {member} has not answered since {since}; the pod keeps its last known status "
        f"and is declared lost after {outage.lost_after:.0f}s without an answer",
        "lastTransitionTime": since,
    }


def lost(member: str, node: str, outage: Outage) -> Disruption:
    message = (
        f"member {member}, node {node}: the member has not answered since {rfc3339(outage.since)} "
        f"(over {outage.lost_after:.0f}s); the pod is not moved to another member"
    )
    return Disruption(cause=LOST_CAUSE, pod_reason=LOST_REASON, message=message)
