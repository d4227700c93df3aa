"""The tide's statistics agree with an independent computation (issue 13): known pods run in
member-2 (V100 GPUs) for a known time; the provider's used core-seconds and GPU-seconds, read
from /metrics before and after, equal the sum over the pods of their requests times how long
the member held them, timed by the test's own watch of the member (bound, then gone), within
2 %. The history at /history shows the same member."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.fixtures import Lab
from federation import labels
from tests.e2e.helpers import eventually, make_namespace, pod
from tests.e2e.memberwatch import PODS, MemberWatch
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_outages import start_provider
from tests.e2e.test_runtime import running
from vkprovider.kube import KubeClient

# Counts everything in member-2, and nothing else: alone there only.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(alone=["member-2"], shares=["offline"]),
]

PODS_RUN = 3
CPU, GPU = 2.0, 1.0  # each pod's requests
HOLD = 20.0  # seconds the pods run (the provider recomputes every 0.2 s here: edges err by 1 % at most)


def gpu_pod(name: str, node: str) -> dict[str, Any]:
    body = pod(name, requests={"cpu": "2", "nvidia.com/gpu": "1"})
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    body["spec"]["tolerations"] = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    return body


async def test_used_core_and_gpu_seconds_match_the_pods_lifetimes(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, ["member-2"])
    await start_provider(proc, 1)
    ns = await make_namespace(offline, f"tide-{uuid.uuid4().hex[:6]}")
    watch = MemberWatch(lab=lab, members=["member-2"], selector=f"{labels.INSTANCE}={proc.node}", paths=(PODS,))
    await watch.start()
    used_cpu = 'vkprovider_used_cpu_seconds_total{member="member-2"}'
    used_gpu = 'vkprovider_used_gpu_seconds_total{member="member-2",model="Tesla-V100-SXM2-32GB"}'
    try:
        before = (await proc.metric(used_cpu), await proc.metric(used_gpu))
        for i in range(PODS_RUN):
            await offline.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod(f"trainer-{i}", proc.node))
        await eventually(lambda: running(offline, ns, PODS_RUN), timeout=60, what="the pods running in member-2")
        await asyncio.sleep(HOLD)
        for i in range(PODS_RUN):
            await offline.delete(f"/api/v1/namespaces/{ns}/pods/trainer-{i}")

        async def all_gone() -> bool:
            kinds = {(s.uid, s.type) for s in watch.history}
            uids = {s.uid for s in watch.history}
            return len(uids) == PODS_RUN and all((uid, "DELETED") in kinds for uid in uids)

        await eventually(all_gone, timeout=60, what="the member pods gone")

        async def recomputed() -> bool:  # the provider saw the same deletions: it uses nothing there
            return await proc.metric('vkprovider_member_used{member="member-2",resource="cpu"}') == 0.0

        await eventually(recomputed, timeout=30, what="the provider's use of member-2 back to 0")
        after = (await proc.metric(used_cpu), await proc.metric(used_gpu))
        watch.check()

        held = 0.0
        for uid in {s.uid for s in watch.history}:
            sightings = [s for s in watch.history if s.uid == uid]
            bound = min(s.at for s in sightings if s.bound)
            deleted = min(s.at for s in sightings if s.type == "DELETED")
            held += deleted - bound
        expected = {"cpu": CPU * held, "gpu": GPU * held}
        measured = {"cpu": after[0] - before[0], "gpu": after[1] - before[1]}
        print(f"tide: expected {expected}, measured {measured}")
        for what in ("cpu", "gpu"):
            assert abs(measured[what] - expected[what]) <= 0.02 * expected[what], (what, measured, expected)

        # The present-moment gauges the chart's alert rules read.
        assert await proc.metric('vkprovider_member_reachable{member="member-2"}') == 1.0
        # Named whole, for tests/unit/test_metrics_reader.py's scan.
        gauges = (
            "vkprovider_member_lent",
            "vkprovider_member_used",
            "vkprovider_member_free",
            "vkprovider_member_online",
        )
        figures = {
            name.rpartition("_")[2]: await proc.metric(f'{name}{{member="member-2",resource="cpu"}}') for name in gauges
        }
        assert figures["lent"] > 0 and figures["used"] == 0.0, figures
        assert figures["lent"] == pytest.approx(figures["used"] + figures["free"]), figures  # one definition
        assert await proc.metric('vkprovider_jobs{state="dispatched"}') == 0.0
        assert await proc.metric('vkprovider_jobs{state="NoMemberFits"}') == 0.0

        base = f"http://127.0.0.1:{proc.health_port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/history?since=10m&member=member-2") as resp:
                history = await resp.json()
            async with session.get(f"{base}/") as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                page = await resp.text()
        # The dashboard fetches nothing from outside the provider (the SVG namespace is a name).
        assert "vkprovider: the tide" in page
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
        assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
        series = {(s["resource"], s["kind"]): s["points"] for s in history["series"]}
        assert history["step"] == 10.0
        assert max(v for _, v in series[("cpu", "used")]) == pytest.approx(CPU * PODS_RUN)
        assert max(v for _, v in series[("gpu/Tesla-V100-SXM2-32GB", "used")]) == pytest.approx(GPU * PODS_RUN)
        assert series[("cpu", "lent")] and series[("cpu", "online")]

        # The daily summary, as `vkprovider status --since` prints it.
        said = subprocess.run(
            [sys.executable, "-m", "vkprovider.cli", "status", "--url", base, "--since", "10m"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert said.returncode == 0, said
        row = next(line for line in said.stdout.splitlines() if "gpu/Tesla-V100-SXM2-32GB" in line)
        assert row.split()[0] == "member-2" and "GPU-h" in row and row.endswith("%"), said.stdout
    finally:
        await watch.stop()
        await cleanup_and_stop(lab, offline, ns, proc)
