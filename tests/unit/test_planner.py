"""The reclaim planner's ordering rules, one table row each (pure, no event loop)."""

from __future__ import annotations

import pytest

from federation.capacity.fit import Constraints, Requirement, Term
from federation.reclaim.planner import NodeView, OurPod, PendingPod, plan

CPU = "cpu"
GPU = "nvidia.com/gpu"


def node(name: str, *, cpu: int = 96, online: int = 0, np: str | None = None, gpu: str | None = None) -> NodeView:
    return NodeView(name, {CPU: cpu * 1000, "pods": 110}, {CPU: online * 1000}, network_pod=np, gpu_model=gpu)


def pod(
    key: str,
    node: str,
    cpu: int,
    *,
    band: str = "worker-max",
    job: str | None = None,
    gang_min: int = 0,
    cost: int = 0,
    numa: str | None = None,
    noticed: bool = False,
) -> OurPod:
    return OurPod(
        key=key,
        node=node,
        requests={CPU: cpu * 1000, "pods": 1},
        band=band,
        job=job or key,
        gang_min=gang_min,
        deletion_cost=cost,
        numa_zone=numa,
        noticed=noticed,
    )


def cores(n: int) -> dict[str, int]:
    return {CPU: n * 1000}


def victims(result: object) -> list[str]:
    return sorted(v.pod.key for v in result.victims)  # type: ignore[attr-defined]


NODES = [node("n1", np="np0"), node("n2", np="np0"), node("n3", np="np1"), node("n4", np="np1")]


@pytest.mark.parametrize(
    ("rule", "pods", "need", "expected"),
    [
        (
            "lowest band first: worker-max before worker-min before PS",
            [
                pod("ps", "n1", 10, band="ps"),
                pod("min", "n2", 10, band="worker-min"),
                pod("max", "n3", 10, band="worker-max"),
            ],
            cores(10),
            ["max"],
        ),
        (
            "then worker-min, PS last",
            [
                pod("ps", "n1", 10, band="ps"),
                pod("min", "n2", 10, band="worker-min"),
                pod("max", "n3", 10, band="worker-max"),
            ],
            cores(20),
            ["max", "min"],
        ),
        (
            "no more than needed",
            [pod(f"m{i}", "n1", 10) for i in range(5)] + [pod("ps", "n1", 1, band="ps"), pod("x", "n2", 10)],
            cores(25),
            ["x", "m0", "m1"],
        ),
        (
            "whole machines first: the node that empties over a bigger one that does not",
            [pod("a1", "n1", 20), pod("a2", "n1", 20), pod("aps", "n1", 10, band="ps"), pod("b1", "n2", 20)],
            cores(20),
            ["b1"],
        ),
        (
            "as few nodes as possible: the biggest whole nodes",
            [pod("a1", "n1", 40), pod("b1", "n2", 30), pod("b2", "n2", 30), pod("c1", "n3", 20)],
            cores(60),
            ["b1", "b2"],
        ),
        (
            "one node that covers the rest alone: the smallest such",
            [pod("a1", "n1", 80), pod("b1", "n2", 30), pod("c1", "n3", 20)],
            cores(25),
            ["b1"],
        ),
        (
            "a whole NUMA zone before splitting one",
            [
                pod("z0a", "n1", 10, numa="0"),
                pod("z0b", "n1", 10, numa="0"),
                pod("z1a", "n1", 10, numa="1"),
                pod("keep", "n1", 10, band="ps"),
            ],
            cores(10),
            ["z1a"],
        ),
        (
            "homogeneous leftovers: from the network pod where the job is thinnest",
            [
                pod("j-a", "n1", 10, job="j"),
                pod("j-b", "n1", 10, job="j"),
                pod("j-c", "n3", 10, job="j"),
                pod("ps1", "n1", 1, band="ps"),
                pod("ps3", "n3", 1, band="ps"),
            ],
            cores(10),
            ["j-c"],
        ),
        (
            "pod-deletion-cost breaks ties, lower first",
            [
                pod("dear", "n1", 10, cost=100),
                pod("cheap", "n2", 10, cost=-5),
                pod("keep1", "n1", 1, band="ps"),
                pod("keep2", "n2", 1, band="ps"),
            ],
            cores(10),
            ["cheap"],
        ),
        (
            "equal in every rule: by name, so plans are repeatable",
            [pod("b", "n1", 10), pod("a", "n2", 10), pod("k1", "n1", 1, band="ps"), pod("k2", "n2", 1, band="ps")],
            cores(10),
            ["a"],
        ),
        (
            "elastic shrinks from the top: above-minimum worker-min before a worker-max gang's minimum",
            [
                pod("g1", "n1", 10, band="worker-max", job="g", gang_min=2),
                pod("g2", "n2", 10, band="worker-max", job="g", gang_min=2),
                pod("e1", "n3", 10, band="worker-min", job="e", gang_min=2),
                pod("e2", "n3", 10, band="worker-min", job="e", gang_min=2),
                pod("e3", "n4", 10, band="worker-min", job="e", gang_min=2),
            ],
            cores(10),
            ["e3"],
        ),
        (
            "a gang never limps: other victims first",
            [
                pod("g1", "n1", 10, band="worker-max", job="g", gang_min=3),
                pod("g2", "n1", 10, band="worker-max", job="g", gang_min=3),
                pod("g3", "n1", 10, band="worker-max", job="g", gang_min=3),
                pod("w", "n2", 10, band="worker-min"),
            ],
            cores(10),
            ["w"],
        ),
        (
            "a gang that must give goes whole, all at once",
            [
                pod("g1", "n1", 10, band="worker-min", job="g", gang_min=3),
                pod("g2", "n2", 10, band="worker-min", job="g", gang_min=3),
                pod("g3", "n3", 10, band="worker-min", job="g", gang_min=3),
                pod("ps", "n4", 10, band="ps"),
            ],
            cores(15),
            ["g1", "g2", "g3"],
        ),
        (
            "a gang with elastic pods loses those first, lowest band first",
            [
                pod("c1", "n1", 10, band="ps", job="g", gang_min=2),
                pod("c2", "n1", 10, band="worker-min", job="g", gang_min=2),
                pod("x1", "n2", 10, band="worker-max", job="g", gang_min=2),
                pod("x2", "n3", 10, band="worker-min", job="g", gang_min=2),
            ],
            cores(10),
            ["x1"],
        ),
        (
            "pods under notice are kept while needed",
            [pod("old", "n1", 10, band="worker-min", noticed=True), pod("new", "n2", 10, band="worker-max")],
            cores(10),
            ["old"],
        ),
        (
            "no over-reclaim (issue 34): sixteen 4-core pods on two nodes, a 4-core deficit: one pod",
            [pod(f"a{i}", "n1", 4) for i in range(8)] + [pod(f"b{i}", "n2", 4) for i in range(8)],
            cores(4),
            ["a0"],
        ),
        (
            "a machine's worth of need: a whole machine",
            [pod(f"a{i}", "n1", 4) for i in range(8)] + [pod(f"b{i}", "n2", 4) for i in range(8)],
            cores(32),
            [f"a{i}" for i in range(8)],
        ),
        (
            "a machine's worth and a little: the machine and one pod, not two machines",
            [pod(f"a{i}", "n1", 4) for i in range(8)] + [pod(f"b{i}", "n2", 4) for i in range(8)],
            cores(36),
            [f"a{i}" for i in range(8)] + ["b0"],
        ),
        (
            "a machine that frees the rest alone, every pod of it needed, no more victims than otherwise",
            [
                pod("a1", "n1", 6),
                pod("a2", "n1", 6),
                pod("b1", "n2", 6),
                pod("b2", "n2", 6),
                pod("bp", "n2", 1, band="ps"),
            ],
            cores(12),
            ["a1", "a2"],
        ),
        (
            "a whole machine is never bought with an extra victim",
            [pod("a1", "n1", 3), pod("a2", "n1", 3), pod("b1", "n2", 4), pod("bp", "n2", 1, band="ps")],
            cores(4),
            ["b1"],
        ),
        (
            "a machine bigger than the need is not taken when a smaller pod does (issue 40): 4 cores of 96",
            [pod("whole", "n1", 96), pod("s1", "n2", 4), pod("s2", "n2", 4)],
            cores(4),
            ["s1"],
        ),
        (
            "a machine bigger than the need when nothing smaller does: its one pod",
            [pod("whole", "n1", 96), pod("s1", "n2", 4)],
            cores(6),
            ["whole"],
        ),
        (
            "a pod bigger than the need before several smaller ones: the fewest victims",
            [pod("s1", "n1", 4), pod("s2", "n1", 4), pod("s3", "n1", 4), pod("big", "n2", 40)],
            cores(10),
            ["big"],
        ),
        (
            "a noticed pod that is no longer enough is kept, one more is added, nothing spare",
            [pod("old", "n1", 4, noticed=True), pod("x", "n2", 8), pod("y", "n3", 4)],
            cores(8),
            ["old", "y"],
        ),
        (
            "a noticed pod that a bigger choice makes spare is given back",
            [pod("old", "n1", 2, noticed=True), pod("big", "n2", 10), pod("k", "n2", 1, band="ps")],
            cores(10),
            ["big"],
        ),
        (
            "and dropped when no longer needed",
            [pod("old", "n1", 10, noticed=True), pod("keep", "n1", 5, band="ps")],
            {},
            [],
        ),
    ],
)
def test_ordering_rules(rule: str, pods: list[OurPod], need: dict[str, int], expected: list[str]) -> None:
    result = plan(nodes=NODES, pods=pods, deficit=need)
    assert victims(result) == sorted(expected), rule
    assert not result.unmet, rule


def unusable(name: str, why: str) -> NodeView:
    return NodeView(name, {CPU: 96_000, "pods": 110}, {CPU: 0}, unusable=why)


def test_pods_on_a_cordoned_node_go_first_and_count_towards_the_deficit() -> None:
    nodes = [unusable("n1", "node n1 is cordoned"), node("n2")]
    pods = [pod("stranded", "n1", 10, band="ps"), pod("w", "n2", 10)]
    # The deficit (10 cores) already leaves n1 out: the stranded pod covers it, nothing else goes.
    result = plan(nodes=nodes, pods=pods, deficit=cores(10))
    assert victims(result) == ["stranded"]
    assert result.victims[0].reason.startswith("node n1 is cordoned")
    # And it goes with no deficit at all, as a drain would take it.
    assert victims(plan(nodes=nodes, pods=pods, deficit={})) == ["stranded"]


def test_a_ps_on_a_cordoned_node_goes_first_not_the_workers_one_round_at_a_time() -> None:
    nodes = [unusable("n1", "node n1 has taint maintenance:NoExecute"), node("n2")]
    gang = [pod("ps", "n1", 4, band="ps", job="g", gang_min=2)]
    gang += [pod(f"w{i}", "n2", 4, band="worker-min", job="g", gang_min=2) for i in range(3)]
    result = plan(nodes=nodes, pods=gang, deficit=cores(4))
    assert victims(result) == ["ps"]
    assert "NoExecute" in result.victims[0].reason


def test_a_gang_at_its_minimum_with_a_pod_on_an_unusable_node_goes_whole() -> None:
    nodes = [unusable("n1", "node n1 is NotReady"), node("n2")]
    gang = [pod("g0", "n1", 4, job="g", gang_min=3), pod("g1", "n2", 4, job="g", gang_min=3)]
    gang += [pod("g2", "n2", 4, job="g", gang_min=3), pod("other", "n2", 4)]
    assert victims(plan(nodes=nodes, pods=gang, deficit={})) == ["g0", "g1", "g2"]


def test_a_smaller_gang_goes_before_a_bigger_one_and_never_limps() -> None:
    pods = [
        pod("b0", "n1", 12, band="worker-min", job="b", gang_min=4),
        pod("b1", "n2", 12, band="worker-min", job="b", gang_min=4),
        pod("b2", "n3", 12, band="worker-min", job="b", gang_min=4),
        pod("b3", "n4", 12, band="worker-min", job="b", gang_min=4),
        pod("c0", "n1", 12, band="worker-min", job="c", gang_min=2),
        pod("c1", "n2", 12, band="worker-min", job="c", gang_min=2),
        pod("c2", "n3", 12, band="worker-max", job="c", gang_min=2),
        pod("c3", "n4", 12, band="worker-max", job="c", gang_min=2),
        pod("ps", "n1", 12, band="ps", job="a", gang_min=2),
        pod("aw", "n2", 12, band="worker-min", job="a", gang_min=2),
    ]
    # c2 and c3 (above the minimum) first; then c's minimum goes whole (smaller than b's); giving
    # back c3 would leave c limping at one pod of a minimum of two, so it stays taken.
    assert victims(plan(nodes=NODES, pods=pods, deficit=cores(36))) == ["c0", "c1", "c2", "c3"]


def test_a_gang_under_notice_is_kept_or_dropped_whole() -> None:
    gang = [pod(f"g{i}", f"n{i + 1}", 10, band="worker-min", job="g", gang_min=3, noticed=True) for i in range(3)]
    assert victims(plan(nodes=NODES, pods=gang, deficit=cores(5))) == ["g0", "g1", "g2"]
    assert victims(plan(nodes=NODES, pods=gang, deficit={})) == []


def test_whole_machines_and_emptied_nodes_are_reported() -> None:
    pods = [pod("a", "n1", 40), pod("b", "n2", 40), pod("c", "n3", 10), pod("d", "n3", 30, band="ps")]
    result = plan(nodes=NODES, pods=pods, deficit=cores(80))
    assert victims(result) == ["a", "b"]
    assert result.nodes_emptied == ["n1", "n2"]
    assert all("empties node" in v.reason for v in result.victims)


def test_what_cannot_be_freed_is_reported_unmet() -> None:
    result = plan(nodes=NODES, pods=[pod("a", "n1", 10)], deficit=cores(30))
    assert victims(result) == ["a"]
    assert result.unmet == cores(20)


def test_pending_online_pod_gets_room_on_the_cheapest_node() -> None:
    nodes = [node("n1", online=50), node("n2", online=50)]
    pods = [
        pod("ps", "n1", 40, band="ps"),
        pod("w1", "n2", 20, band="worker-max"),
        pod("w2", "n2", 20, band="worker-max"),
    ]
    waiting = PendingPod("online/web-0", {CPU: 20_000})
    result = plan(nodes=nodes, pods=pods, pending=[waiting])
    # n2 has 6 cores free: one 20-core worker-max pod is enough; never the PS on n1.
    assert len(result.victims) == 1 and result.victims[0].pod.node == "n2"
    assert result.served == ["online/web-0"]
    assert "online/web-0" in result.victims[0].reason


def test_pending_pod_that_already_fits_takes_nothing() -> None:
    nodes = [node("n1", online=10), node("n2", online=90)]
    result = plan(nodes=nodes, pods=[pod("w", "n2", 5)], pending=[PendingPod("online/x", {CPU: 50_000})])
    assert victims(result) == [] and result.served == []


def test_pending_pod_respects_its_node_selector() -> None:
    nodes = [node("n1", online=80, gpu="T4"), node("n2", online=80, gpu="V100")]
    pods = [pod("t4", "n1", 15), pod("v100", "n2", 15)]
    waiting = PendingPod(
        "online/gpu", {CPU: 10_000}, constraints=Constraints(node_selector=(("nvidia.com/gpu.product", "V100"),))
    )
    assert victims(plan(nodes=nodes, pods=pods, pending=[waiting])) == ["v100"]


def test_pending_pods_and_a_deficit_together_do_not_double_count() -> None:
    nodes = [node("n1", online=80), node("n2", online=0)]
    pods = [pod("a", "n1", 15), pod("b", "n2", 10), pod("c", "n2", 10)]
    result = plan(nodes=nodes, pods=pods, deficit=cores(15), pending=[PendingPod("online/x", {CPU: 10_000})])
    # "a" makes room for the waiting pod and also covers the 15-core deficit.
    assert victims(result) == ["a"]


def _labelled(name: str, labels: dict[str, str], *, taints: tuple[tuple[str, str, str], ...] = ()) -> NodeView:
    return NodeView(
        name, {CPU: 96_000, "pods": 110}, {CPU: 70_000}, labels=tuple(sorted(labels.items())), taints=taints
    )


GPU_TAINT = ("dedicated", "gpu", "NoSchedule")


def _waiting(constraints: Constraints) -> PendingPod:
    return PendingPod("online/web", {CPU: 20_000}, constraints=constraints)


def test_a_waiting_pod_selecting_a_label_no_node_has_gets_no_victim() -> None:
    nodes = [_labelled("n1", {"pool": "batch"}), _labelled("n2", {"pool": "db"})]
    pods = [pod("a", "n1", 15), pod("b", "n2", 15)]
    result = plan(nodes=nodes, pods=pods, pending=[_waiting(Constraints(node_selector=(("pool", "web"),)))])
    assert victims(result) == [] and result.served == []


def test_a_waiting_pod_gets_room_only_where_its_affinity_and_tolerations_let_it() -> None:
    ssd: Requirement = ("disk", "In", ("ssd",))
    affinity: tuple[Term, ...] = (((ssd,), ()),)
    tolerations = (("dedicated", "Equal", "gpu", "NoSchedule"),)
    nodes = [
        _labelled("n1", {"disk": "hdd"}, taints=(GPU_TAINT,)),  # tolerated, wrong disk
        _labelled("n2", {"disk": "ssd"}, taints=(("other", "", "NoExecute"),)),  # right disk, not tolerated
        _labelled("n3", {"disk": "ssd"}, taints=(GPU_TAINT,)),  # both
        _labelled("n4", {"disk": "ssd"}),  # both (no taint)
    ]
    pods = [
        pod("a", "n1", 15),
        pod("b", "n2", 15),
        pod("c", "n3", 15, band="worker-min"),
        pod("d", "n4", 15, band="ps"),
    ]
    waiting = _waiting(Constraints(affinity=affinity, tolerations=tolerations))
    result = plan(nodes=nodes, pods=pods, pending=[waiting])
    assert victims(result) == ["c"]  # cheaper than the PS on n4; never n1 or n2
    without = _waiting(Constraints(affinity=affinity))
    assert victims(plan(nodes=nodes, pods=pods, pending=[without])) == ["d"]  # n4 only: no toleration


def test_waiting_pods_of_one_kind_each_get_their_own_node() -> None:
    nodes = [node(f"n{i}", online=70) for i in range(1, 4)]
    pods = [pod(f"w{i}", f"n{i}", 15) for i in range(1, 4)]
    waiting = [PendingPod(f"online/web-{i}", {CPU: 20_000}) for i in range(3)]
    result = plan(nodes=nodes, pods=pods, pending=waiting)
    assert victims(result) == ["w1", "w2", "w3"]
    assert sorted(result.served) == [w.key for w in waiting]
