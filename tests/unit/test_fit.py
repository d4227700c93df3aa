"""Where a pod may run, as kube-scheduler's filters judge it (federation.capacity.fit), and how
the inventory keeps what that needs compactly."""

from __future__ import annotations

from typing import Any

import pytest

from federation.capacity import fit
from federation.capacity.inventory import Inventory, node_record, unusable_reason
from federation.capacity.summary import CapacityPolicy, eligible

LABELS = {"pool": "web", "disk": "ssd", "cpus": "64", "kubernetes.io/hostname": "n1"}


def _constraints(spec: dict[str, Any]) -> fit.Constraints:
    return fit.pod_constraints(spec, fit.Interner())


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    }


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("case", "spec", "fits"),
    [
        ("no constraints", {}, True),
        ("nodeSelector on any label", {"nodeSelector": {"disk": "ssd"}}, True),
        ("nodeSelector on a label the node lacks", {"nodeSelector": {"pool": "db"}}, False),
        ("nodeSelector on the hostname", {"nodeSelector": {"kubernetes.io/hostname": "n1"}}, True),
        ("In", _required(_expr("pool", "In", "db", "web")), True),
        ("In, no such value", _required(_expr("pool", "In", "db")), False),
        ("In, no such label", _required(_expr("zone", "In", "a")), False),
        ("NotIn", _required(_expr("pool", "NotIn", "db")), True),
        ("NotIn, the value", _required(_expr("pool", "NotIn", "web")), False),
        ("NotIn, no such label", _required(_expr("zone", "NotIn", "a")), True),
        ("Exists", _required(_expr("disk", "Exists")), True),
        ("Exists, no such label", _required(_expr("gpu", "Exists")), False),
        ("DoesNotExist", _required(_expr("gpu", "DoesNotExist")), True),
        ("DoesNotExist, the label is there", _required(_expr("disk", "DoesNotExist")), False),
        ("Gt", _required(_expr("cpus", "Gt", "32")), True),
        ("Gt, not greater", _required(_expr("cpus", "Gt", "64")), False),
        ("Lt", _required(_expr("cpus", "Lt", "128")), True),
        ("Lt, not less", _required(_expr("cpus", "Lt", "64")), False),
        ("Gt on a label that is no integer", _required(_expr("pool", "Gt", "1")), False),
        ("Gt on no such label", _required(_expr("gpus", "Gt", "1")), False),
        (
            "matchFields metadata.name In",
            _required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}),
            True,
        ),
        (
            "matchFields metadata.name NotIn",
            _required({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}),
            False,
        ),
        ("terms are ORed", _required(_expr("pool", "In", "db"), _expr("disk", "In", "ssd")), True),
        (
            "requirements of a term are ANDed",
            _required(
                {
                    "matchExpressions": [
                        {"key": "pool", "operator": "In", "values": ["web"]},
                        {"key": "disk", "operator": "In", "values": ["hdd"]},
                    ]
                }
            ),
            False,
        ),
        ("an empty term matches no node", _required({}), False),
        ("no terms match no node", _required(), False),
        ("an unknown operator matches nothing", _required(_expr("pool", "Like", "web")), False),
        (
            "selector and affinity both hold",
            {"nodeSelector": {"pool": "web"}, **_required(_expr("disk", "Exists"))},
            True,
        ),
        (
            "selector and affinity: one fails",
            {"nodeSelector": {"pool": "db"}, **_required(_expr("disk", "Exists"))},
            False,
        ),
    ],
)
def test_node_selector_and_required_affinity(case: str, spec: dict[str, Any], fits: bool) -> None:
    assert _constraints(spec).fits("n1", LABELS, ()) is fits, case


TAINT = ("dedicated", "gpu", "NoSchedule")
EVICT = ("maintenance", "", "NoExecute")


@pytest.mark.parametrize(
    ("case", "taints", "tolerations", "fits"),
    [
        ("no taints, no tolerations", (), [], True),
        ("a NoSchedule taint, not tolerated", (TAINT,), [], False),
        ("a NoExecute taint, not tolerated", (EVICT,), [], False),
        (
            "Equal with key, value and effect",
            (TAINT,),
            [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            True,
        ),
        ("Equal is the default operator", (TAINT,), [{"key": "dedicated", "value": "gpu"}], True),
        ("Equal, another value", (TAINT,), [{"key": "dedicated", "value": "cpu"}], False),
        ("Exists on the key", (TAINT,), [{"key": "dedicated", "operator": "Exists"}], True),
        (
            "Exists, another effect",
            (TAINT,),
            [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}],
            False,
        ),
        ("Exists with no key tolerates all", (TAINT, EVICT), [{"operator": "Exists"}], True),
        ("each taint must be tolerated", (TAINT, EVICT), [{"key": "dedicated", "operator": "Exists"}], False),
        (
            "both tolerated",
            (TAINT, EVICT),
            [{"key": "dedicated", "operator": "Exists"}, {"key": "maintenance", "operator": "Exists"}],
            True,
        ),
    ],
)
def test_taints_and_tolerations(
    case: str, taints: tuple[fit.Taint, ...], tolerations: list[dict[str, Any]], fits: bool
) -> None:
    assert _constraints({"tolerations": tolerations}).fits("n1", {}, taints) is fits, case


def _node(
    name: str, labels: dict[str, str], *, taints: list[dict[str, str]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or [], **spec},
        "status": {"allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_prefer_no_schedule_is_only_a_preference() -> None:
    record = node_record(_node("n1", {}, taints=[{"key": "soft", "effect": "PreferNoSchedule"}]))
    assert record.taints == ()
    assert fit.ANYWHERE.fits("n1", {}, record.taints)


def test_the_inventory_shares_label_sets_and_leaves_the_hostname_out() -> None:
    inventory = Inventory()
    for name in ("n1", "n2"):
        inventory.upsert_node(_node(name, {"pool": "web", "kubernetes.io/hostname": name}))
    one, two = inventory.nodes["n1"], inventory.nodes["n2"]
    assert one.labels == (("pool", "web"),) and one.labels is two.labels
    assert fit.label_map("n1", one.labels) == {"pool": "web", "kubernetes.io/hostname": "n1"}


def test_the_inventory_keeps_a_waiting_pods_constraints_shared() -> None:
    inventory = Inventory()
    spec = {
        "preemptionPolicy": "Never",
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "nodeSelector": {"pool": "web"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        **_required(_expr("disk", "In", "ssd")),
    }
    status = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    for name in ("a", "b"):
        inventory.upsert_pod(
            {"metadata": {"name": name, "namespace": "web", "uid": name}, "spec": spec, "status": status}
        )
    first, second = inventory.pending["a"].constraints, inventory.pending["b"].constraints
    assert first is second
    assert first.node_selector == (("pool", "web"),)
    assert first.tolerations == (("dedicated", "Exists", "", ""),)
    assert first.fits("n1", {"pool": "web", "disk": "ssd"}, (TAINT,))
    assert not first.fits("n1", {"pool": "web", "disk": "hdd"}, (TAINT,))


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (_node("n1", {}), None),
        (_node("n1", {}, unschedulable=True), "node n1 is cordoned"),
        (
            _node("n1", {}, taints=[{"key": "maintenance", "effect": "NoExecute"}]),
            "node n1 has taint maintenance:NoExecute",
        ),
        (_node("n1", {}, taints=[{"key": "tolerated", "value": "yes", "effect": "NoSchedule"}]), None),
        (
            {**_node("n1", {}), "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            "node n1 is NotReady",
        ),
    ],
)
def test_unusable_reason_says_why_and_agrees_with_eligible(obj: dict[str, Any], reason: str | None) -> None:
    tolerations = ({"key": "tolerated", "operator": "Exists"},)
    record = node_record(obj)
    assert unusable_reason(record, tolerations) == reason
    assert eligible(record, CapacityPolicy(tolerations=tolerations)) is (reason is None)
