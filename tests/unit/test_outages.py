"""The two clocks of a member outage and the orphan rules (federation.members.outages), and the runtime's
handling of provider conditions under vkprovider.io/ (pure)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from federation import labels
from federation.members import orphans, outages
from vkprovider import podstatus
from vkprovider.podstore import PodStore

NOW = 1_800_000_000.0


def _stamp(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("unreachable_for", "state"),
    [(0.0, "reachable"), (30.0, "reachable"), (30.5, "unreachable"), (300.0, "unreachable"), (301.0, "lost")],
)
def test_member_state_follows_two_clocks(unreachable_for: float, state: str) -> None:
    assert outages.member_state(unreachable_for, grace=30, lost_after=300) == state


def test_a_lost_after_shorter_than_the_grace_still_loses_the_pods() -> None:
    assert outages.member_state(25, grace=30, lost_after=20) == "lost"


def test_unreachable_condition_names_the_member_and_since_when() -> None:
    cond = outages.unreachable_condition("member-1", outages.Outage("unreachable", NOW, 300))
    assert cond["type"] == "vkprovider.io/MemberReachable" and cond["status"] == "False"
    assert cond["lastTransitionTime"] == _stamp(NOW)
    assert "member-1" in cond["message"] and _stamp(NOW) in cond["message"] and "300s" in cond["message"]


def test_lost_is_a_disruption_named_member_lost() -> None:
    lost = outages.lost("member-3", "node-7", outages.Outage("lost", NOW, 20))
    assert (lost.pod_reason, lost.cause) == ("MemberLost", "MemberUnreachable")
    assert "member-3" in lost.message and "node-7" in lost.message


def member_pod(
    name: str, uid: str, *, age: float = 60, phase: str = "Running", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": "m-ns",
        "name": name,
        "uid": f"m-{uid}",
        "creationTimestamp": _stamp(NOW - age),
        "labels": {labels.ORIGIN_UID: uid},
        "annotations": {labels.ORIGIN_NAMESPACE: "ns", labels.ORIGIN_NAME: name},
    }
    if deleting:
        meta["deletionTimestamp"] = _stamp(NOW)
    return {"metadata": meta, "status": {"phase": phase}}


def test_candidates_are_member_pods_without_a_live_front_end_pod_of_their_uid() -> None:
    pods = [
        member_pod("kept", "u1"),
        member_pod("gone", "u2"),
        member_pod("replaced", "u3"),
        member_pod("young", "u4", age=2),
        member_pod("deleting", "u5", deleting=True),
    ]
    live = {"ns/kept": "u1", "ns/replaced": "other"}
    found = [p for p in pods if orphans.is_candidate(p, live, now=NOW)]
    assert [p["metadata"]["name"] for p in found] == ["gone", "replaced"]


def front(uid: str, phase: str = "Running", *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid}
    if deleting:
        meta["deletionTimestamp"] = _stamp(NOW)
    return {"metadata": meta, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("member_phase", "front_pod", "why"),
    [
        ("Running", None, "gone"),
        ("Succeeded", None, "gone"),
        ("Running", front("other"), "replaced"),
        ("Running", front("u1", "Failed"), "ended"),
        ("Pending", front("u1", "Succeeded"), "ended"),
        ("Succeeded", front("u1", "Succeeded"), None),  # ended on both sides: its logs stay readable
        ("Running", front("u1", "Running"), None),
        ("Running", front("u1", "Failed", deleting=True), None),  # the runtime's deletion path owns it
    ],
)
def test_verdict(member_phase: str, front_pod: dict[str, Any] | None, why: str | None) -> None:
    assert orphans.verdict(member_pod("p", "u1", phase=member_phase), front_pod) == why


def test_provider_conditions_under_our_domain_come_and_go_with_the_provider() -> None:
    cond = outages.unreachable_condition("member-1", outages.Outage("unreachable", NOW, 300))
    running: Any = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
    }
    api_pod: Any = {"metadata": {}, "spec": {}, "status": running}
    stale: Any = {**running, "conditions": [*running["conditions"], cond]}
    desired = podstatus.desired_status(api_pod, stale, host_ip="10.0.0.1")
    assert [c["type"] for c in desired["conditions"]] == ["PodScheduled", "Ready", CONDITION]
    assert podstatus.status_differs(running, desired)
    api_pod["status"] = desired
    back = podstatus.desired_status(api_pod, running, host_ip="10.0.0.1")
    assert [c["type"] for c in back["conditions"]] == ["PodScheduled", "Ready"]  # cleared, not left behind


CONDITION = outages.CONDITION


def test_follow_keeps_the_moment_the_member_stopped_answering() -> None:
    first = outages.follow(None, 31.0, grace=30, lost_after=300)
    assert first is not None and first.state == "unreachable"
    later = outages.follow(first, 301.0, grace=30, lost_after=300)
    assert later is not None and later.state == "lost" and later.since == first.since
    assert outages.follow(later, 0.0, grace=30, lost_after=300) is None


async def test_the_orphan_check_reads_live_pods_from_the_runtime_cache_once_it_is_complete() -> None:
    reconciler = orphans.OrphanReconciler(members=dict, node_of=str, interval=60.0)
    cache: PodStore[Any] = PodStore()
    listed = asyncio.Event()
    live = asyncio.create_task(reconciler._live(), name="test/live")
    await asyncio.sleep(0)
    reconciler.follow(cache, listed)
    for name, phase in (("runs", "Running"), ("waits", "Pending"), ("done", "Succeeded"), ("failed", "Failed")):
        cache[f"ns/{name}"] = {
            "metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}"},
            "status": {"phase": phase},
        }
    await asyncio.sleep(0)
    assert not live.done(), "an incomplete cache would make every member pod a candidate"
    listed.set()
    assert await asyncio.wait_for(live, 1) == {"ns/runs": "u-runs", "ns/waits": "u-waits"}


def test_a_recorded_outage_survives_a_restart() -> None:
    """The condition's lastTransitionTime is the member's last answer: a restarted provider reads
    it back; without one the clock counts from the restart, and the messages say which."""
    before = outages.follow(None, 40.0, grace=30, lost_after=300)
    assert before is not None and before.state == "unreachable" and not before.from_restart
    written = outages.unreachable_condition("member-3", before)
    since = outages.recorded_since([{"type": "Ready", "status": "True"}, dict(written)])
    assert since == pytest.approx(before.since, abs=1.0)  # whole seconds, as written
    assert outages.recorded_since([{"type": "Ready", "status": "True"}]) is None
    assert outages.recorded_since(None) is None
    fresh = outages.follow(None, 31.0, grace=30, lost_after=300, from_restart=True)
    assert fresh is not None and "since the provider started" in outages.unreachable_condition("m", fresh)["message"]
    assert "since the provider started" not in outages.unreachable_condition("m", before)["message"]
    lost = outages.lost("m", "n1", outages.Outage("lost", NOW, 300, from_restart=True))
    assert "since the provider started" in lost.message
    # A record read after the clock started replaces the start.
    moved = outages.follow(fresh, 200.0, grace=30, lost_after=300, recorded=NOW - 200.0)
    assert moved is not None and moved.since == NOW - 200.0 and not moved.from_restart
