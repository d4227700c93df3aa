"""One watch of a member's pods serving capacity and dispatch (federation.watch.SharedPods):
live pods reach the inventory, ours (finished ones too) the dispatcher's feed."""

from __future__ import annotations

from typing import Any

from federation.inventory import Inventory
from federation.watch import SharedPods


class Feed:
    """Records what the dispatcher's side is told (a stand-in for MemberPods; pure routing)."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def ours(self, pod: dict[str, Any]) -> bool:
        return (pod["metadata"].get("labels") or {}).get("vkprovider.io/instance") == "vk"

    def listed(self, items: list[dict[str, Any]]) -> None:
        self.lists.append([p["metadata"]["name"] for p in items])

    def event(self, kind: str, pod: dict[str, Any]) -> None:
        self.events.append((kind, pod["metadata"]["name"]))

    def failed(self, error: Exception) -> None:
        raise AssertionError(error)


def _pod(name: str, *, ours: bool, phase: str = "Running") -> dict[str, Any]:
    labels = {"vkprovider.io/managed": "true", "vkprovider.io/instance": "vk"} if ours else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": phase},
    }


def test_live_pods_go_to_the_inventory_and_ours_to_the_feed_finished_ones_too() -> None:
    inventory, feed = Inventory(network_pod_label="np"), Feed()
    shared = SharedPods(inventory, feed)
    shared.replace([_pod("online", ours=False), _pod("a", ours=True), _pod("done", ours=True, phase="Succeeded")])
    assert set(inventory.pods) == {"online", "a"}
    assert feed.lists == [["a", "done"]]

    shared.upsert(_pod("a", ours=True, phase="Succeeded"))  # finished: out of the inventory, told
    shared.upsert(_pod("job", ours=False, phase="Failed"))  # someone else's, finished: neither
    shared.delete(_pod("online", ours=False))
    assert set(inventory.pods) == set()
    assert feed.events == [("MODIFIED", "a")]

    shared.delete(_pod("done", ours=True, phase="Succeeded"))
    assert feed.events[-1] == ("DELETED", "done")
