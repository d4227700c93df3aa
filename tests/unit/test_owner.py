"""Whose pods are ours in a member shared by several front ends (issue 33, item 6): two offline
clusters may both name their node vk-pool; a provider counts as ours only the pods of its own
instance of its own front end, and everyone else's as online load, in its own watch and in what
the capacity agent tells it."""

from __future__ import annotations

from typing import Any

from federation import labels
from federation.agent.convert import node_message
from federation.capacity.inventory import Inventory

A = labels.Owner("vk-pool", "front-a")
B = labels.Owner("vk-pool", "front-b")


def _node() -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "32", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _pod(name: str, cpu: str, owner: labels.Owner | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": owner.labels() if owner else {}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }


PODS = [_pod("online", "4", None), _pod("a", "2", A), _pod("b", "3", B)]


def test_owner_labels_selector_and_key() -> None:
    assert A.labels() == {labels.MANAGED: "true", labels.INSTANCE: "vk-pool", labels.FRONT_END: "front-a"}
    assert A.selector({labels.REFLECTED: "true"}) == (
        "vkprovider.io/managed=true,vkprovider.io/instance=vk-pool,vkprovider.io/front-end=front-a,"
        "vkprovider.io/reflected=true"
    )
    assert A.owns(A.labels()) and not A.owns(B.labels()) and not B.owns(A.labels())
    assert labels.owner_key(A.labels()) == A.key != B.key
    assert labels.owner_key({"team": "x"}) is None
    unidentified = labels.Owner("vk-pool")
    assert labels.FRONT_END not in unidentified.labels()
    unidentified.identify("front-a")
    assert unidentified.owns(A.labels())


def test_a_providers_own_watch_counts_another_front_ends_pods_as_online_load() -> None:
    inventory = Inventory(owner=A.key)
    inventory.upsert_node(_node())
    for pod in PODS:
        inventory.upsert_pod(pod)
    assert inventory.ours_used["n1"] == {"cpu": 2000, "pods": 1}
    assert inventory.online_used["n1"] == {"cpu": 7000, "pods": 2}  # online 4 + B's 3


def test_one_provider_alone_counts_every_providers_pods_as_its_own() -> None:
    inventory = Inventory()
    inventory.upsert_node(_node())
    for pod in PODS:
        inventory.upsert_pod(pod)
    assert inventory.ours_used["n1"] == {"cpu": 5000, "pods": 2}
    assert inventory.online_used["n1"] == {"cpu": 4000, "pods": 1}


def _cpu(resources: Any) -> dict[str, int]:
    return {r.name: r.value for r in resources if r.name == "cpu"}


def test_the_agent_tells_each_provider_its_own_share() -> None:
    inventory = Inventory(track_owners=True)
    inventory.upsert_node(_node())
    for pod in PODS:
        inventory.upsert_pod(pod)
    for owner, ours, online in ((A, 2000, 7000), (B, 3000, 6000)):
        message = node_message(inventory, "n1", owner.key)
        assert _cpu(message.ours_used) == {"cpu": ours}, owner
        assert _cpu(message.online_used) == {"cpu": online}, owner
    everyone = node_message(inventory, "n1")
    assert _cpu(everyone.ours_used) == {"cpu": 5000}
    # A provider with no pods there sees everything as online load.
    stranger = node_message(inventory, "n1", labels.Owner("vk-pool", "front-c").key)
    assert not stranger.ours_used and _cpu(stranger.online_used) == {"cpu": 9000}
    # A's pod goes: A's share is gone, B's stays.
    inventory.delete_pod(PODS[1])
    assert _cpu(node_message(inventory, "n1", A.key).ours_used) == {}
    assert _cpu(node_message(inventory, "n1", B.key).ours_used) == {"cpu": 3000}
