"""Randomized restarts (issue 43): kill -9 of the provider at a random moment of a member outage,
a gang's wait and a member's drain, RESTART_TRIALS (5) trials of each after one run without a
restart, checking that each trial ends in the same user-visible states as the run without one,
within the timing a restart may cost.

The three scenarios run side by side, each with its own provider, so one test run's time covers
all of them:
- outage: member-3, reached through a proxy the test cuts (tests.e2e.cutproxy: an outage for
  this provider only), `unreachable_grace` 4 s and `pods_lost_after` 11 s: both pods end Failed
  MemberLost, never before 11 s without an answer, and at most 11 s (plus slack) after the
  restart when nothing was recorded; of the kills (at 1 to 9 s) two fall before the outage is
  recorded on the pods (at the grace from the member's last answer: 2 to 4 s after the cut) and
  three after;
- gang wait: a gang of two pods no member can host (9 GPUs each), timeout 10 s: both end Failed
  GangTimeout, told once each, at about 10 s from the wait's start, not 10 s after the restart;
- drain: member-1 as a MemberCluster, disabled while two pods of ours run there with a 3 s
  notice: both end Failed Reclaimed with DisruptionTarget, each deleted once in member-1 and not
  before its deadline, nothing left there, and the member ends disabled.

A trial's clean-up (its namespaces and pods deleted) runs beside the next trials, in their own
namespaces; an outage trial cuts the proxy only once the earlier ones' member pods are gone.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from e2e import audit
from e2e.fixtures import Lab
from tests.e2e.cutproxy import CutProxy
from tests.e2e.helpers import delete_namespace, eventually, make_namespace, pods, settle
from tests.e2e.reclaim_scene import front_pod, start_scene, stop_scene
from tests.e2e.test_dispatch import cleanup, pod_group
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_outages import SLACK, condition, plain_pod
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

RESTART_TRIALS = 5
#: The outage's clocks: the provider's unreachable grace (at its end the outage is recorded on
#: the pods) and pods_lost_after, both from the member's last answer.
OUTAGE_GRACE = 4.0
LOST_AFTER = 11.0
GANG_TIMEOUT = 10.0
NOTICE = 3.0
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1"

State = tuple[str | None, str | None, str | None]  # phase, reason, DisruptionTarget reason


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _state(pod: dict[str, Any]) -> State:
    status = pod.get("status") or {}
    target = condition(pod, "DisruptionTarget")
    return status.get("phase"), status.get("reason"), target["reason"] if target else None


async def _ended(offline: KubeClient, ns: str, count: int) -> dict[str, dict[str, Any]] | None:
    items = {p["metadata"]["name"]: p for p in await pods(offline, ns)}
    done = len(items) == count and all(p["status"].get("phase") in ("Failed", "Succeeded") for p in items.values())
    return items if done else None


async def _restart(proc: VkProcess, after: float | None) -> float | None:
    """kill -9 `after` seconds from now and start again; when it was up again (None: no kill)."""
    if after is None:
        return None
    await asyncio.sleep(after)
    proc.kill()
    proc.start()
    await proc.wait_ready(timeout=60)
    return time.time()


Trial = Callable[[int, float | None], Awaitable[dict[str, State]]]


async def _trials(name: str, trial: Trial, window: float, rng: random.Random) -> None:
    """One run without a restart, then RESTART_TRIALS with a kill at a random moment of
    `window` seconds: every one ends in the states of the first."""
    baseline = await trial(0, None)
    for n in range(1, RESTART_TRIALS + 1):
        kill_at = rng.uniform(0.0, window)
        states = await trial(n, kill_at)
        assert states == baseline, f"{name} trial {n} (kill at {kill_at:.1f}s): {states} != {baseline}"


# -- outage --------------------------------------------------------------------------------------


async def _started(proc: VkProcess) -> None:
    """Started and its member's capacity known; three providers start at once beside another
    test on two cores, so the wait is longer than a lone start's."""
    proc.start()
    await proc.wait_ready(timeout=90)

    async def synced() -> bool:
        members = (await proc.view()).get("members", {})
        return len(members) == 1 and all("lent" in m for m in members.values())

    await eventually(synced, timeout=90, what="member capacity")


async def _outage(lab: Lab, offline: KubeClient, workdir: Path, rng: random.Random) -> None:
    proxy = CutProxy(lab.kubeconfig("member-3"))
    await proxy.start()
    workdir.mkdir()
    proc = federation_vk(lab, workdir, [])
    proc.overrides["provider.federation"]["members"] = [
        {"name": "member-3", "kubeconfig": str(proxy.kubeconfig(workdir / "member-3.yaml"))}
    ]
    proc.overrides["provider.federation"]["unreachable_grace"] = OUTAGE_GRACE
    proc.overrides["provider.federation"]["pods_lost_after"] = LOST_AFTER
    cleanups: list[asyncio.Task[None]] = []

    async def clean(n: int, ns: str) -> None:
        await delete_namespace(offline, ns)
        async with lab.client("member-3") as member:
            await eventually(lambda: _none(member, ns), timeout=60, what=f"outage {n}: member pods gone")
            await delete_namespace(member, ns)

    async def trial(n: int, kill_at: float | None) -> dict[str, State]:
        ns = await make_namespace(offline, f"rh-outage-{n}-{uuid.uuid4().hex[:4]}")
        try:
            for i in range(2):
                await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod(f"p{i}", proc.node))

            async def running() -> bool:
                items = await pods(offline, ns)
                return len(items) == 2 and all(p["status"].get("phase") == "Running" for p in items)

            await eventually(running, timeout=60, what=f"outage {n}: pods running")
            # The earlier trials' member pods are gone (the provider deletes them through the proxy).
            await settle(*cleanups)
            proxy.cut()
            cut_at = time.time()
            try:
                restarted = await _restart(proc, kill_at)
                ended = await eventually(
                    lambda: _ended(offline, ns, 2), timeout=LOST_AFTER + 60, what=f"outage {n}: pods lost"
                )
                took = time.time()
            finally:
                proxy.mend()
            assert took - cut_at >= LOST_AFTER - 2.0, f"outage {n}: lost after {took - cut_at:.1f}s"
            counted_from = restarted if restarted is not None else cut_at
            assert took - counted_from <= LOST_AFTER + 2 * SLACK, f"outage {n}: lost {took - counted_from:.1f}s late"
            return {name: _state(pod) for name, pod in ended.items()}
        finally:
            cleanups.append(asyncio.create_task(clean(n, ns), name=f"restarts/outage-cleanup-{n}"))

    try:
        await _started(proc)
        await _trials("outage", trial, LOST_AFTER + 4.0, rng)
    finally:
        try:
            await settle(*cleanups)  # while the provider runs, the proxy mended: it deletes the member pods
        finally:
            proc.ensure_stopped()
            await proxy.stop()


async def _none(client: KubeClient, ns: str) -> bool:
    return not await pods(client, ns)


# -- gang wait -----------------------------------------------------------------------------------


async def _gang(lab: Lab, offline: KubeClient, workdir: Path, rng: random.Random) -> None:
    workdir.mkdir()
    proc = federation_vk(lab, workdir, ["member-2"])
    to_virtual = {
        "nodeSelector": {"kubernetes.io/hostname": proc.node},
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
    }
    gpus = {"requests": {"cpu": "1", "nvidia.com/gpu": "9"}, "limits": {"nvidia.com/gpu": "9"}}
    #: Each trial's clean-up runs beside the next ones: its pods never leave the front end (no
    #: member can host them), and its namespace, job and Events are apart from theirs.
    cleanups: list[asyncio.Task[None]] = []

    async def trial(n: int, kill_at: float | None) -> dict[str, State]:
        ns = await make_namespace(offline, f"rh-gang-{n}-{uuid.uuid4().hex[:4]}")
        try:
            group = pod_group("big", 2, {"vkprovider.io/gang-timeout-seconds": f"{GANG_TIMEOUT:g}"})
            await offline.create(f"{PODGROUPS}/namespaces/{ns}/podgroups", group)
            for i in range(2):
                body = {
                    "metadata": {"name": f"g{i}", "labels": {"vkprovider.io/role": "worker-min"}},
                    "spec": {
                        **to_virtual,
                        "schedulingGroup": {"podGroupName": "big"},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "registry.example/big:1", "resources": gpus}],
                    },
                }
                await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

            async def bound() -> float | None:
                items = await pods(offline, ns)
                times = [
                    _seconds(c["lastTransitionTime"])
                    for p in items
                    if (c := condition(p, "PodScheduled")) is not None and c["status"] == "True"
                ]
                return max(times) if len(times) == 2 else None

            ready = await eventually(bound, timeout=30, what=f"gang {n}: both pods bound")
            await _restart(proc, kill_at)
            ended = await eventually(
                lambda: _ended(offline, ns, 2), timeout=GANG_TIMEOUT + 60, what=f"gang {n}: GangTimeout"
            )
            took = time.time()
            assert took - ready <= GANG_TIMEOUT + 2 * SLACK, f"gang {n}: timed out {took - ready:.1f}s after ready"

            async def told_once() -> dict[str, int] | None:
                listed = await offline.list(
                    f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "reason=GangTimeout"}
                )
                counts: dict[str, int] = {}
                for event in listed["items"]:
                    name = event["involvedObject"]["name"]
                    counts[name] = counts.get(name, 0) + int(event.get("count") or 1)
                return counts if set(counts) == {"g0", "g1"} else None

            counts = await eventually(told_once, timeout=15, what=f"gang {n}: GangTimeout Events")
            assert set(counts.values()) == {1}, f"gang {n}: told {counts}"
            return {name: _state(pod) for name, pod in ended.items()}
        finally:
            cleanups.append(asyncio.create_task(cleanup(lab, offline, ns), name=f"restarts/gang-cleanup-{n}"))

    try:
        await _started(proc)
        await _trials("gang", trial, GANG_TIMEOUT, rng)
    finally:
        try:
            await settle(*cleanups)  # while the provider runs: it lets the front-end pods go
        finally:
            proc.ensure_stopped()


# -- drain ---------------------------------------------------------------------------------------


async def _drain(lab: Lab, offline: KubeClient, workdir: Path, rng: random.Random) -> None:
    workdir.mkdir()
    scene = await start_scene(lab, offline, workdir, notice=NOTICE)

    async def trial(n: int, kill_at: float | None) -> dict[str, State]:
        names = {f"d{n}-{i}" for i in range(2)}
        for name in sorted(names):
            body = front_pod(name, scene.proc.node, cpu=1, role="worker-min")
            await offline.create(f"/api/v1/namespaces/{scene.ns}/pods", body)
        await eventually(lambda: scene.running(names), timeout=60, what=f"drain {n}: pods running")
        began = time.time()
        await scene.spec({"enabled": False})
        await _restart(scene.proc, kill_at)

        async def drained() -> dict[str, dict[str, Any]] | None:
            front = await scene.front()
            done = all(front.get(n, {}).get("status", {}).get("phase") == "Failed" for n in names)
            return {n: front[n] for n in names} if done and not set(await scene.placed()) & names else None

        ended = await eventually(drained, timeout=NOTICE + 60, what=f"drain {n}: pods drained")
        deletes: dict[str, list[float]] = {}
        for r in audit.records(scene.lab.state, "member-1", users={scene.user}):
            if r.verb == "delete" and r.resource == "pods" and r.name in names and r.received >= began:
                deletes.setdefault(r.name, []).append(r.received)
        assert {k: len(v) for k, v in deletes.items()} == dict.fromkeys(names, 1), f"drain {n}: deletes {deletes}"
        for name, times in deletes.items():
            assert times[0] - began >= NOTICE, f"drain {n}: {name} deleted {times[0] - began:.1f}s after the drain"
        states = {name.split("-", 1)[1]: _state(pod) for name, pod in ended.items()}

        async def disabled() -> bool:
            member = (await scene.proc.view()).get("members", {}).get(scene.member, {})
            return member.get("enabled") is False and not member.get("draining")

        await eventually(disabled, timeout=30, what=f"drain {n}: the member disabled, drained")
        await scene.spec({"enabled": True})

        async def lends() -> bool:
            return "lent" in (await scene.proc.view()).get("members", {}).get(scene.member, {})

        await eventually(lends, timeout=30, what=f"drain {n}: the member enabled again")
        return states

    try:
        await _trials("drain", trial, NOTICE + 3.0, rng)
    finally:
        await stop_scene(scene)


@pytest.mark.shares_lab  # its outage is a proxy cut for its own provider, not a stopped apiserver
@pytest.mark.long
async def test_randomized_restarts_during_outages_gang_waits_and_drains_end_as_without_them(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    rng = random.Random(43)
    seeds = [random.Random(rng.random()) for _ in range(3)]
    async with asyncio.TaskGroup() as group:  # one failing cancels the others (their clean-up runs)
        group.create_task(_outage(lab, offline, tmp_path / "outage", seeds[0]), name="restarts/outage")
        group.create_task(_gang(lab, offline, tmp_path / "gang", seeds[1]), name="restarts/gang")
        group.create_task(_drain(lab, offline, tmp_path / "drain", seeds[2]), name="restarts/drain")
