"""The lab works as a real multi-cluster environment: real scheduling onto simulated nodes (the
members' and the offline cluster's own), native gang scheduling, and apiserver outages of one
member."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from e2e import lab as lab_mod
from e2e import nodes as lab_nodes
from e2e.fixtures import Lab
from tests.e2e.helpers import (
    changes_during,
    delete_namespace,
    eventually,
    listed_version,
    make_namespace,
    pod,
    pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

GPU = "nvidia.com/gpu"


def _bound(items: list[dict[str, Any]]) -> list[str]:
    return [p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")]


@pytest.mark.shares_lab
async def test_apiservers_report_their_version_and_nodes_hold_leases(lab: Lab) -> None:
    for cluster in ("offline", *lab.members):
        async with lab.client(cluster) as client:
            version = await client.get("/version")
            assert version["gitVersion"] == "v1.37.2"
    async with lab.client("member-1") as client:
        lease = await client.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/member-1-node-000")
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["spec"]["renewTime"]


@pytest.mark.shares_lab
async def test_deployment_runs_on_simulated_nodes(lab: Lab) -> None:
    async with lab.client("member-2") as client:
        ns = await make_namespace(client, f"deploy-{uuid.uuid4().hex[:6]}")
        try:
            template = pod("web", requests={"cpu": "2", "memory": "1Gi"}, labels={"app": "web"})
            deployment = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": template["metadata"], "spec": template["spec"]},
                },
            }
            await client.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)

            async def running() -> list[dict[str, Any]] | None:
                items = await pods(client, ns, "app=web")
                ok = [p for p in items if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
                return items if len(ok) == 3 else None

            items = await eventually(running, timeout=60, what="3 running web pods")
            for item in items:
                assert item["spec"]["nodeName"].startswith("member-2-node-")
                status = item["status"]
                assert status["hostIP"] == "127.0.0.1"  # every simulated node (e2e.nodes.node_ip)
                conditions = {c["type"]: c["status"] for c in status["conditions"]}
                assert conditions["Ready"] == "True"
                assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
        finally:
            await delete_namespace(client, ns)


@pytest.mark.shares_lab
async def test_offline_native_nodes_are_ready_and_run_plain_pods(lab: Lab) -> None:
    expected = lab.state.clusters["offline"].nodes
    if not expected:
        pytest.skip("this lab has no offline nodes; start it with `python -m e2e up --offline-nodes 4`")
    native = {lab_nodes.CAPACITY_LABEL: lab_nodes.NATIVE_CAPACITY}
    names = [f"offline-node-{i:03d}" for i in range(expected)]
    async with lab.client("offline") as client:

        async def ready_and_untainted() -> list[dict[str, Any]] | None:
            selector = f"{lab_nodes.CAPACITY_LABEL}={lab_nodes.NATIVE_CAPACITY}"
            items = (await client.list("/api/v1/nodes", params={"labelSelector": selector}))["items"]
            ok = [
                n
                for n in items
                if not n["spec"].get("taints")
                and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            ]
            return items if len(ok) == expected else None

        found = await eventually(ready_and_untainted, timeout=60, what=f"{expected} Ready offline native nodes")
        assert sorted(n["metadata"]["name"] for n in found) == names
        ns = await make_namespace(client, f"native-{uuid.uuid4().hex[:6]}")
        try:
            body = pod("plain", requests={"cpu": "2", "memory": "1Gi", GPU: "1"}, spec={"nodeSelector": native})
            await client.create(f"/api/v1/namespaces/{ns}/pods", body)

            async def running() -> dict[str, Any] | None:
                items = await pods(client, ns)
                return next((p for p in items if p["status"].get("phase") == "Running"), None)

            placed = await eventually(running, timeout=60, what="a plain pod running on an offline native node")
            assert placed["spec"]["nodeName"] in names
            assert placed["status"]["hostIP"] == "127.0.0.1"
            assert placed["status"]["podIP"].startswith("10.100.")
            assert placed["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        finally:
            await delete_namespace(client, ns)


def _native_gang(name: str, min_count: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def _gang_pod(name: str, group: str, requests: dict[str, str]) -> dict[str, Any]:
    return pod(name, requests=requests, spec={"schedulingGroup": {"podGroupName": group}})


@pytest.mark.shares_lab
async def test_native_gang_binds_all_together(lab: Lab) -> None:
    async with lab.client("member-2") as client:
        ns = await make_namespace(client, f"gang-{uuid.uuid4().hex[:6]}")
        try:
            await client.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", _native_gang("g", 4))
            since = await listed_version(client, f"/api/v1/namespaces/{ns}/pods")
            for i in range(3):
                await client.create(f"/api/v1/namespaces/{ns}/pods", _gang_pod(f"w{i}", "g", {"cpu": "1", GPU: "1"}))
            # Three of four: the gang must wait, none bound at any moment of three seconds (watched).
            changes = await changes_during(client, f"/api/v1/namespaces/{ns}/pods", since=since, window=3)
            assert _bound([e["object"] for e in changes]) == []
            await client.create(f"/api/v1/namespaces/{ns}/pods", _gang_pod("w3", "g", {"cpu": "1", GPU: "1"}))

            async def all_running() -> bool:
                items = await pods(client, ns)
                return sum(1 for p in items if p["status"].get("phase") == "Running") == 4

            await eventually(all_running, timeout=60, what="the 4-pod gang running")
        finally:
            await delete_namespace(client, ns)


@pytest.mark.lab_turn(alone=["member-2"])  # every GPU of member-2 free
async def test_native_gang_that_cannot_fit_binds_none(lab: Lab) -> None:
    async with lab.client("member-2") as client:
        ns = await make_namespace(client, f"nofit-{uuid.uuid4().hex[:6]}")
        try:
            # 21 pods of 8 GPUs on 20 nodes of 8 GPUs: 20 would fit one by one, the gang cannot.
            await client.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", _native_gang("big", 21))
            await asyncio.gather(
                *(
                    client.create(f"/api/v1/namespaces/{ns}/pods", _gang_pod(f"w{i}", "big", {"cpu": "1", GPU: "8"}))
                    for i in range(21)
                )
            )
            for _ in range(20):  # watch for 10 s: a partial bind would show here
                assert _bound(await pods(client, ns)) == []
                await asyncio.sleep(0.5)
        finally:
            await delete_namespace(client, ns)


@pytest.mark.lab_turn(alone=["member-3"], shares=["member-2"])  # away from member-1 (e2e.fixtures.CHAIN)
async def test_member_outage_leaves_other_clusters_alone(lab: Lab) -> None:
    await asyncio.to_thread(lab_mod.stop_cluster, lab.state_dir, "member-3")
    try:
        async with lab.client("member-3") as down:
            with pytest.raises(Exception):  # noqa: B017 - any connection error will do
                await down.get("/api/v1/namespaces", params={"limit": 1})
        async with lab.client("member-2") as client:
            ns = await make_namespace(client, f"outage-{uuid.uuid4().hex[:6]}")
            try:
                await client.create(f"/api/v1/namespaces/{ns}/pods", pod("p", requests={"cpu": "1"}))

                async def running() -> bool:
                    return any(p["status"].get("phase") == "Running" for p in await pods(client, ns))

                await eventually(running, timeout=60, what="a pod running in member-2 during member-3's outage")
            finally:
                await delete_namespace(client, ns)
    finally:
        await lab_mod.start_cluster(lab.state_dir, "member-3")
    async with lab.client("member-3") as client:
        nodes = await client.list("/api/v1/nodes")
        assert len(nodes["items"]) == 20
