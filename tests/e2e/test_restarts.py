"""Restarts keep the outage clocks (issue 43): a provider killed (kill -9) and started again in
the middle of a member outage shows `vkprovider.io/MemberReachable=False` on the member's pods and
ends them `MemberLost` at `pods_lost_after`, counted from the member's last answer as recorded
before the restart (the condition on the front-end pods), or from the restart when nothing was
recorded, and says which.

Two providers over member-3 share one outage: A is killed before member-3 stops (nothing can be
recorded), B while the outage is already shown on its pods (recorded). The outage is a cut proxy
in front of member-3 that only these two providers go through (tests.e2e.cutproxy), so the test
shares the lab with others: to them member-3 stays up."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import Lab
from tests.e2e.cutproxy import CutProxy
from tests.e2e.helpers import eventually, make_namespace, pods, settle
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import UNREACHABLE_GRACE, federation_vk
from tests.e2e.test_outages import SLACK, condition, plain_pod, running, start_provider
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: B is restarted about 11 s into the outage (the grace, a probe, a restart): its pods must end
#: lost well before a whole LOST_AFTER after that restart, and A's a whole LOST_AFTER after its own.
LOST_AFTER = 30.0
MEMBER = "member-3"


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _provider(lab: Lab, workdir: Path, proxy: CutProxy) -> VkProcess:
    workdir.mkdir()
    proc = federation_vk(lab, workdir, [])
    proc.overrides["provider.federation"]["members"] = [
        {"name": MEMBER, "kubeconfig": str(proxy.kubeconfig(workdir / f"{MEMBER}.yaml"))}
    ]
    proc.overrides["provider.federation"]["pods_lost_after"] = LOST_AFTER
    return proc


async def _running(offline: KubeClient, proc: VkProcess, ns: str, tag: str) -> None:
    """The provider started, and three pods of `ns` running in the member through it."""
    await start_provider(proc, 1)
    await make_namespace(offline, ns)
    for i in range(3):
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod(f"p{i}", proc.node))
    await eventually(lambda: running(offline, ns, 3), timeout=60, what=f"{tag}: 3 pods running in {MEMBER}")


async def _marked(offline: KubeClient, ns: str) -> list[dict[str, Any]] | None:
    items = await pods(offline, ns)
    ok = all((c := condition(p, "vkprovider.io/MemberReachable")) and c["status"] == "False" for p in items)
    return items if items and ok else None


async def _lost(offline: KubeClient, ns: str) -> list[dict[str, Any]] | None:
    items = await pods(offline, ns)
    return items if items and all(p["status"].get("phase") == "Failed" for p in items) else None


@pytest.mark.lab_turn(shares=["offline", MEMBER])
@pytest.mark.long
async def test_a_restart_in_the_middle_of_an_outage_keeps_its_clocks(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proxy = CutProxy(lab.kubeconfig(MEMBER))
    await proxy.start()
    a, b = _provider(lab, tmp_path / "a", proxy), _provider(lab, tmp_path / "b", proxy)
    ns_a, ns_b = (f"restart-{tag}-{uuid.uuid4().hex[:6]}" for tag in "ab")
    try:
        async with asyncio.TaskGroup() as group:  # both set up at once
            group.create_task(_running(offline, a, ns_a, "a"), name="restarts/setup-a")
            group.create_task(_running(offline, b, ns_b, "b"), name="restarts/setup-b")
        a.kill()  # A dies before the outage: nothing of it can be recorded
        stopped = time.time()
        proxy.cut()
        try:
            a.start()
            await a.wait_ready(timeout=60)
            restarted_a = time.time()
            # B shows the outage on its pods (the record), then dies and comes back.
            await eventually(lambda: _marked(offline, ns_b), timeout=UNREACHABLE_GRACE + 2 * SLACK, what="b marked")
            b.kill()
            b.start()
            await b.wait_ready(timeout=60)
            restarted_b = time.time()

            # Within 30 s of its restart, A's pods show the member unreachable, counted from A's start.
            marked = await eventually(lambda: _marked(offline, ns_a), timeout=30, what="a's pods marked")
            assert time.time() - restarted_a <= 30 + SLACK
            for item in marked:
                cond = condition(item, "vkprovider.io/MemberReachable")
                assert cond is not None and "since the provider started" in cond["message"], cond

            # B's pods end lost at the member's last answer + pods_lost_after (its record), not
            # pods_lost_after after B's restart.
            lost_b = await eventually(lambda: _lost(offline, ns_b), timeout=LOST_AFTER + 3 * SLACK, what="b lost")
            ended_b = time.time()
            assert ended_b - stopped <= LOST_AFTER + 2 * SLACK, f"b lost {ended_b - stopped:.1f}s after the stop"
            assert ended_b - restarted_b < LOST_AFTER, "b counted from its restart"
            # A's pods end lost pods_lost_after after A's restart (nothing recorded before it).
            lost_a = await eventually(lambda: _lost(offline, ns_a), timeout=LOST_AFTER + 3 * SLACK, what="a lost")
            ended_a = time.time()
            assert ended_a - restarted_a >= LOST_AFTER - 2.0, f"a lost {ended_a - restarted_a:.1f}s after its start"
            assert ended_a - restarted_a <= LOST_AFTER + 2 * SLACK
            for item, from_start in [*((i, False) for i in lost_b), *((i, True) for i in lost_a)]:
                status = item["status"]
                assert status["reason"] == "MemberLost", status
                assert ("since the provider started" in status["message"]) == from_start, status
                target = condition(item, "DisruptionTarget")
                assert target is not None and target["status"] == "True" and target["reason"] == "MemberUnreachable"
            print(
                f"b lost {ended_b - stopped:.1f}s after {MEMBER} stopped (restarted at {restarted_b - stopped:.1f}s); "
                f"a lost {ended_a - restarted_a:.1f}s after its restart"
            )
        finally:
            proxy.mend()
    finally:
        cleanups = [
            asyncio.create_task(cleanup_and_stop(lab, offline, ns, proc), name=f"restarts/cleanup-{tag}")
            for tag, ns, proc in (("a", ns_a, a), ("b", ns_b, b))
        ]
        try:  # both cleaned up at once, each to its end whatever the other does
            await settle(*cleanups)
        finally:
            await proxy.stop()
