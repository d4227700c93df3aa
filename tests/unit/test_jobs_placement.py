"""Job identity from every gang dialect, gang specs and roles, and gang placement by shapes."""

from __future__ import annotations

from typing import Any

import pytest

from federation.capacity.summary import MemberCapacity, NodeFree
from federation.dispatch.placement import candidates, pack, shortfall
from federation.jobs import GangSpec, JobRef, gang_of, job_of, role_of

GPU = "nvidia.com/gpu"


def _pod(**meta: Any) -> dict[str, Any]:
    spec = meta.pop("spec", {})
    return {"metadata": {"name": "p", "namespace": "ns", **meta}, "spec": spec}


@pytest.mark.parametrize(
    ("pod", "source", "name"),
    [
        (
            _pod(spec={"schedulingGroup": {"podGroupName": "g"}}, labels={"scheduling.x-k8s.io/pod-group": "x"}),
            "native",
            "g",
        ),
        (_pod(labels={"scheduling.x-k8s.io/pod-group": "sp"}), "scheduler-plugins", "sp"),
        (_pod(annotations={"scheduling.k8s.io/group-name": "vc"}), "volcano", "vc"),
        (_pod(annotations={"scheduling.volcano.sh/group-name": "vc2"}), "volcano", "vc2"),
        (_pod(labels={"pod-group.scheduling.sigs.k8s.io": "kd"}), "koordinator", "kd"),
        (_pod(annotations={"gang.scheduling.koordinator.sh/name": "kd2"}), "koordinator", "kd2"),
        (_pod(labels={"kueue.x-k8s.io/pod-group-name": "kq"}), "kueue", "kq"),
        (
            _pod(
                labels={"jobset.sigs.k8s.io/jobset-name": "train"},
                ownerReferences=[{"kind": "Job", "name": "train-workers-0", "controller": True}],
            ),
            "jobset",
            "train",
        ),
        (_pod(ownerReferences=[{"kind": "Job", "name": "train", "controller": True}]), "owner", "Job/train"),
        (_pod(), "pod", "p"),
    ],
)
def test_job_identity_in_order_of_precedence(pod: dict[str, Any], source: str, name: str) -> None:
    assert job_of(pod) == JobRef("ns", source, name)


def test_gang_specs_from_each_source() -> None:
    native = {
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 16}},
            "schedulingConstraints": {"topology": [{"key": "rack"}]},
        }
    }
    spec = gang_of(JobRef("ns", "native", "g"), _pod(), native)
    assert spec.min_member == 16 and spec.topology_key == "rack" and spec.is_gang
    sp = {"spec": {"minMember": 4, "scheduleTimeoutSeconds": 60}}
    assert gang_of(JobRef("ns", "scheduler-plugins", "g"), _pod(), sp) == GangSpec(min_member=4, timeout=60)
    vc = {"spec": {"minMember": 3}, "metadata": {"annotations": {"vkprovider.io/same-network-pod": "true"}}}
    spec = gang_of(JobRef("ns", "volcano", "g"), _pod(), vc)
    assert spec.min_member == 3 and spec.same_network
    koord = _pod(
        annotations={
            "gang.scheduling.koordinator.sh/min-available": "5",
            "gang.scheduling.koordinator.sh/waiting-time": "90s",
        }
    )
    assert gang_of(JobRef("ns", "koordinator", "g"), koord, None) == GangSpec(min_member=5, timeout=90)
    kueue = _pod(annotations={"kueue.x-k8s.io/pod-group-total-count": "8"})
    assert gang_of(JobRef("ns", "kueue", "g"), kueue, None).min_member == 8
    # A leader Job of one pod and 2 worker Jobs of 4 pods at once (of 8 completions), one of 3
    # completions at parallelism 5 (3 at once).
    jobset = {
        "spec": {
            "replicatedJobs": [
                {"name": "leader", "replicas": 1, "template": {"spec": {}}},
                {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 8}}},
                {"name": "eval", "template": {"spec": {"parallelism": 5, "completions": 3}}},
            ]
        }
    }
    assert gang_of(JobRef("ns", "jobset", "train"), _pod(), jobset).min_member == 1 + 8 + 3
    bare = _pod(annotations={"vkprovider.io/gpu-model": "V100", "vkprovider.io/same-gpu-model": "true"})
    spec = gang_of(JobRef("ns", "pod", "p"), bare, None)
    assert not spec.is_gang and spec.gpu_model == "V100" and spec.same_gpu_model


@pytest.mark.parametrize(
    ("priority", "label", "role"),
    [
        (2500, None, "ps"),
        (1500, None, "worker-min"),
        (10, None, "worker-max"),
        (10, "ps", "ps"),
        (None, None, "worker-min"),
    ],
)
def test_roles(priority: int | None, label: str | None, role: str) -> None:
    pod = _pod(labels={"vkprovider.io/role": label} if label else {}, spec={"priority": priority} if priority else {})
    assert role_of(pod) == role


def _nodes(prefix: str, count: int, gpus: int, *, product: str = "V100", per_domain: int = 2) -> list[NodeFree]:
    return [
        NodeFree(f"{prefix}{i}", {"cpu": 10000, GPU: gpus}, product, f"{prefix}-np{i // per_domain}", None)
        for i in range(count)
    ]


def test_pack_is_first_fit_decreasing() -> None:
    nodes = _nodes("n", 2, 8)
    assert pack(nodes, [{GPU: 4, "cpu": 1000}] * 4) == 20000 - 4000
    assert pack(nodes, [{GPU: 4}] * 5) is None
    assert pack(nodes, [{GPU: 6}, {GPU: 2}, {GPU: 2}, {GPU: 6}]) is not None  # needs largest-first


@pytest.mark.parametrize("request_", [{"cpu": 500}, {GPU: 8, "cpu": 9000}, {GPU: 9}, {"cpu": 10001}, {}])
def test_one_pod_packs_as_the_general_first_fit_would(request_: dict[str, int]) -> None:
    # The single-request shortcut skips copying every node's vector: same answer as two
    # requests of which the second is empty.
    nodes = [*_nodes("n", 3, 4), *_nodes("m", 1, 8)]
    assert pack(nodes, [request_]) == pack(nodes, [request_, {}])


def test_candidates_need_the_whole_gang_in_one_member_and_domain() -> None:
    capacities = {
        "m1": MemberCapacity(name="m1", nodes=_nodes("a", 4, 4)),  # 16 GPUs, but 8 per network pod
        "m2": MemberCapacity(name="m2", nodes=_nodes("b", 4, 8)),  # 16 GPUs per network pod
        "m3": MemberCapacity(name="m3", nodes=_nodes("c", 4, 8, product="T4")),
    }
    sixteen = [{GPU: 1}] * 16
    same_network = GangSpec(min_member=16, same_network=True)
    found = candidates(capacities, sixteen, same_network)
    assert [p.member for p in found] == ["m2", "m3"]
    assert found[0].network_pod in ("b-np0", "b-np1")
    v100 = GangSpec(min_member=16, same_network=True, gpu_model="V100")
    assert [p.member for p in candidates(capacities, sixteen, v100)] == ["m2"]
    assert candidates(capacities, [{GPU: 9}], GangSpec()) == []
    assert [p.member for p in candidates(capacities, sixteen, v100, exclude={"m2"})] == []
    capacities["m2"].reachable = False
    assert [p.member for p in candidates(capacities, sixteen, same_network)] == ["m3"]


def test_weights_order_candidates_then_tightest_fit() -> None:
    capacities = {
        "big": MemberCapacity(name="big", nodes=_nodes("a", 8, 8)),
        "small": MemberCapacity(name="small", nodes=_nodes("b", 2, 8)),
    }
    gang = [{GPU: 8}]
    assert [p.member for p in candidates(capacities, gang, GangSpec())] == ["small", "big"]  # tighter fit
    assert [p.member for p in candidates(capacities, gang, GangSpec(), weights={"big": 5})] == ["big", "small"]


def _node(name: str, cpu: int, pods: int) -> NodeFree:
    return NodeFree(name, {"cpu": cpu, "pods": pods}, None, None, None)


def test_room_claimed_by_pods_sent_and_not_yet_bound_is_not_offered_again() -> None:
    # A burst of plain pods: the member's summary counts a pod once it is on a node, so pods
    # already sent (reserved) must be subtracted from its lendable sum, or the tightest member
    # takes more than it has (pod slots, in the 3,000-pod benchmark that found this).
    caps = {
        "tight": MemberCapacity(name="tight", lendable={"cpu": 4000, "pods": 4}, nodes=[_node("t", 4000, 4)]),
        "roomy": MemberCapacity(name="roomy", lendable={"cpu": 80000, "pods": 400}, nodes=[_node("r", 80000, 400)]),
    }
    one = [{"cpu": 100, "pods": 1}]
    plain = GangSpec(min_member=1, timeout=60)
    assert candidates(caps, one, plain)[0].member == "tight"
    assert [p.member for p in candidates(caps, one, plain, reserved={"tight": {"cpu": 300, "pods": 3}})] == [
        "tight",
        "roomy",
    ]
    assert [p.member for p in candidates(caps, one, plain, reserved={"tight": {"cpu": 400, "pods": 4}})] == ["roomy"]


def test_a_capped_member_takes_no_gang_beyond_its_sum_whatever_its_nodes_hold() -> None:
    # Each node's free vector is clamped to what the member lends in all, their total is not:
    # under a cap of 6 cores, two nodes of 6 free cores would take 4 pods of 3 cores.
    capped = MemberCapacity(
        name="capped", lendable={"cpu": 6000, "pods": 20}, nodes=[_node("a", 6000, 10), _node("b", 6000, 10)]
    )
    four = [{"cpu": 3000, "pods": 1}] * 4
    gang = GangSpec(min_member=4)
    assert candidates({"capped": capped}, four, gang) == []
    assert [p.member for p in candidates({"capped": capped}, four[:2], gang)] == ["capped"]


def test_the_shortfall_names_each_member_and_what_the_gang_needs() -> None:
    caps = {
        "m1": MemberCapacity(name="m1", lendable={"cpu": 6000, "pods": 20}, nodes=[_node("a", 6000, 10)]),
        "m2": MemberCapacity(name="m2", lendable={"cpu": 16000, "pods": 20}, nodes=_nodes_cpu("b", 4, 4000)),
        "m3": MemberCapacity(name="m3", reachable=False),
        "m4": MemberCapacity(name="m4", lendable={"cpu": 64000}, nodes=[_node("d", 64000, 10)]),
    }
    four = [{"cpu": 5000, "pods": 1}] * 4
    gang = GangSpec(min_member=4)
    assert candidates(caps, four, gang, exclude={"m4"}) == []
    said = shortfall(caps, four, gang, exclude={"m4"})
    assert said.startswith("no member can take the gang's 4 pods (20 CPU) at once: ")
    assert "m1 lends 6 CPU;" in said  # short of the sum
    assert "m2 lends 16 CPU but its nodes cannot hold the pods" not in said  # 16 < 20: the sum
    assert "m2 lends 16 CPU;" in said
    assert "m3 unreachable" in said
    assert "m4 excluded" in said
    three = four[:3]  # 15 cores: m2's sum would do, its nodes of 4 cannot hold a pod of 5
    assert "m2 lends 16 CPU but its nodes cannot hold the pods" in shortfall(caps, three, gang, exclude={"m4"})
    assert shortfall({}, three, gang).endswith("no member is configured")


def _nodes_cpu(prefix: str, count: int, cpu: int) -> list[NodeFree]:
    return [_node(f"{prefix}{i}", cpu, 10) for i in range(count)]
