"""Hybrid jobs (pure): gang accounting across native and virtual nodes (federation.dispatch.hybrid) and
routing by band at admission (federation.dispatch.routing, federation.dispatch.webhook.review)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from federation.dispatch import hybrid, routing
from federation.dispatch.webhook import review
from federation.jobs import JobRef

PS, MIN, MAX = "ps", "worker-min", "worker-max"
VK = "vk-1"  # the provider's instance: its virtual nodes carry vkprovider.io/instance=vk-1


@pytest.mark.parametrize(
    ("minimum", "native", "virtual", "ready", "core", "member_min"),
    [
        # the floor on native nodes: every virtual pod is elastic, no gang in the member
        (3, 3, {"w3": MAX, "w4": MAX, "w5": MAX}, True, (), 0),
        (3, 5, {"w5": MAX}, True, (), 0),
        # split 2 + 2: the virtual 2 leave as a gang of 2
        (4, 2, {"w2": MIN, "w3": MIN}, True, ("w2", "w3"), 2),
        # split 2 + 1 of 4: waits, naming both counts
        (4, 2, {"w2": MIN}, False, (), 2),
        # all virtual (today's case): the minimum leaves as the gang, highest bands first
        (3, 0, {"a": MAX, "b": MIN, "c": PS, "d": MAX}, True, ("b", "c", "a"), 3),
        # one virtual pod completes the minimum: a gang of one is no gang
        (3, 2, {"w": MAX, "x": MAX}, True, ("w",), 1),
    ],
)
def test_split(
    minimum: int, native: int, virtual: dict[str, str], ready: bool, core: tuple[str, ...], member_min: int
) -> None:
    got = hybrid.split(minimum, native, virtual)
    assert got.ready == ready
    assert got.member_min == member_min
    if ready:
        assert sorted(got.core) == sorted(core)
        assert set(got.core) | set(got.elastic) == set(virtual) and not set(got.core) & set(got.elastic)


def test_the_core_keeps_the_highest_bands() -> None:
    got = hybrid.split(3, 1, {"a": MAX, "b": PS, "c": MAX, "d": MIN})
    assert set(got.core) == {"b", "d"} and set(got.elastic) == {"a", "c"}


def test_a_restarted_provider_counts_the_same() -> None:
    """After a restart the provider knows only what the API shows: the native pods (listed)
    and its virtual pods (some already in the member). The split is the same function of them,
    so the member gang's minimum is what it was before the restart."""
    before = hybrid.split(4, 2, {"v1": MIN, "v2": MIN})
    after = hybrid.split(4, 2, {"v2": MIN, "v1": MIN})  # other arrival order after a restart
    assert (before.member_min, set(before.core)) == (after.member_min, set(after.core))


def _pod(name: str, node: str | None, *, group: str = "ring", phase: str = "Running", deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"namespace": "ns", "name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    spec: dict[str, Any] = {"schedulingGroup": {"podGroupName": group}}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_native_pods_are_the_jobs_live_pods_bound_elsewhere_than_our_nodes() -> None:
    pods = [
        _pod("launcher", "offline-node-000"),
        _pod("w0", "offline-node-001"),
        _pod("w1", "vk-1"),  # ours: counted by the dispatcher itself
        _pod("w2", None),  # not bound
        _pod("w3", "offline-node-002", phase="Succeeded"),
        _pod("w4", "offline-node-002", deleting=True),
        _pod("other", "offline-node-003", group="other"),
    ]
    got = hybrid.native_pods(pods, JobRef("ns", "native", "ring"), {"vk-1"})
    assert got == {"ns/launcher", "ns/w0"}


def _routed_pod(*, role: str | None = None, priority: int | None = None, labels: dict[str, str] | None = None) -> Any:
    pod: dict[str, Any] = {"metadata": {"name": "p", "labels": dict(labels or {})}, "spec": {"containers": []}}
    if role:
        pod["metadata"]["labels"]["vkprovider.io/role"] = role
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def _apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(pod))
    for op in ops:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/") for p in op["path"].strip("/").split("/")]
        target = out
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = op["value"]
    return out


def _terms(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    required = (
        pod["spec"].get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    return [t.get("matchExpressions", []) for t in (required or {}).get("nodeSelectorTerms", [])]


def test_hybrid_keeps_the_floor_native_and_sends_elastic_workers_to_virtual_nodes() -> None:
    for pod in (_routed_pod(role=PS), _routed_pod(priority=1500), _routed_pod()):
        routed = _apply(pod, routing.route(pod, routing.HYBRID, VK))
        assert _terms(routed) == [[routing.OFF_VIRTUAL]]
        assert not routed["spec"].get("tolerations")
    pod = _routed_pod(priority=500)
    routed = _apply(pod, routing.route(pod, routing.HYBRID, VK))
    assert routing.TOLERATION in routed["spec"]["tolerations"]
    preferred = routed["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 100, "preference": {"matchExpressions": [routing.on_virtual(VK)]}}]
    assert _terms(routed) == []  # preferred, not required: it still runs natively when nothing is lent
    assert routed["metadata"]["annotations"][routing.ROUTED] == "hybrid/worker-max"


def test_elastic_sends_every_band_to_virtual_nodes_and_keeps_the_users_terms() -> None:
    pod = _routed_pod(role=PS)
    own = {"key": "zone", "operator": "In", "values": ["a"]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [own]}]}
        }
    }
    pod["metadata"]["annotations"] = {"keep": "me"}
    routed = _apply(pod, routing.route(pod, routing.ELASTIC, VK))
    assert _terms(routed) == [[own, routing.on_virtual(VK)]]
    assert routed["metadata"]["annotations"] == {"keep": "me", routing.ROUTED: "elastic/ps"}


def test_routing_is_idempotent() -> None:
    pod = _routed_pod(priority=500)
    once = _apply(pod, routing.route(pod, routing.HYBRID, VK))
    assert routing.route(once, routing.HYBRID, VK) == []


@pytest.mark.parametrize(
    ("label", "namespace", "expected"),
    [(None, "hybrid", "hybrid"), ("elastic", "hybrid", "elastic"), ("off", "hybrid", None), (None, None, None)],
)
def test_policy_of(label: str | None, namespace: str | None, expected: str | None) -> None:
    pod = _routed_pod(labels={routing.POLICY_LABEL: label} if label else {})
    assert routing.policy_of(pod, namespace) == expected


def test_review_answers_with_a_json_patch_and_never_refuses() -> None:
    pod = _routed_pod(priority=500)
    answer = review("hybrid", {"request": {"uid": "u1", "kind": {"kind": "Pod"}, "object": pod}}, VK)
    response = answer["response"]
    assert response["uid"] == "u1" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert _apply(pod, ops)["spec"]["tolerations"] == [routing.TOLERATION]
    assert review("pod", {"request": {"uid": "u2", "object": pod}}, VK)["response"] == {"uid": "u2", "allowed": True}
    assert review("hybrid", {}, VK)["response"]["allowed"] is True  # garbage in: the pod is let through


def test_the_webhook_configuration_fails_open_and_selects_opted_in_pods_only() -> None:
    config = routing.webhook_configuration(name="r", url="https://127.0.0.1:9443/", ca_bundle="Q0E=")
    hooks = {h["name"]: h for h in config["webhooks"]}
    assert all(h["failurePolicy"] == "Ignore" and h["sideEffects"] == "None" for h in hooks.values())
    assert (
        hooks["hybrid-namespaces.routing.vkprovider.io"]["clientConfig"]["url"] == "https://127.0.0.1:9443/route/hybrid"
    )
    per_job = hooks["jobs.routing.vkprovider.io"]["objectSelector"]["matchExpressions"][0]
    assert per_job["values"] == ["hybrid", "elastic"]  # "off" is never sent
