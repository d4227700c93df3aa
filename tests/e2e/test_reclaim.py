"""Giving capacity back, end to end on the lab: the planner's victims, their checkpoint notice
before any deletion, the order of bands, gangs that go whole, notices withdrawn when no longer
needed, and how the front end reports each way a member takes a pod away."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from e2e.fixtures import Lab
from tests.e2e.helpers import eventually
from tests.e2e.reclaim_scene import PODGROUPS, Scene, front_pod, start_scene, stop_scene
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

NOTICE = 8.0
RECLAIM_AT = "vkprovider.io/reclaim-at"


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def _group(scene: Scene, name: str, minimum: int) -> None:
    body = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": minimum}}},
    }
    await scene.offline.create(f"{PODGROUPS}/namespaces/{scene.ns}/podgroups", body)


#: Three jobs of ours in member-1 (its nodes have 96 cores; 86 of them are lent, the rest is
#: the 10 % reserve). An 86-core pod leaves no room for a 12-core one on its node, so the two
#: worker-max pods of "psw" each hold a node alone.
JOBS: dict[str, tuple[int, list[tuple[str, str, int]]]] = {
    "psw": (
        3,
        [
            ("psw-ps", "ps", 12),
            ("psw-min-0", "worker-min", 12),
            ("psw-min-1", "worker-min", 12),
            ("psw-max-0", "worker-max", 86),
            ("psw-max-1", "worker-max", 86),
        ],
    ),
    "gang": (4, [(f"gang-{i}", "worker-min", 12) for i in range(4)]),
    "ring": (
        2,
        [
            ("ring-0", "worker-min", 12),
            ("ring-1", "worker-min", 12),
            ("ring-2", "worker-max", 12),
            ("ring-3", "worker-max", 12),
        ],
    ),
}


async def _run_jobs(scene: Scene) -> None:
    for group, (minimum, members) in JOBS.items():
        await _group(scene, group, minimum)
        for name, role, cpu in members:
            body = front_pod(name, scene.proc.node, cpu=cpu, role=role, group=group)
            await scene.offline.create(f"/api/v1/namespaces/{scene.ns}/pods", body)
    names = {n for _, members in JOBS.values() for n, _, _ in members}
    await eventually(lambda: scene.running(names), timeout=120, what="the three jobs running in member-1")


async def _noticed(scene: Scene, count: int) -> dict[str, dict[str, Any]] | None:
    front = await scene.front()
    noticed = {
        n: p
        for n, p in front.items()
        if (p["metadata"].get("annotations") or {}).get(RECLAIM_AT) and p["status"].get("phase") == "Running"
    }
    return noticed if len(noticed) >= count else None


async def _ended(scene: Scene, names: set[str]) -> dict[str, dict[str, Any]] | None:
    front = await scene.front()
    done = {n: front[n] for n in names if front.get(n, {}).get("status", {}).get("phase") == "Failed"}
    return done if len(done) == len(names) else None


async def _check_reclaimed(scene: Scene, victims: set[str], before: dict[str, dict[str, Any]]) -> None:
    """Each victim: noticed at least NOTICE before its member pod got deletion (the Event's time
    against member-1's audit record), then Failed with Reclaimed and DisruptionTarget, once."""
    ended = await eventually(lambda: _ended(scene, victims), timeout=NOTICE + 60, what=f"{sorted(victims)} ended")
    deletes = scene.member_deletes()
    notices = {e["involvedObject"]["name"]: e for e in await scene.events("ReclaimNotice")}
    for name in victims:
        status = ended[name]["status"]
        assert status["reason"] == "Reclaimed", status
        target = next(c for c in status["conditions"] if c["type"] == "DisruptionTarget")
        assert target["status"] == "True" and target["reason"] == "ReclaimedForOnlineLoad"
        assert "member " in status["message"] and before[name]["spec"]["nodeName"] in status["message"]
        # Event times have whole seconds: the notice was given at most a second after its stamp.
        noticed_at = _seconds(notices[name]["firstTimestamp"]) + 1
        assert deletes[name] - noticed_at >= NOTICE, (name, deletes[name] - noticed_at)
    reclaimed = [e for e in await scene.events("Reclaimed") if e["involvedObject"]["name"] in victims]
    assert sorted(e["involvedObject"]["name"] for e in reclaimed) == sorted(victims), "one Warning Event each"


async def test_reclaim_by_band_whole_machines_first_with_notice_and_gangs_whole(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    scene = await start_scene(lab, offline, tmp_path, notice=NOTICE)
    try:
        await _run_jobs(scene)
        placed = await scene.placed()
        nodes_before = {p["spec"]["nodeName"] for p in placed.values()}
        held = sum(int(p["spec"]["containers"][0]["resources"]["requests"]["cpu"]) for p in placed.values())

        # 1. The member's cap falls by two machines' worth (2 x 86 cores).
        deficit = 2 * 86
        await scene.spec({"capacity": {"cap": {"cpu": str(held - deficit)}}})
        noticed = await eventually(lambda: _noticed(scene, 2), timeout=30, what="two notices")
        await asyncio.sleep(2)  # no further notice follows
        noticed = await _noticed(scene, 2) or {}
        worker_max_per_node: dict[str, int] = {}
        for pod in placed.values():
            if pod["metadata"]["labels"].get("vkprovider.io/role") == "worker-max":
                node = pod["spec"]["nodeName"]
                cpu = int(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"])
                worker_max_per_node[node] = worker_max_per_node.get(node, 0) + cpu
        fewest, covered = 0, 0
        for cpu in sorted(worker_max_per_node.values(), reverse=True):
            if covered >= deficit:
                break
            fewest, covered = fewest + 1, covered + cpu
        assert set(noticed) == {"psw-max-0", "psw-max-1"}, f"only worker-max, fewest nodes: {sorted(noticed)}"
        assert len({placed[n]["spec"]["nodeName"] for n in noticed}) == fewest == 2
        await _check_reclaimed(scene, set(noticed), placed)
        after = await scene.placed()
        emptied = nodes_before - {p["spec"]["nodeName"] for p in after.values()}
        assert len(emptied) >= 2, f"two nodes without pods of ours: {emptied}"

        # The job is told: an Event on its PodGroup and the last reclaim on its remaining pods.
        async def told() -> list[dict[str, Any]]:
            return [e for e in await scene.events("PodsReclaimed") if e["involvedObject"]["kind"] == "PodGroup"]

        event = (await eventually(told, timeout=20, what="PodsReclaimed on the job's PodGroup"))[0]
        assert event["involvedObject"]["name"] == "psw" and "psw-max-0" in event["message"]

        async def annotated() -> bool:
            front = await scene.front()
            return all(
                "vkprovider.io/last-reclaim" in front[n]["metadata"].get("annotations", {})
                for n in ("psw-ps", "psw-min-0", "psw-min-1")
            )

        await eventually(annotated, timeout=20, what="last-reclaim on the job's remaining pods")

        # 2. Lower again by 36 cores: ring's elastic pods first, then its minimum, whole; never
        # the bigger gang, never a PS.
        await scene.spec({"capacity": {"cap": {"cpu": str(held - deficit - 36)}}})
        noticed = await eventually(lambda: _noticed(scene, 4), timeout=30, what="ring noticed")
        assert set(noticed) == {"ring-0", "ring-1", "ring-2", "ring-3"}
        await _check_reclaimed(scene, set(noticed), placed)

        # 3. Lower again by 48: the worker-min gang goes whole before the PS job.
        await scene.spec({"capacity": {"cap": {"cpu": str(held - deficit - 48 - 48)}}})
        noticed = await eventually(lambda: _noticed(scene, 4), timeout=30, what="gang noticed")
        assert set(noticed) == {"gang-0", "gang-1", "gang-2", "gang-3"}
        await _check_reclaimed(scene, set(noticed), placed)

        # 4. A longer notice, then capacity restored before its deadline: withdrawn, no pod lost.
        await scene.spec({"reclaim": {"noticeSeconds": 25}, "capacity": {"cap": {"cpu": "12"}}})
        noticed = await eventually(lambda: _noticed(scene, 3), timeout=30, what="the PS job noticed")
        assert set(noticed) == {"psw-ps", "psw-min-0", "psw-min-1"}
        await scene.spec({"capacity": {"cap": None}})

        async def withdrawn() -> bool:
            return await _noticed(scene, 1) is None and len(await scene.events("ReclaimCancelled")) >= 3

        await eventually(withdrawn, timeout=20, what="the notices withdrawn")
        deadline = max(_seconds(p["metadata"]["annotations"][RECLAIM_AT]) for p in noticed.values())
        await asyncio.sleep(max(0.0, deadline - datetime.datetime.now(datetime.UTC).timestamp()) + 3)
        assert await scene.running({"psw-ps", "psw-min-0", "psw-min-1"})
        assert not {"psw-ps", "psw-min-0", "psw-min-1"} & set(scene.member_deletes())
        member_pods = await scene.placed()
        assert not [n for n, p in member_pods.items() if RECLAIM_AT in (p["metadata"].get("annotations") or {})]
        # Nothing taken was ever re-created in the member.
        assert set(member_pods) == {"psw-ps", "psw-min-0", "psw-min-1"}
    finally:
        await stop_scene(scene)
