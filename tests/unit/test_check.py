"""Pure parts of `vkprovider check` (the chart's `helm test`): node readiness, the probe pod, and
what a stuck pod's status says. No network."""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider import check


def _node(*, ready: str | None = "True", taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    return {"metadata": {"name": "vk-pool"}, "spec": {"taints": taints or []}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(("ready", "expected"), [("True", True), ("False", False), ("Unknown", False), (None, False)])
def test_a_node_is_ready_only_with_ready_true(ready: str | None, expected: bool) -> None:
    assert check.ready(_node(ready=ready)) is expected
    assert check.ready({"metadata": {"name": "new"}}) is False


def test_the_probe_is_bound_to_the_node_and_tolerates_its_taints_only() -> None:
    taints = [
        {"key": "virtual-kubelet.io/provider", "value": "federation", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
    ]
    pod = check.probe_pod(_node(taints=taints), image="img:1", suffix="abc")
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "vkprovider-check-abc"
    assert spec["nodeName"] == "vk-pool"  # no scheduler involved
    assert spec["tolerations"] == [
        {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]
    assert check.probe_pod(_node(), image="img:1", suffix="x")["spec"]["tolerations"] == []
    (container,) = spec["containers"]
    assert container["image"] == "img:1"


def test_the_probe_passes_the_restricted_pod_security_level() -> None:
    spec = check.probe_pod(_node(), image=check.PAUSE_IMAGE, suffix="x")["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = spec["containers"][0]["securityContext"]
    assert context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"


def test_a_stuck_pod_is_described_by_what_is_not_true() -> None:
    pod = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "GangWaiting", "message": "2 of 3 pods"},
            ],
            "containerStatuses": [{"name": "probe", "state": {"waiting": {"reason": "ErrImagePull"}}}],
        }
    }
    assert check.describe(pod) == (
        "Pending; Ready=False (GangWaiting: 2 of 3 pods); container probe waiting: ErrImagePull"
    )
    failed = {"status": {"phase": "Failed", "reason": "Reclaimed", "message": "member took it back"}}
    assert check.describe(failed) == "Failed; Reclaimed; member took it back"
    assert check.describe({}) == "no phase"
