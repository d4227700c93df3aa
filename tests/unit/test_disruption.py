"""What the front end shows when a member takes a pod away (pure), and how the runtime writes
it: Failed, the reason and DisruptionTarget in one status, other writers' conditions kept."""

from __future__ import annotations

from typing import Any

import pytest

from federation.members import disruption
from vkprovider import podstatus


def member_pod(
    *, condition: str | None = None, phase: str = "Running", reclaim_at: str | None = None
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if condition:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": condition, "message": "why"})
    annotations = {"vkprovider.io/reclaim-at": reclaim_at} if reclaim_at else {}
    return {
        "metadata": {"name": "w0", "namespace": "ns", "uid": "m1", "annotations": annotations},
        "spec": {"nodeName": "node-7", "containers": [{"name": "main", "image": "i"}]},
        "status": {"phase": phase, "conditions": conditions},
    }


@pytest.mark.parametrize(
    ("pod", "gone", "cause", "reason"),
    [
        (member_pod(condition="PreemptionByScheduler"), True, "PreemptionByScheduler", "Preempted"),
        (member_pod(condition="EvictionByEvictionAPI"), True, "EvictionByEvictionAPI", "Evicted"),
        (member_pod(condition="DeletionByTaintManager"), True, "DeletionByTaintManager", "Evicted"),
        (member_pod(condition="DeletionByPodGC", phase="Failed"), True, "DeletionByPodGC", "Reclaimed"),
        (member_pod(condition="TerminationByKubelet", phase="Failed"), False, "TerminationByKubelet", "Evicted"),
        (member_pod(reclaim_at="2026-11-30T12:00:00Z"), True, "ReclaimedForOnlineLoad", "Reclaimed"),
        (member_pod(), True, "DeletedInMember", "Reclaimed"),
    ],
)
def test_causes(pod: dict[str, Any], gone: bool, cause: str, reason: str) -> None:
    found = disruption.cause_of(pod, member="member-1", gone=gone)
    assert found is not None and (found.cause, found.pod_reason) == (cause, reason)
    assert "member member-1, node node-7" in found.message


@pytest.mark.parametrize(
    ("pod", "gone"),
    [
        (member_pod(), False),  # running
        (member_pod(condition="PreemptionByScheduler"), False),  # marked, still stopping
        (member_pod(phase="Succeeded"), True),  # completed, then deleted: its own status says so
        (member_pod(phase="Failed"), True),
    ],
)
def test_not_a_disruption(pod: dict[str, Any], gone: bool) -> None:
    assert disruption.cause_of(pod, member="member-1", gone=gone) is None


def test_one_status_write_carries_failed_reason_and_disruption_target() -> None:
    front = {
        "metadata": {"name": "w0", "namespace": "ns", "uid": "f1"},
        "spec": {"containers": [{"name": "main", "image": "i"}]},
        "status": {
            "phase": "Running",
            "startTime": "2026-11-30T11:00:00Z",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "example.com/Checked", "status": "True"},
            ],
        },
    }
    what = disruption.cause_of(member_pod(condition="PreemptionByScheduler"), member="member-1", gone=True)
    assert what is not None
    provided = disruption.disrupted_status(front, what)  # type: ignore[arg-type]
    desired = podstatus.desired_status(front, provided, host_ip="10.0.0.1")  # type: ignore[arg-type]
    conditions = {c["type"]: c for c in desired["conditions"]}
    assert desired["phase"] == "Failed" and desired["reason"] == "Preempted"
    assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    assert {"PodScheduled", "example.com/Checked"} <= set(conditions)  # other writers' conditions kept
    assert podstatus.disrupted(desired)


def test_a_running_pod_keeps_a_disruption_target_someone_else_wrote() -> None:
    theirs = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    front = {"metadata": {}, "spec": {"containers": []}, "status": {"phase": "Running", "conditions": [theirs]}}
    provided = {"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "False", "reason": "x"}]}
    desired = podstatus.desired_status(front, provided, host_ip="10.0.0.1")  # type: ignore[arg-type]
    assert [c for c in desired["conditions"] if c["type"] == "DisruptionTarget"] == [theirs]
