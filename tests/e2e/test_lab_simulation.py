"""Simulated nodes behave like kubelets where tests depend on it: NUMA topology published,
pods failed, exited or evicted on request, graceful deletion, Job completion, online load."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from typing import Any

import pytest

from e2e import lab as lab_mod
from e2e import online
from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace, pod, pods
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.shares_lab
async def test_nodes_publish_numa_topology(lab: Lab) -> None:
    async with lab.client("member-2") as client:
        topology = await client.get("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/member-2-node-000")
    zones = topology["zones"]
    assert [z["name"] for z in zones] == ["node-0", "node-1"]
    gpus = [r for z in zones for r in z["resources"] if r["name"] == "nvidia.com/gpu"]
    assert [g["capacity"] for g in gpus] == ["4", "4"]


@pytest.mark.shares_lab
@pytest.mark.parametrize(
    ("action", "phase", "reason", "exit_code"),
    [("fail", "Failed", None, 1), ("exit", "Succeeded", None, 0), ("evict", "Failed", "Evicted", 137)],
)
async def test_pods_fail_exit_or_get_evicted_on_request(
    lab: Lab, action: str, phase: str, reason: str | None, exit_code: int
) -> None:
    async with lab.client("member-1") as client:
        ns = await make_namespace(client, f"sim-{action}-{uuid.uuid4().hex[:6]}")
        try:
            await client.create(f"/api/v1/namespaces/{ns}/pods", pod("p", requests={"cpu": "1"}))

            async def phase_is(want: str) -> dict[str, Any] | None:
                item = await client.get(f"/api/v1/namespaces/{ns}/pods/p")
                return item if item["status"].get("phase") == want else None

            await eventually(lambda: phase_is("Running"), what="pod running")
            await client.patch(
                f"/api/v1/namespaces/{ns}/pods/p", {"metadata": {"annotations": {"vkprovider.io/sim-action": action}}}
            )
            item = await eventually(lambda: phase_is(phase), what=f"pod {phase} after sim-action={action}")
            assert item["status"].get("reason") == reason
            terminated = item["status"]["containerStatuses"][0]["state"]["terminated"]
            assert terminated["exitCode"] == exit_code
        finally:
            await delete_namespace(client, ns)


@pytest.mark.shares_lab
async def test_graceful_deletion_takes_the_termination_time(lab: Lab) -> None:
    async with lab.client("member-1") as client:
        ns = await make_namespace(client, f"sim-del-{uuid.uuid4().hex[:6]}")
        try:
            body = pod("slow", requests={"cpu": "1"}, annotations={"vkprovider.io/sim-terminate-after": "4s"})
            body["spec"]["terminationGracePeriodSeconds"] = 30
            await client.create(f"/api/v1/namespaces/{ns}/pods", body)
            await eventually(
                lambda: _phase(client, ns, "slow", "Running"),
                what="pod running",
            )
            started = time.monotonic()
            await client.delete(f"/api/v1/namespaces/{ns}/pods/slow")
            item = await client.get(f"/api/v1/namespaces/{ns}/pods/slow")
            assert item["metadata"]["deletionTimestamp"]
            await eventually(lambda: _gone(client, ns, "slow"), timeout=30, what="pod deleted")
            assert time.monotonic() - started >= 3.5
        finally:
            await delete_namespace(client, ns)


@pytest.mark.lab_turn(alone=["member-2"])
async def test_a_pod_completes_its_time_after_it_started_even_when_kwok_restarts(lab: Lab) -> None:
    """`sim-complete-after` counts from the pod's startTime: a KWOK restarted in between (as the
    outage tests restart it with its apiserver) does not start the count again."""
    after = 10
    async with lab.client("member-2") as client:
        ns = await make_namespace(client, f"sim-done-{uuid.uuid4().hex[:6]}")
        try:
            body = pod("p", requests={"cpu": "1"}, annotations={"vkprovider.io/sim-complete-after": f"{after}s"})
            await client.create(f"/api/v1/namespaces/{ns}/pods", body)
            await eventually(lambda: _phase(client, ns, "p", "Running"), what="pod running")
            await asyncio.sleep(5)  # well into its time, so a count started again would show
            restarted = time.time()
            await lab_mod.restart_components(lab.state_dir, "member-2")
            await eventually(lambda: _phase(client, ns, "p", "Succeeded"), timeout=30, what="pod completed")
            item = await client.get(f"/api/v1/namespaces/{ns}/pods/p")
            started = _stamp(item["status"]["startTime"])
            finished = _stamp(item["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
            # Stamps have whole seconds, hence the second of slack each way.
            assert finished >= started + after - 1, (item["status"]["startTime"], finished)
            assert finished < restarted + after - 1, f"completed {finished - restarted:.0f}s after KWOK restarted"
        finally:
            await delete_namespace(client, ns)


def _stamp(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def _phase(client: KubeClient, ns: str, name: str, want: str) -> bool:
    item = await client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return bool(item["status"].get("phase") == want)


async def _gone(client: KubeClient, ns: str, name: str) -> bool:
    return not [p for p in await pods(client, ns) if p["metadata"]["name"] == name]


@pytest.mark.shares_lab
async def test_job_pods_complete(lab: Lab) -> None:
    async with lab.client("member-1") as client:
        ns = await make_namespace(client, f"sim-job-{uuid.uuid4().hex[:6]}")
        try:
            template = pod("x", requests={"cpu": "1"})
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "batch"},
                "spec": {
                    "completions": 3,
                    "parallelism": 3,
                    "template": {"spec": {**template["spec"], "restartPolicy": "Never"}},
                },
            }
            await client.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)

            async def complete() -> bool:
                item = await client.get(f"/apis/batch/v1/namespaces/{ns}/jobs/batch")
                return bool(item.get("status", {}).get("succeeded") == 3)

            await eventually(complete, timeout=60, what="job complete")
        finally:
            await delete_namespace(client, ns)


@pytest.mark.lab_turn(alone=["member-2"])  # away from member-1 (e2e.fixtures.CHAIN)
async def test_online_load_takes_the_requested_share(lab: Lab) -> None:
    kubeconfig = lab.kubeconfig("member-2")
    try:
        result = await online.set_load(kubeconfig, cpu_share=0.2, wait=True, name="tide")
        # 20 nodes x 79 allocatable cores (gpu-v100: 80, less 1 reserved); 4-core replicas.
        assert result.allocatable_cpu == 1580
        assert result.replicas == 79
        result = await online.set_load(kubeconfig, cpu_share=0.05, wait=True, name="tide")
        assert result.replicas == 20 and result.running == 20  # 19.75, rounded
    finally:
        await online.set_load(kubeconfig, cpu_share=0, wait=True, name="tide")
