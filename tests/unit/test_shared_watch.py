"""One watch of a member's pods serving capacity and dispatch (federation.members.watch.SharedPods):
live pods reach the inventory, ours (finished ones too) the dispatcher's feed."""

from __future__ import annotations

from typing import Any

from federation.capacity.inventory import Inventory
from federation.members.watch import SharedPods
from vkprovider.kube.relist import Relist


class Feed:
    """Records what the dispatcher's side is told (a stand-in for MemberPods; pure routing)."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def ours(self, pod: dict[str, Any]) -> bool:
        return (pod["metadata"].get("labels") or {}).get("vkprovider.io/instance") == "vk"

    def relist(self) -> Relist:
        names: list[str] = []

        def put(pod: dict[str, Any]) -> str:
            names.append(pod["metadata"]["name"])
            return str(pod["metadata"]["name"])

        return Relist(put, lambda seen: self.lists.append(names))

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
    relist = shared.relist()
    relist.page([_pod("online", ours=False), _pod("a", ours=True)])  # a list in two pages
    relist.page([_pod("done", ours=True, phase="Succeeded")])
    relist.done()
    assert set(inventory.pods) == {"online", "a"}
    assert feed.lists == [["a", "done"]]

    shared.upsert(_pod("a", ours=True, phase="Succeeded"))  # finished: out of the inventory, told
    shared.upsert(_pod("job", ours=False, phase="Failed"))  # someone else's, finished: neither
    shared.delete(_pod("online", ours=False))
    assert set(inventory.pods) == set()
    assert feed.events == [("MODIFIED", "a")]

    shared.delete(_pod("done", ours=True, phase="Succeeded"))
    assert feed.events[-1] == ("DELETED", "done")


def test_a_paged_relist_counts_what_it_lists_and_counts_out_what_it_no_longer_holds() -> None:
    inventory = Inventory(network_pod_label="np")
    inventory.replace_pods([_pod("stays", ours=False), _pod("gone", ours=False), _pod("ours", ours=True)])
    relist = inventory.relist_pods()
    relist.page([_pod("stays", ours=False)])
    # until the list ends, what the earlier pages did not name is still counted (the old state)
    assert set(inventory.pods) == {"stays", "gone", "ours"}
    relist.page([_pod("ours", ours=True), _pod("new", ours=False)])
    relist.done()
    assert set(inventory.pods) == {"stays", "ours", "new"}
    fresh = Inventory(network_pod_label="np")
    fresh.replace_pods([_pod("stays", ours=False), _pod("ours", ours=True), _pod("new", ours=False)])
    assert (inventory.online_used, inventory.ours_used) == (fresh.online_used, fresh.ours_used)
