"""A drain survives kill -9 of the provider (issue 43): member-1, declared as a MemberCluster, is
disabled (or its MemberCluster deleted) while pods of ours run there, and the provider is killed
at a random moment of the drain and started again. The restarted provider finds the member
disabled (or the object still there, held by our finalizer, with its deletionTimestamp), drains
it again from what member-1 holds, and keeps the notices' deadlines: every pod ends Failed,
Reclaimed with DisruptionTarget, member-1 deleted each once and none before its deadline (its
audit log), nothing of ours is left there, and the member ends disabled (or the object goes,
only once drained).

The two cases run side by side in one test, each with its own scene (its own provider and
MemberCluster over member-1), each to its end whatever the other does; a failure names its case."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import time
from pathlib import Path
from typing import Any

import pytest

from e2e import audit
from e2e.fixtures import Lab
from tests.e2e.helpers import KILL_TRIALS, MEMBERS, eventually, settle
from tests.e2e.memberwatch import PODS, MemberWatch
from tests.e2e.reclaim_scene import MEMBER, Scene, front_pod, start_scene, stop_scene
from tests.e2e.test_federation_capacity import SCENE_LABEL
from vkprovider.kube import KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

NOTICE = 3.0
#: Random kill moments per case: 3 (a trial takes about 8 s); the restart harness
#: (test_restart_harness) adds 5 more of a disabled member's drain beside an outage and a gang.
TRIALS = 3 if KILL_TRIALS <= 5 else KILL_TRIALS
RECLAIM_AT = "vkprovider.io/reclaim-at"
FINALIZER = "vkprovider.io/drain"


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.shares_lab
async def test_a_disabled_member_and_a_deleted_one_are_drained_once_across_a_kill_9(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """A disabled member is drained once and left disabled; a deleted one is drained once, then goes."""
    cases = [
        asyncio.create_task(_case(lab, offline, tmp_path, delete=False, seed=43), name="drain-restart/disabled"),
        asyncio.create_task(_case(lab, offline, tmp_path, delete=True, seed=44), name="drain-restart/deleted"),
    ]
    await settle(*cases)


async def _case(lab: Lab, offline: KubeClient, tmp_path: Path, *, delete: bool, seed: int) -> None:
    case = "deleted" if delete else "disabled"
    try:
        await _trials(lab, offline, tmp_path / case, delete=delete, seed=seed)
    except BaseException as exc:
        exc.add_note(f"in the case of a {case} member")
        raise


async def _trials(lab: Lab, offline: KubeClient, workdir: Path, *, delete: bool, seed: int) -> None:
    workdir.mkdir()
    scene = await start_scene(lab, offline, workdir, notice=NOTICE)
    rng = random.Random(seed)
    watch = MemberWatch(lab=lab, members=[MEMBER], selector="vkprovider.io/managed=true", paths=(PODS,))
    await watch.start()
    try:
        obj = await offline.get(scene.path)
        assert FINALIZER in obj["metadata"].get("finalizers", []), obj["metadata"]  # held while in use
        for trial in range(TRIALS):
            await _trial(
                scene, watch, trial, kill_after=rng.uniform(0.0, NOTICE + 2.0), delete=delete, spec=obj["spec"]
            )
    finally:
        await watch.stop()
        await stop_scene(scene)


async def _trial(
    scene: Scene, watch: MemberWatch, trial: int, *, kill_after: float, delete: bool, spec: dict[str, Any]
) -> None:
    what = f"trial {trial} ({'deleted' if delete else 'disabled'}, kill after {kill_after:.1f}s)"
    began = time.time()
    names = {f"t{trial}-{i}" for i in range(3)}
    for name in sorted(names):
        await scene.offline.create(
            f"/api/v1/namespaces/{scene.ns}/pods", front_pod(name, scene.proc.node, cpu=4, role="worker-min")
        )
    await eventually(lambda: scene.running(names), timeout=60, what=f"{what}: pods running")

    async def held() -> bool:
        # A re-created object is held once the provider takes it up; deleted before that, it
        # would go at once, and the test would not be about a drain.
        return FINALIZER in (await scene.offline.get(scene.path))["metadata"].get("finalizers", [])

    await eventually(held, timeout=30, what=f"{what}: the MemberCluster held by our finalizer")
    samples: list[tuple[bool, int]] = []  # (the MemberCluster still there, our pods in member-1)
    sampler = asyncio.create_task(_sample(scene, names, samples), name=f"drain-restart/sampler-{trial}")
    try:
        asked = time.time()
        if delete:
            await scene.offline.delete(scene.path)
        else:
            await scene.spec({"enabled": False})
        await asyncio.sleep(kill_after)
        scene.proc.kill()
        killed = time.time() - asked  # beyond kill_after when this loop was late
        scene.proc.start()
        await scene.proc.wait_ready(timeout=60)

        async def ended() -> dict[str, dict[str, Any]] | None:
            front = await scene.front()
            done = {n: front[n] for n in names if front.get(n, {}).get("status", {}).get("phase") == "Failed"}
            return done if len(done) == len(names) else None

        pods = await eventually(ended, timeout=NOTICE + 60, what=f"{what}: every pod ended")

        async def member_clear() -> bool:
            async with scene.lab.client(MEMBER) as client:
                listed = await client.list(f"/api/v1/namespaces/{scene.ns}/pods")
            return not {p["metadata"]["name"] for p in listed["items"]} & names

        try:
            await eventually(member_clear, timeout=30, what=f"{what}: nothing of ours left in member-1")
        except AssertionError as exc:
            early = [left for there, left in samples if not there and left]
            if delete and early:
                # Issue 43: another provider following this MemberCluster let go of the finalizer.
                raise AssertionError(
                    f"{what}: the MemberCluster went while {early[0]} pod(s) of ours were in member-1, so the "
                    "restarted provider could not drain it; who else follows it and let go of its finalizer?"
                ) from exc
            raise
        if delete:

            async def object_gone() -> bool:
                try:
                    await scene.offline.get(scene.path)
                except NotFound:
                    return True
                return False

            await eventually(object_gone, timeout=30, what=f"{what}: the MemberCluster gone once drained")

            async def forgotten() -> bool:
                return scene.member not in (await scene.proc.view())["members"]

            await eventually(forgotten, timeout=30, what=f"{what}: the member forgotten")
        else:

            async def settled() -> bool:
                member = (await scene.proc.view())["members"].get(scene.member, {})
                return member.get("enabled") is False and not member.get("draining")

            await eventually(settled, timeout=30, what=f"{what}: the member drained, left disabled")
        # The sampler's last look, taken after the end (nothing of ours left, the member settled).
        looks = len(samples)

        async def looked_again() -> bool:
            if sampler.done():
                sampler.result()  # its failure
            return len(samples) > looks

        await eventually(looked_again, timeout=30, what=f"{what}: the sampler's look after the end")
        # member-1's audit log written: a delete of each pod recorded (how many, judged below).
        await eventually(
            lambda: _recorded(scene, names, began),
            timeout=10,
            interval=0.5,
            what=f"{what}: a delete of each pod in member-1's audit log",
        )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    ended_at = time.time()

    for name, pod in pods.items():
        status = pod["status"]
        target = [c for c in status.get("conditions") or [] if c["type"] == "DisruptionTarget"]
        assert status.get("reason") == "Reclaimed", (what, name, status)
        assert target and target[0]["status"] == "True", (what, name, status)
    watch.check()
    deadlines: dict[str, float] = {}
    for s in watch.history:  # the watch sees every managed pod in member-1: the other case's t0-0 too
        stamp = s.annotations.get(RECLAIM_AT)
        if s.namespace == scene.ns and s.name in names and stamp:
            deadlines.setdefault(s.name, _seconds(stamp))
            assert _seconds(stamp) == deadlines[s.name], f"{what}: {s.name}'s notice changed across the restart"
    deletes = _deletes(scene, names, began, ended_at)
    assert set(deletes) == names, f"{what}: member-1 was asked to delete {sorted(deletes)}"
    for name, times in deletes.items():
        assert len(times) == 1, f"{what}: {name} deleted {len(times)} times"
        assert name in deadlines and times[0] >= deadlines[name], f"{what}: {name} deleted before its notice ran out"
    if delete:
        # Held by our finalizer while our pods were there, gone only after the last one.
        assert any(there and left for there, left in samples), f"{what}: never seen held while draining"
        early = [left for there, left in samples if not there and left]
        assert not early, (
            f"{what}: the object went before the drain (killed {killed:.1f}s after the change); the provider said:\n"
            f"{_said(scene)}"
        )
        await scene.offline.create(
            MEMBERS,
            {
                "apiVersion": "vkprovider.io/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": scene.member, "labels": {SCENE_LABEL: scene.member.removeprefix("reclaim-")}},
                "spec": spec,
            },
        )
    else:
        await scene.spec({"enabled": True})

    async def lendable() -> bool:
        member = (await scene.proc.view())["members"].get(scene.member, {})
        return bool(member.get("enabled") and member.get("free") and not member.get("draining"))

    await eventually(lendable, timeout=30, what=f"{what}: the member lending again")
    for name in names:
        await scene.offline.delete(f"/api/v1/namespaces/{scene.ns}/pods/{name}", params={"gracePeriodSeconds": 0})


def _deletes(scene: Scene, names: set[str], began: float, until: float) -> dict[str, list[float]]:
    """When member-1 received each delete of our pods between `began` and `until` (its audit log)."""
    deletes: dict[str, list[float]] = {}
    for r in audit.records(scene.lab.state, MEMBER, users={scene.user}):
        ours = r.namespace == scene.ns and r.name in names
        if r.verb == "delete" and r.resource == "pods" and ours and began <= r.received <= until:
            deletes.setdefault(r.name, []).append(r.received)
    return deletes


async def _recorded(scene: Scene, names: set[str], began: float) -> bool:
    return set(_deletes(scene, names, began, time.time())) == names


def _said(scene: Scene) -> str:
    """The provider's log lines about the scene's member, across its restarts."""
    return "\n".join(line for line in scene.proc.log_path.read_text().splitlines() if scene.member in line)


async def _sample(scene: Scene, names: set[str], samples: list[tuple[bool, int]]) -> None:
    """Every 0.2 s: whether the MemberCluster is there, then how many of our pods member-1 holds
    (in that order: an object seen gone while pods are still seen is a real breach)."""
    async with scene.lab.client(MEMBER) as client:
        while True:
            try:
                await scene.offline.get(scene.path)
                there = True
            except NotFound:
                there = False
            listed = await client.list(f"/api/v1/namespaces/{scene.ns}/pods")
            samples.append((there, len({p["metadata"]["name"] for p in listed["items"]} & names)))
            await asyncio.sleep(0.2)
