"""What a dispatched job's front-end pod reports (federation.dispatch.jobstate.reported_status), case by
case: pure, no dispatcher or apiserver. The same cases run end to end in tests/e2e/test_dispatch.py,
test_outages.py and test_reclaim.py."""

from __future__ import annotations

from typing import Any

from federation.dispatch.jobstate import Job, reported_status
from federation.jobs import GangSpec, JobRef
from federation.members import disruption, outages
from vkprovider.objects import Pod
from vkprovider.podstore import PodOverlay, PodSubset

KEY = "team/p0"


def front_pod() -> Pod:
    return {"metadata": {"namespace": "team", "name": "p0", "uid": "u0"}, "spec": {"containers": []}}


def member_pod(phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "vk-team", "name": "p0", "labels": {}},
        "spec": {"nodeName": "node-1", "containers": []},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def job(minimum: int = 1, **fields: Any) -> Job:
    out = Job(ref=JobRef("team", "pod", "p0"), gang=GangSpec(min_member=minimum), pods=PodSubset(PodOverlay()))
    out.pods[KEY] = front_pod()
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def report(j: Job | None, **given: Any) -> Any:
    args: dict[str, Any] = {
        "member_pod": None,
        "outage": None,
        "tomb": None,
        "gone_from": None,
        "members": lambda: {"m1"},
    }
    return reported_status(KEY, j, j.pods.get(KEY) if j else None, **{**args, **given})


def test_a_member_pod_reports_its_own_status() -> None:
    status = report(job(), member_pod=("m1", member_pod()))
    assert status["phase"] == "Running"
    assert [c["type"] for c in status["conditions"]] == ["Ready"]


def test_an_unreachable_member_keeps_the_last_status_and_says_so_until_the_pod_ends() -> None:
    outage = outages.Outage(state="unreachable", since=1_000.0, lost_after=300)
    status = report(job(), member_pod=("m1", member_pod()), outage=outage)
    assert status["phase"] == "Running"
    assert status["conditions"][-1]["reason"] == "MemberUnreachable"
    ended = report(job(), member_pod=("m1", member_pod("Succeeded")), outage=outage)
    assert ended["phase"] == "Succeeded" and len(ended["conditions"]) == 1


def test_a_lost_member_fails_the_pod_naming_member_and_node() -> None:
    outage = outages.Outage(state="lost", since=1_000.0, lost_after=300)
    status = report(job(), member_pod=("m1", member_pod()), outage=outage)
    assert (status["phase"], status["reason"]) == ("Failed", outages.LOST_REASON)
    assert "member m1, node node-1" in status["message"]
    assert status["conditions"][-1]["type"] == "DisruptionTarget"


def test_a_pod_taken_away_reports_why_even_when_the_dispatcher_forgot_it() -> None:
    what = disruption.Disruption(cause="PreemptionByScheduler", pod_reason="Preempted", message="by online pod x")
    status = report(None, tomb=(member_pod(), what))
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "Preempted", "by online pod x")


def test_a_pod_whose_member_was_removed_fails_but_one_whose_member_stays_reports_nothing() -> None:
    gone = report(job(), gone_from="m2")
    assert (gone["phase"], gone["reason"]) == ("Failed", "MemberRemoved")
    assert "m2" in gone["message"]
    assert report(job(), gone_from="m1") is None


def test_a_job_failure_fails_every_pod_with_its_reason() -> None:
    timed_out = report(job(4, failed="GangTimeout"))
    assert (timed_out["phase"], timed_out["reason"]) == ("Failed", "GangTimeout")
    assert "gang of 4" in timed_out["message"]
    other = report(job(failed="ForbiddenByMemberPolicy"))
    assert other["reason"] == "ForbiddenByMemberPolicy"


def test_a_gang_waiting_for_its_minimum_counts_native_pods_and_no_more_than_the_minimum() -> None:
    waiting = report(job(4, native=2))
    assert (waiting["phase"], waiting["reason"]) == ("Pending", "WaitingForGang")
    assert waiting["message"].startswith("3 of 4 pods of the gang are bound (2 on native nodes)")
    assert report(job(2, native=5))["message"].startswith("2 of 2")
    assert report(job(4, native=2, dispatched_at=1.0)) is None  # sent: the member pod speaks next


def test_a_complete_gang_no_member_can_take_says_so_until_it_is_sent() -> None:
    why = "no member can take the gang's 4 pods (12 CPU) at once: m1 lends 6 CPU"
    held = report(job(4, native=3, unplaced=why))
    assert (held["phase"], held["reason"], held["message"]) == ("Pending", "NoMemberFits", why)
    assert held["conditions"] == [{"type": "Ready", "status": "False", "reason": "NoMemberFits", "message": why}]
    assert report(job(4, native=3, unplaced=why, dispatched_at=1.0)) is None


def test_a_plain_pod_not_yet_in_its_member_and_an_unknown_pod_report_nothing() -> None:
    assert report(job()) is None
    assert report(None) is None
