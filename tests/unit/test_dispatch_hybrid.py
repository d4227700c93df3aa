"""The dispatcher's gang accounting with pods on native and virtual nodes, across a restart.

The apiservers here are dicts (`FakeApi`): this tests the dispatcher's decisions (what leaves as
a gang, with which member-side minimum, what is created again after a restart), not the API.
The same paths run against real apiservers in tests/e2e/test_hybrid.py.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from federation import labels
from federation.capacity.summary import MemberCapacity, NodeFree
from federation.config import MemberConfig
from federation.dispatch import forge
from federation.dispatch.dispatcher import Dispatcher
from federation.jobs import JobRef
from federation.members.pods import MemberPods
from federation.tenancy.namespaces import MemberNamespaces
from tests.unit.fakeapi import FakeApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

NS = "team"
VIRTUAL = "vk-1"
GROUPS = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NS}/podgroups"


def front_pod(name: str, *, node: str = VIRTUAL, role: str = "worker-min") -> Any:
    return {
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}", "labels": {"vkprovider.io/role": role}},
        "spec": {
            "nodeName": node,
            "schedulingGroup": {"podGroupName": "ring"},
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


class World:
    """The front end and one member, outliving dispatchers (a restart keeps the APIs)."""

    def __init__(self, minimum: int, natives: int) -> None:
        self.front = FakeApi()
        self.member = FakeApi()
        group = {
            "metadata": {"name": "ring", "namespace": NS},
            "spec": {"schedulingPolicy": {"gang": {"minCount": minimum}}},
        }
        self.front.objects[f"{GROUPS}/ring"] = group
        natives_list = [front_pod(f"n{i}", node=f"offline-node-{i:03d}") for i in range(natives)]
        self.front.pod_lists[f"/api/v1/namespaces/{NS}/pods"] = natives_list

    def dispatcher(self) -> Dispatcher:
        """A freshly started provider: its member index rebuilt from the member's pods."""
        pods = MemberPods("m1", None, owner=labels.Owner(VIRTUAL), on_change=lambda key, phase: None)  # type: ignore[arg-type]
        pods.client = self.member  # type: ignore[assignment]
        for key, obj in self.member.objects.items():
            if "/pods/" in key:
                pods.record(copy.deepcopy(obj))
        pods.synced.set()
        member = SimpleNamespace(config=MemberConfig(name="m1"), pods=pods)
        node = NodeFree("m1-n0", {"cpu": 96_000, "memory": 2**40, "pods": 110}, None, None, None)
        capacity = MemberCapacity(name="m1", nodes=[node])
        dispatcher = Dispatcher(
            owner=labels.Owner(VIRTUAL),
            namespaces=MemberNamespaces(),
            members=lambda: {"m1": member},
            capacities=lambda: {"m1": capacity},
            notify=lambda key: None,
            virtual_nodes=lambda: [VIRTUAL],
        )
        dispatcher.front = self.front  # type: ignore[assignment]
        return dispatcher

    def member_pods(self) -> dict[str, dict[str, Any]]:
        return {k.rsplit("/", 1)[1]: v for k, v in self.member.objects.items() if "/pods/" in k}

    def member_gangs(self) -> list[dict[str, Any]]:
        return [v for k, v in self.member.objects.items() if "/podgroups/" in k]


async def _stop(dispatcher: Dispatcher) -> None:
    for job in dispatcher.jobs.values():
        if job.timer is not None:
            job.timer.cancel()


async def test_a_native_floor_makes_every_virtual_pod_elastic_with_no_gang_in_the_member() -> None:
    world = World(minimum=3, natives=3)
    dispatcher = world.dispatcher()
    for name in ("e0", "e1"):
        await dispatcher.create(front_pod(name, role="worker-max"))
    await _stop(dispatcher)
    pods = world.member_pods()
    assert sorted(pods) == ["e0", "e1"]
    assert world.member_gangs() == []
    for pod in pods.values():
        assert "schedulingGroup" not in pod["spec"]
        assert pod["metadata"]["annotations"][labels.GANG_MIN] == "0"
    assert world.front.objects[f"{GROUPS}/ring"]["metadata"]["annotations"][labels.MEMBER] == "m1"


async def test_a_split_gang_sends_its_virtual_part_as_a_gang_of_that_size_and_survives_a_restart() -> None:
    world = World(minimum=4, natives=2)
    first = world.dispatcher()
    await first.create(front_pod("v0"))
    assert world.member_pods() == {}  # 2 native + 1 virtual of 4: waits
    waiting = first.reports.status(f"{NS}/v0")[1]
    assert waiting is not None
    assert waiting.get("message", "").startswith("3 of 4 pods of the gang are bound (2 on native nodes)")
    await first.create(front_pod("v1"))
    await _stop(first)
    gangs = world.member_gangs()
    assert len(gangs) == 1 and gangs[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2
    pods = world.member_pods()
    assert sorted(pods) == ["v0", "v1"]
    assert all(
        p["spec"]["schedulingGroup"]["podGroupName"] == forge.gang_name(JobRef(NS, "native", "ring"))
        for p in pods.values()
    )
    assert all(p["metadata"]["annotations"][labels.GANG_MIN] == "2" for p in pods.values())
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}

    # Restart: a new dispatcher over the same APIs. The runtime asks it to create only the pod
    # it does not have (v2, a new worker); v0 and v1 are found in the member.
    second = world.dispatcher()
    world.member.creates.clear()
    await second.create(front_pod("v2", role="worker-max"))
    await second.create(front_pod("v0"))  # asked again: found, not created again
    await _stop(second)
    pods = world.member_pods()
    assert sorted(pods) == ["v0", "v1", "v2"]
    assert {n: pods[n]["metadata"]["uid"] for n in ("v0", "v1")} == uids
    pod_creates = [c for c in world.member.creates if "/pods/" in c]
    assert pod_creates == [f"/api/v1/namespaces/{NS}/pods/v2"], pod_creates
    assert pods["v2"]["metadata"]["annotations"][labels.GANG_MIN] == "2"  # the member-side minimum, still
    gangs = world.member_gangs()
    assert len(gangs) == 1 and gangs[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2  # unchanged


async def test_virtual_pods_alone_still_leave_as_the_whole_gang() -> None:
    world = World(minimum=3, natives=0)
    dispatcher = world.dispatcher()
    for name in ("a", "b", "c", "d"):
        await dispatcher.create(front_pod(name))
    await _stop(dispatcher)
    gangs = world.member_gangs()
    assert len(gangs) == 1 and gangs[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3
    pods = world.member_pods()
    in_gang = sorted(n for n, p in pods.items() if "schedulingGroup" in p["spec"])
    assert in_gang == ["a", "b", "c"] and sorted(pods) == ["a", "b", "c", "d"]


async def test_a_plain_pod_is_created_once() -> None:
    world = World(minimum=1, natives=0)
    dispatcher = world.dispatcher()
    await dispatcher.create(front_pod("solo"))
    await _stop(dispatcher)
    assert [c for c in world.member.creates if "/pods/" in c] == [f"/api/v1/namespaces/{NS}/pods/solo"]
