"""Capacity arithmetic for every model, table-driven, with the edge cases: tainted and
unschedulable nodes, pods without requests, terminating and finished pods, extended
resources, sidecars, colocation resources, time windows across midnight, caps, hysteresis."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from federation.capacity import quantities
from federation.capacity.inventory import Inventory, pod_requests
from federation.capacity.nodes import Damper
from federation.capacity.summary import CapacityPolicy, TimeWindow, summarize

GI = 2**30


def node(name: str, *, cpu: str = "10", memory: str = "40Gi", gpus: int = 0, ready: bool = True, **extra: Any) -> dict:  # type: ignore[type-arg]
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update(extra.pop("allocatable", {}))
    return {
        "metadata": {"name": name, "labels": extra.pop("labels", {})},
        "spec": extra.pop("spec", {}),
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    uid: str,
    node_name: str,
    requests: dict[str, str] | None,
    *,
    ours: bool = False,
    phase: str = "Running",
    **extra: Any,
) -> dict:  # type: ignore[type-arg]
    meta: dict[str, Any] = {"uid": uid, "labels": {"vkprovider.io/managed": "true"} if ours else {}}
    meta.update(extra.pop("meta", {}))
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "containers": [{"name": "c", "resources": {"requests": requests or {}}}],
    }
    spec.update(extra.pop("spec", {}))
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def inventory(nodes: list[dict], pods: list[dict]) -> Inventory:  # type: ignore[type-arg]
    inv = Inventory()
    inv.replace_nodes(nodes)
    inv.replace_pods(pods)
    return inv


NOON = datetime.time(12, 0)
NO_RESERVE = CapacityPolicy(reserve_percent=0)


def test_quantities() -> None:
    assert quantities.to_canonical("cpu", "95500m") == 95500
    assert quantities.to_canonical("cpu", "2") == 2000
    assert quantities.to_canonical("cpu", "0.1") == 100
    assert quantities.to_canonical("memory", "1.5Gi") == int(1.5 * GI)
    assert quantities.to_canonical("memory", "1e3") == 1000
    assert quantities.to_canonical("memory", "500M") == 500_000_000
    assert quantities.vector({"cpu": "1", "bogus": "lots"}) == {"cpu": 1000}
    assert quantities.format_quantity("cpu", 1500) == "1500m" and quantities.format_quantity("cpu", 2000) == "2"


def test_headroom_subtracts_online_requests_and_reserve() -> None:
    inv = inventory([node("a")], [pod("p1", "a", {"cpu": "3", "memory": "10Gi"})])
    summary = summarize("m", inv, CapacityPolicy(reserve_percent=10), now=NOON)
    assert summary.lendable["cpu"] == 10000 - 3000 - 1000
    assert summary.lendable["memory"] == 40 * GI - 10 * GI - 4 * GI
    assert summary.lendable["pods"] == 109


@pytest.mark.parametrize(
    ("change", "eligible"),
    [
        ({"ready": False}, 0),
        ({"spec": {"unschedulable": True}}, 0),
        ({"spec": {"taints": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]}}, 0),
        ({"spec": {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}}, 1),
    ],
)
def test_ineligible_nodes_lend_nothing(change: dict[str, Any], eligible: int) -> None:
    summary = summarize("m", inventory([node("a", **change)], []), NO_RESERVE, now=NOON)
    assert summary.nodes_eligible == eligible
    assert summary.lendable.get("cpu", 0) == (10000 if eligible else 0)


def test_tainted_node_counts_when_our_pods_tolerate_it() -> None:
    tainted = node("a", spec={"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]})
    policy = CapacityPolicy(
        reserve_percent=0, tolerations=({"key": "dedicated", "operator": "Equal", "value": "batch"},)
    )
    assert summarize("m", inventory([tainted], []), policy, now=NOON).lendable["cpu"] == 10000


def test_pods_without_requests_terminating_and_finished() -> None:
    pods = [
        pod("besteffort", "a", None),
        pod("terminating", "a", {"cpu": "2"}, meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        pod("done", "a", {"cpu": "4"}, phase="Succeeded"),
        pod("failed", "a", {"cpu": "4"}, phase="Failed"),
    ]
    summary = summarize("m", inventory([node("a")], pods), NO_RESERVE, now=NOON)
    assert summary.lendable["cpu"] == 8000  # only the terminating pod still holds its node
    assert summary.lendable["pods"] == 108


def test_our_pods_are_used_capacity_not_online_load() -> None:
    pods = [pod("online", "a", {"cpu": "2"}), pod("ours", "a", {"cpu": "3"}, ours=True)]
    summary = summarize("m", inventory([node("a")], pods), NO_RESERVE, now=NOON)
    assert summary.lendable["cpu"] == 5000
    assert summary.ours_used["cpu"] == 3000
    assert summary.capacity["cpu"] == 8000  # what the virtual node shows: lendable + ours


def test_extended_resources_and_sidecars() -> None:
    spec = {
        "initContainers": [
            {"name": "setup", "resources": {"requests": {"cpu": "6"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        ],
        "overhead": {"cpu": "250m"},
    }
    requests = pod_requests({"containers": [{"resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "2"}}}], **spec})
    assert requests["cpu"] == max(2000 + 1000, 6000) + 250
    assert requests["nvidia.com/gpu"] == 2
    inv = inventory([node("g", gpus=8)], [pod("p", "g", {"nvidia.com/gpu": "3", "example.com/fpga": "1"})])
    summary = summarize("m", inv, NO_RESERVE, now=NOON)
    assert summary.lendable["nvidia.com/gpu"] == 5


def test_colocation_resources_become_canonical_cpu_and_memory() -> None:
    koord = node("k", allocatable={"kubernetes.io/batch-cpu": "30000", "kubernetes.io/batch-memory": str(50 * GI)})
    katalyst = node(
        "t",
        allocatable={
            "resource.katalyst.kubewharf.io/reclaimed_millicpu": "12000",
            "resource.katalyst.kubewharf.io/reclaimed_memory": str(8 * GI),
        },
    )
    pods = [
        pod("online", "k", {"cpu": "9"}),  # online load is already netted out by the colocation stack
        pod("batch", "k", {"kubernetes.io/batch-cpu": "5000"}, ours=True),
    ]
    summary = summarize("m", inventory([koord, katalyst], pods), CapacityPolicy(model="colocation"), now=NOON)
    free = {n.name: n.free for n in summary.nodes}
    assert free["k"]["cpu"] == 25000 and free["k"]["memory"] == 50 * GI
    assert free["t"]["cpu"] == 12000 and free["t"]["memory"] == 8 * GI
    assert summary.ours_used["cpu"] == 5000


def test_time_windows_cross_midnight_and_caps() -> None:
    night = TimeWindow(datetime.time(22, 0), datetime.time(6, 0), multiplier=1.0)
    day = TimeWindow(datetime.time(6, 0), datetime.time(22, 0), multiplier=0.25, cap={"cpu": 2000})
    assert night.active(datetime.time(23, 30)) and night.active(datetime.time(2, 0))
    assert not night.active(datetime.time(6, 0)) and day.active(datetime.time(6, 0))
    policy = CapacityPolicy(reserve_percent=0, windows=(night, day), cap={"memory": 50 * GI})
    inv = inventory([node("a"), node("b")], [])
    at_night = summarize("m", inv, policy, now=datetime.time(1, 0))
    assert at_night.lendable["cpu"] == 20000 and at_night.lendable["memory"] == 50 * GI  # member cap
    by_day = summarize("m", inv, policy, now=NOON)
    assert by_day.lendable["cpu"] == 2000  # 0.25 x 20 cores = 5, capped at 2
    assert by_day.largest["cpu"]["cpu"] == 2000


def test_caps_and_windows_bound_the_total_lent_our_pods_included() -> None:
    """A cap is the member's quota for all our pods together: what is lendable on top is the
    cap minus what ours hold; lowering it below that leaves nothing to lend and an allowance
    below what is held (the reclaim planner's deficit)."""
    inv = inventory([node("a"), node("b")], [pod("ours", "a", {"cpu": "6"}, ours=True)])
    capped = summarize("m", inv, CapacityPolicy(reserve_percent=0, cap={"cpu": 8000}), now=NOON)
    assert capped.allowed["cpu"] == 8000 and capped.lendable["cpu"] == 2000
    assert capped.largest["cpu"]["cpu"] == 2000  # no node offers more than the member lends
    assert capped.capacity["cpu"] == 8000  # what the virtual node shows: held plus lendable
    lowered = summarize("m", inv, CapacityPolicy(reserve_percent=0, cap={"cpu": 4000}), now=NOON)
    assert lowered.allowed["cpu"] == 4000 and "cpu" not in lowered.lendable
    half = TimeWindow(datetime.time(0, 0), datetime.time(23, 59), multiplier=0.5)
    windowed = summarize("m", inv, CapacityPolicy(reserve_percent=0, windows=(half,)), now=NOON)
    assert windowed.allowed["cpu"] == 10000  # half of both nodes' budgets (20 cores)
    assert windowed.lendable["cpu"] == 4000


def test_shapes_gpu_models_network_pods_numa() -> None:
    nodes = [
        node("v1", gpus=8, labels={"nvidia.com/gpu.product": "V100", "vkprovider.io/network-pod": "np0"}),
        node("v2", gpus=8, labels={"nvidia.com/gpu.product": "V100", "vkprovider.io/network-pod": "np1"}),
        node("t1", gpus=4, labels={"nvidia.com/gpu.product": "T4", "vkprovider.io/network-pod": "np1"}),
    ]
    pods = [pod("p", "v1", {"nvidia.com/gpu": "6", "cpu": "1"})]
    inv = inventory(nodes, pods)
    inv.upsert_topology(
        {
            "metadata": {"name": "v2"},
            "zones": [
                {"name": "node-0", "type": "Node", "resources": [{"name": "nvidia.com/gpu", "available": "4"}]},
                {"name": "s0", "type": "Socket", "resources": [{"name": "nvidia.com/gpu", "available": "8"}]},
            ],
        }
    )
    summary = summarize("m", inv, NO_RESERVE, now=NOON)
    assert summary.gpus_by_model == {"V100": 10, "T4": 4}
    assert summary.gpus_total_by_model == {"V100": 16, "T4": 4}
    assert summary.largest["gpu"]["nvidia.com/gpu"] == 8
    assert summary.network_pods["np1"]["nvidia.com/gpu"] == 12
    assert summary.numa_zones == 1 and summary.numa_largest["nvidia.com/gpu"] == 4
    assert summary.fits_one({"nvidia.com/gpu": 8}) and not summary.fits_one({"nvidia.com/gpu": 9})


def test_pod_events_update_usage_incrementally() -> None:
    inv = inventory([node("a")], [])
    inv.upsert_pod(pod("p", "a", {"cpu": "2"}))
    inv.upsert_pod(pod("p", "a", {"cpu": "2"}))  # the same pod again: counted once
    assert inv.online_used["a"]["cpu"] == 2000
    inv.upsert_pod(pod("p", "a", {"cpu": "2"}, phase="Succeeded"))
    assert inv.online_used["a"]["cpu"] == 0
    inv.upsert_pod(pod("q", "a", {"cpu": "1"}))
    inv.delete_pod(pod("q", "a", {"cpu": "1"}))
    assert inv.online_used["a"]["cpu"] == 0 and not inv.pods


def test_damper_publishes_decreases_at_once_and_holds_small_increases() -> None:
    damper = Damper(hold=10)
    published, changed = damper.update({"cpu": 100_000}, now=0)
    assert changed
    published, changed = damper.update({"cpu": 99_000}, now=1)  # a decrease: at once
    assert changed and published["cpu"] == 99_000
    published, changed = damper.update({"cpu": 99_500}, now=2)  # small increase: held
    assert not changed and published["cpu"] == 99_000
    published, changed = damper.update({"cpu": 99_500}, now=12.5)  # held long enough
    assert changed and published["cpu"] == 99_500
    published, changed = damper.update({"cpu": 150_000}, now=13)  # a big increase: at once
    assert changed


def test_incremental_summaries_equal_full_ones_under_random_events() -> None:
    """Property: whatever the event sequence, the incremental Summarizer gives what a full
    `summarize` gives (the fake sizes stand in for a cluster; pure logic, no apiserver)."""
    import random

    from federation.capacity.summary import Summarizer

    rng = random.Random(7)
    products = [None, "V100", "T4"]
    inv = Inventory()
    inv.replace_nodes(
        [
            node(
                f"n{i}",
                gpus=8 if products[i % 3] else 0,
                labels={
                    "vkprovider.io/network-pod": f"np{i // 4}",
                    **({"nvidia.com/gpu.product": products[i % 3]} if products[i % 3] else {}),
                },
            )
            for i in range(12)
        ]
    )
    policy = CapacityPolicy(reserve_percent=5)
    incremental = Summarizer("m")
    for step in range(400):
        roll = rng.random()
        target = f"n{rng.randrange(14)}"  # sometimes a node that does not exist (yet)
        if roll < 0.55:
            requests = {"cpu": f"{rng.randrange(1, 4000)}m", "nvidia.com/gpu": str(rng.randrange(0, 3))}
            phase = rng.choice(["Running", "Running", "Pending", "Succeeded"])
            inv.upsert_pod(pod(f"p{rng.randrange(60)}", target, requests, ours=rng.random() < 0.3, phase=phase))
        elif roll < 0.7:
            inv.delete_pod(pod(f"p{rng.randrange(60)}", target, None))
        elif roll < 0.8:
            inv.upsert_node(node(target, ready=rng.random() < 0.8, gpus=rng.choice([0, 4, 8])))
        elif roll < 0.85:
            inv.delete_node(target)
        else:
            inv.upsert_topology(
                {
                    "metadata": {"name": target},
                    "zones": [
                        {
                            "name": "node-0",
                            "type": "Node",
                            "resources": [{"name": "cpu", "available": str(rng.randrange(1, 40))}],
                        }
                    ],
                }
            )
        if step % 7 == 0:
            full = summarize("m", inv, policy, now=NOON)
            fast = incremental.summarize(inv, policy, now=NOON)
            assert fast.to_json() == full.to_json(), f"diverged at step {step}"
            assert sorted(n.name for n in fast.nodes) == sorted(n.name for n in full.nodes)


def test_agent_stream_round_trip_feeds_the_same_incremental_summary() -> None:
    """What the agent sends (changed nodes as protobuf) rebuilds an inventory whose incremental
    summary equals the direct one, event after event."""
    from federation.agent.convert import apply_node, node_message, remove_node
    from federation.capacity.summary import Summarizer

    direct = inventory([node(f"n{i}", gpus=4) for i in range(6)], [])
    mirror = Inventory()
    sent: dict[str, int] = {}
    incremental = Summarizer("m")
    policy = CapacityPolicy()
    for step in range(60):
        direct.upsert_pod(
            pod(f"p{step % 9}", f"n{step % 6}", {"cpu": f"{100 * (step % 7 + 1)}m", "nvidia.com/gpu": "1"})
        )
        if step % 11 == 0:
            direct.delete_node(f"n{step % 6}")
        if step % 13 == 0:
            direct.upsert_node(node(f"n{step % 6}", gpus=8))
        for name, version in direct.node_versions.items():
            if sent.get(name) != version and name in direct.nodes:
                apply_node(mirror, node_message(direct, name))
                sent[name] = version
        for name in [n for n in sent if n not in direct.nodes]:
            remove_node(mirror, name)
            del sent[name]
        assert (
            incremental.summarize(mirror, policy, now=NOON).to_json()
            == summarize("m", direct, policy, now=NOON).to_json()
        )
