"""Reclaim judges member nodes as the member does (issue 34), end to end on the lab: our pods on
a node cordoned in member-1 get notice, and only they; an online pod waiting in member-1 gets
room only on nodes its node affinity and tolerations let it use, and a pod selecting a label no
node has gets none at all. "Never" is watched over a window (member-1 and the front end), not
judged in one look."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from e2e.fixtures import Lab
from tests.e2e.helpers import changes_during, delete_namespace, eventually, make_namespace, pods, settle, together
from tests.e2e.reclaim_scene import MEMBER, Scene, front_pod, start_scene, stop_scene
from vkprovider.kube import AlreadyExists, KubeClient

# Each fills member-1 (online load, notices), and nothing else: the other worker runs beside
# them whatever keeps away from member-1 (e2e.fixtures).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(alone=["member-1"], shares=["offline"]),
]

RECLAIM_AT = "vkprovider.io/reclaim-at"
PATIENT_CLASS = "online-patient"  # e2e.online's class: preemptionPolicy Never


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


async def _run_ours(scene: Scene, count: int, cpu: int) -> dict[str, dict[str, Any]]:
    """`count` plain pods of ours, running in member-1; the member pods by name."""
    names = {f"w-{i}" for i in range(count)}
    for name in sorted(names):
        body = front_pod(name, scene.proc.node, cpu=cpu, role="worker-max")
        await scene.offline.create(f"/api/v1/namespaces/{scene.ns}/pods", body)
    await eventually(lambda: scene.running(names), timeout=120, what=f"{count} pods of ours running in member-1")
    return await scene.placed()


def _noticed(pod: dict[str, Any]) -> bool:
    return RECLAIM_AT in (pod["metadata"].get("annotations") or {})


async def _noticed_names(scene: Scene) -> tuple[set[str], set[str]]:
    """(member pods, front-end pods) carrying a notice."""
    member = {n for n, p in (await scene.placed()).items() if _noticed(p)}
    front = {n for n, p in (await scene.front()).items() if _noticed(p)}
    return member, front


async def _watch(
    scene: Scene, allowed: set[str], until: Callable[[], Awaitable[bool]], *, timeout: float, what: str
) -> None:
    """Poll until `until` holds, failing at once if a pod outside `allowed` gets a notice."""

    async def probe() -> bool:
        member, front = await _noticed_names(scene)
        assert (member | front) <= allowed, f"notice given beyond {sorted(allowed)}: {sorted(member | front)}"
        return await until()

    await eventually(probe, timeout=timeout, what=what)


async def _hold(scene: Scene, allowed: set[str], seconds: float) -> None:
    """No notice beyond `allowed` now or at any moment of the next `seconds` (the reclaimer plans
    twice a second), in member-1 or at the front end: both watched, so a notice given and
    withdrawn in between counts too."""
    path = f"/api/v1/namespaces/{scene.ns}/pods"
    async with scene.lab.client(MEMBER) as member:
        clients = {"member-1": member, "the front end": scene.offline}
        listed = {where: await client.list(path) for where, client in clients.items()}
        watches = {
            where: asyncio.create_task(
                changes_during(client, path, since=listed[where]["metadata"]["resourceVersion"], window=seconds),
                name=f"fit-hold/{where}",
            )
            for where, client in clients.items()
        }
        await settle(*watches.values())
    seen: set[str] = set()
    for where in clients:
        seen |= {p["metadata"]["name"] for p in listed[where]["items"] if _noticed(p)}
        seen |= {e["object"]["metadata"]["name"] for e in watches[where].result() if _noticed(e["object"])}
    assert seen <= allowed, f"notice given beyond {sorted(allowed)} within {seconds:g} s: {sorted(seen)}"


async def test_a_member_node_cordoned_gives_notice_to_our_pods_on_it_and_only_to_them(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    # A long notice: the pods stay, noticed, while we look (the deadline is not what is tested).
    scene = await start_scene(lab, offline, tmp_path, notice=60)
    cordoned = ""
    try:
        # 40-core pods: at most two on a node (85.5 cores lent per node), so at least three nodes.
        placed = await _run_ours(scene, 6, 40)
        by_node: dict[str, set[str]] = {}
        for name, pod in placed.items():
            by_node.setdefault(pod["spec"]["nodeName"], set()).add(name)
        assert len(by_node) >= 2, by_node
        cordoned = max(sorted(by_node), key=lambda n: len(by_node[n]))
        on_it = by_node[cordoned]
        # Nothing asked of us before: member-1 has room to spare, no notice anywhere.
        await _hold(scene, set(), 2)

        async with lab.client(MEMBER) as client:
            await client.patch(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": True}})

        async def all_noticed() -> bool:
            member, front = await _noticed_names(scene)
            return member >= on_it and front >= on_it

        await _watch(scene, on_it, all_noticed, timeout=30, what=f"notice on {sorted(on_it)}, member and front end")
        # And no one else, over some ten rounds.
        await _hold(scene, on_it, 5)
        notices = [e for e in await scene.events("ReclaimNotice") if e["involvedObject"]["name"] in on_it]
        assert notices and all("cordoned" in e["message"] for e in notices), [e["message"] for e in notices]
    finally:
        if cordoned:
            async with lab.client(MEMBER) as client:
                await client.patch(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": None}})
        await stop_scene(scene)


TAINT = {"key": "vkp-fit-dedicated", "value": "web", "effect": "NoSchedule"}
OTHER = {"key": "vkp-fit-other", "value": "x", "effect": "NoSchedule"}
DISK = "vkp-fit-disk"


def _waiting_pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "vkp-fit"}},
        "spec": {
            "priorityClassName": PATIENT_CLASS,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "web", "image": "registry.example/online/web:1", "resources": {"requests": {"cpu": "60"}}}
            ],
            **spec,
        },
    }


async def _unschedulable(client: KubeClient, ns: str, name: str) -> bool:
    pod = await client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or []
    )


async def test_an_online_pod_waiting_with_a_toleration_and_required_affinity_gets_room_only_where_it_fits(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    # Our pods tolerate both taints (the member lends tainted nodes): they are not drained.
    tolerations = [{"key": TAINT["key"], "operator": "Exists"}, {"key": OTHER["key"], "operator": "Exists"}]
    scene = await start_scene(lab, offline, tmp_path, notice=3, capacity={"tolerations": tolerations})
    ns = f"fit-{uuid.uuid4().hex[:6]}"
    nodes: dict[str, dict[str, Any]] = {}
    try:
        # 80-core pods: one per node, and a 60-core online pod fits beside none of them.
        placed = await _run_ours(scene, 4, 80)
        hosts = sorted({p["spec"]["nodeName"] for p in placed.values()})
        assert len(hosts) == 4, hosts
        usable, untolerated, tainted_only, _plain = hosts
        # usable: the disk label and the tolerated taint; untolerated: the label and a taint the
        # online pod does not tolerate; tainted_only: the tolerated taint, no label.
        nodes = {
            usable: {"metadata": {"labels": {DISK: "ssd"}}, "spec": {"taints": [TAINT]}},
            untolerated: {"metadata": {"labels": {DISK: "ssd"}}, "spec": {"taints": [OTHER]}},
            tainted_only: {"spec": {"taints": [TAINT]}},
        }
        async with lab.client(MEMBER) as client:
            for node, patch in nodes.items():
                await client.patch(f"/api/v1/nodes/{node}", patch)
            await make_namespace(client, ns)
            with contextlib.suppress(AlreadyExists):
                await client.create(
                    "/apis/scheduling.k8s.io/v1/priorityclasses",
                    {
                        "apiVersion": "scheduling.k8s.io/v1",
                        "kind": "PriorityClass",
                        "metadata": {"name": PATIENT_CLASS},
                        "value": 1000000,
                        "preemptionPolicy": "Never",
                    },
                )
            # 1. A pod selecting a label no node has: waits, and gets no victim, ever.
            await client.create(
                f"/api/v1/namespaces/{ns}/pods", _waiting_pod("nowhere", {"nodeSelector": {"pool": "web"}})
            )
            await eventually(lambda: _unschedulable(client, ns, "nowhere"), timeout=30, what="nowhere unschedulable")
            # (And on through step 2: no notice but its victim's.)
            await _hold(scene, set(), 3)

            # 2. A pod that tolerates the taint and requires the label: room on `usable` only.
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": DISK, "operator": "In", "values": ["ssd"]}]}
                        ]
                    }
                }
            }
            spec = {"affinity": affinity, "tolerations": [{"key": TAINT["key"], "operator": "Equal", "value": "web"}]}
            await client.create(f"/api/v1/namespaces/{ns}/pods", _waiting_pod("picky", spec))
            victim = next(n for n, p in placed.items() if p["spec"]["nodeName"] == usable)

            async def picky_running() -> bool:
                pod = await client.get(f"/api/v1/namespaces/{ns}/pods/picky")
                return bool(pod["status"].get("phase") == "Running")

            # Our pod on `usable` is noticed and goes; no other pod of ours is ever noticed.
            await _watch(scene, {victim}, picky_running, timeout=90, what="picky running after its room was made")
            pod = await client.get(f"/api/v1/namespaces/{ns}/pods/picky")
            assert pod["spec"]["nodeName"] == usable
            assert victim in scene.member_deletes()
            assert await _unschedulable(client, ns, "nowhere"), "the pod that fits nowhere still waits"
            left = await scene.placed()
            assert set(left) == set(placed) - {victim}, sorted(left)
    finally:
        async with lab.client(MEMBER) as client:
            for node in nodes:
                undo: dict[str, Any] = {"spec": {"taints": None}, "metadata": {"labels": {DISK: None}}}
                await client.patch(f"/api/v1/nodes/{node}", undo)

            async def clear_online() -> None:
                await delete_namespace(client, ns)

                async def gone() -> bool:
                    return not await pods(client, ns)

                await eventually(gone, timeout=60, what=f"member-1 clear of {ns}")

            # The online pods' namespace and the scene go side by side.
            await together((f"clear {ns}", clear_online()), ("stop the scene", stop_scene(scene)))
