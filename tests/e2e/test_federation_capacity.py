"""Member capacity end to end: the pooled virtual node shows exactly what the members can lend
(computed here independently from the members' own objects), follows online load within
seconds, exposes GPU models and shapes, survives a member outage, and follows MemberCluster
objects added and removed at run time."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from e2e import audit, online
from e2e import lab as lab_mod
from e2e.fixtures import Lab
from federation.tenancy.policy import TENANT
from tests.e2e.helpers import capacity_agents, eventually, install_member_cluster_crd
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

RESERVE = 0.10
#: The settings federation_vk gives the provider, and the intervals they imply.
UNREACHABLE_GRACE = 8.0
PUBLISH_INTERVAL = 0.2
HEALTH_INTERVAL = 2.0  # federation.members.watch: the member's /readyz probe
#: Slack on every wall-clock bound: what a loaded 2-core machine adds to a few apiserver round
#: trips. Bounds are there to catch a missing mechanism, not to measure speed (bench/ does).
SLACK = 10.0
CRD = Path(__file__).parents[2] / "federation" / "crds" / "memberclusters.yaml"
#: On a reclaim scene's MemberCluster (tests.e2e.reclaim_scene): that object is its own
#: provider's alone, as docs/benchmarks.md's "several instances" wants of every MemberCluster.
SCENE_LABEL = "vkprovider.io/test-scene"


def _cpu_m(q: str) -> int:
    return int(float(q[:-1])) if q.endswith("m") else int(float(q) * 1000)


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def _bytes(q: str) -> int:
    for suffix, factor in _UNITS.items():
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * factor)
    return int(q)


async def expected_lendable(client: KubeClient) -> dict[str, int]:
    """Our own reading of the member: per Ready, schedulable, untainted node, allocatable minus
    the requests of its live pods minus a 10 % reserve of CPU and memory."""
    nodes = (await client.list("/api/v1/nodes"))["items"]
    pods = (await client.list("/api/v1/pods"))["items"]
    used: dict[str, dict[str, int]] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        u = used.setdefault(node, {"cpu": 0, "memory": 0, "gpu": 0, "pods": 0})
        u["pods"] += 1
        for c in p["spec"]["containers"]:
            req = (c.get("resources") or {}).get("requests") or {}
            u["cpu"] += _cpu_m(req.get("cpu", "0"))
            u["memory"] += _bytes(req.get("memory", "0"))
            u["gpu"] += int(req.get("nvidia.com/gpu", "0"))
    total = {"cpu": 0, "memory": 0, "gpu": 0, "pods": 0}
    for n in nodes:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        if not ready or n["spec"].get("unschedulable") or n["spec"].get("taints"):
            continue
        alloc = n["status"]["allocatable"]
        u = used.get(n["metadata"]["name"], {"cpu": 0, "memory": 0, "gpu": 0, "pods": 0})
        cpu, mem = _cpu_m(alloc["cpu"]), _bytes(alloc["memory"])
        total["cpu"] += max(0, cpu - u["cpu"] - int(cpu * RESERVE))
        total["memory"] += max(0, mem - u["memory"] - int(mem * RESERVE))
        total["gpu"] += max(0, int(alloc.get("nvidia.com/gpu", "0")) - u["gpu"])
        total["pods"] += max(0, int(alloc["pods"]) - u["pods"])
    return total


def node_vector(node: dict[str, Any]) -> dict[str, int]:
    alloc = node["status"]["allocatable"]
    return {
        "cpu": _cpu_m(alloc["cpu"]),
        "memory": _bytes(alloc["memory"]),
        "gpu": int(alloc.get("nvidia.com/gpu", "0")),
        "pods": int(alloc["pods"]),
    }


def federation_vk(
    lab: Lab, workdir: Path, members: list[str], *, audited_as: str | None = None, **overrides: Any
) -> VkProcess:
    """A federation provider over `members`; with `audited_as`, under that user name in every
    cluster, whose requests the lab's audit logs record (e2e.audit)."""
    node = f"vk-fed-{uuid.uuid4().hex[:6]}"

    def kubeconfig(cluster: str) -> str:
        if audited_as is None:
            return str(lab.kubeconfig(cluster))
        return str(audit.user_kubeconfig(lab.state, cluster, audited_as, groups=("system:masters",)))

    settings = {
        "provider.type": "federation",
        "node.provider_id": "federation",
        "kube.kubeconfig": kubeconfig("offline"),
        "provider.federation": {
            "members": [{"name": m, "kubeconfig": kubeconfig(m)} for m in members],
            "unreachable_grace": UNREACHABLE_GRACE,
            "publish_interval": PUBLISH_INTERVAL,
            # Every provider here is another instance in one front end: none may follow a scene's
            # MemberCluster (shares_lab tests run beside a scene). One that did would put the one
            # shared finalizer on it and, having no pod there, let it go the moment the object is
            # deleted, while the scene's provider is still draining it (issue 43).
            # Nor a tenant's (test_tenant_boundary, test_onboard make them while others run).
            "member_selector": f"!{SCENE_LABEL},!{TENANT}",
        },
    }
    settings.update(overrides)
    return VkProcess(lab=lab, node=node, workdir=workdir, overrides=settings)


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


@pytest.fixture
def started(tmp_path: Path) -> Any:
    procs: list[VkProcess] = []
    yield procs
    for proc in procs:
        proc.ensure_stopped()


async def _node(client: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return await client.get(f"/api/v1/nodes/{name}")
    except NotFound:
        return None


async def _sum_expected(lab: Lab, members: list[str]) -> dict[str, int]:
    total = {"cpu": 0, "memory": 0, "gpu": 0, "pods": 0}
    for member in members:
        async with lab.client(member) as client:
            for k, v in (await expected_lendable(client)).items():
                total[k] += v
    return total


async def test_pooled_node_matches_members_and_follows_load(
    lab: Lab, offline: KubeClient, tmp_path: Path, started: list[VkProcess]
) -> None:
    members = lab.members
    proc = federation_vk(lab, tmp_path, members)
    started.append(proc)
    proc.start()
    await proc.wait_ready()
    member_1 = lab.kubeconfig("member-1")
    try:
        await online.set_load(member_1, cpu_share=0.2, wait=True, name="tide")

        async def matches() -> dict[str, int] | None:
            node = await _node(offline, proc.node)
            expected = await _sum_expected(lab, members)
            if node and node_vector(node) == expected:
                return expected
            return None

        before = await eventually(matches, timeout=30, what="virtual node equal to the members' lendable capacity")
        assert before["gpu"] == 20 * 8 + 20 * 4

        # 20 % -> 70 % of member-1's CPU: a decrease is published at once (no damping), so the
        # node follows within a publish and a node status write, plus slack for a busy machine.
        # How fast it really is, is measured by bench/reaction.py.
        await online.set_load(member_1, cpu_share=0.7, wait=True, name="tide")
        raised = time.monotonic()
        after = await eventually(matches, timeout=60, interval=0.1, what="virtual node after the load rise")
        took = time.monotonic() - raised
        assert after["cpu"] < before["cpu"]
        print(f"virtual node followed online load after {took:.2f}s")  # measured by bench/reaction.py
        node = await _node(offline, proc.node)
        assert node is not None
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True" and conditions["MembersReachable"] == "True"
    finally:
        await online.set_load(member_1, cpu_share=0, wait=True, name="tide")


async def test_gpu_models_and_shapes(lab: Lab, offline: KubeClient, tmp_path: Path, started: list[VkProcess]) -> None:
    proc = federation_vk(lab, tmp_path, lab.members)
    started.append(proc)
    proc.start()
    await proc.wait_ready()

    async def shapes() -> dict[str, Any] | None:
        node = await _node(offline, proc.node)
        raw = (node or {}).get("metadata", {}).get("annotations", {}).get("vkprovider.io/capacity-shapes")
        parsed = json.loads(raw) if raw else {}
        # Settled: the load of earlier tests has gone from member-1 (95 cores less 10 %).
        settled = parsed.get("member-1", {}).get("largest", {}).get("cpu", {}).get("cpu") == "85500m"
        return parsed if len(parsed) == 3 and settled else None

    found = await eventually(shapes, timeout=30, what="capacity shapes for 3 members")
    assert found["member-2"]["gpusByModel"] == {"Tesla-V100-SXM2-32GB": 160}
    assert found["member-3"]["gpusByModel"] == {"Tesla-T4": 80}
    assert found["member-1"]["gpusByModel"] == {}
    assert found["member-2"]["largest"]["gpu"]["nvidia.com/gpu"] == "8"
    assert found["member-3"]["largest"]["gpu"]["nvidia.com/gpu"] == "4"
    assert found["member-2"]["networkPods"]["member-2-np0"]["nvidia.com/gpu"] == "40"  # 5 nodes x 8
    assert found["member-2"]["numaLargestZone"]["nvidia.com/gpu"] == "4"
    node = await _node(offline, proc.node)
    assert node is not None
    labels = node["metadata"]["labels"]
    assert labels["gpu.vkprovider.io/Tesla-V100-SXM2-32GB"] == "true" and labels["gpu.vkprovider.io/Tesla-T4"] == "true"
    view = await proc.view()
    assert view["members"]["member-2"]["gpusByModel"] == {"Tesla-V100-SXM2-32GB": 160}


#: The GPU members only: tests that need no more keep away from member-1, where the reclaim
#: tests run meanwhile (e2e.fixtures.CHAIN).
GPU_MEMBERS = ["member-2", "member-3"]


@pytest.mark.lab_turn(alone=GPU_MEMBERS, shares=["offline"])
async def test_member_outage_withdraws_and_restores_capacity(
    lab: Lab, offline: KubeClient, tmp_path: Path, started: list[VkProcess]
) -> None:
    proc = federation_vk(lab, tmp_path, GPU_MEMBERS)
    started.append(proc)
    proc.start()
    await proc.wait_ready()

    async def gpus(want: int) -> dict[str, Any] | None:
        node = await _node(offline, proc.node)
        return node if node and node_vector(node)["gpu"] == want else None

    await eventually(lambda: gpus(240), timeout=30, what="all GPUs")
    stopping = time.monotonic()
    # The apiserver shuts down gracefully (it may take seconds to stop answering).
    await asyncio.to_thread(lab_mod.stop_cluster, lab.state_dir, "member-3")
    try:
        stopped = time.monotonic()
        node = await eventually(lambda: gpus(160), timeout=60, what="member-3's T4s withdrawn")
        withdrawn = time.monotonic()
        # Withdrawn once the member has not answered for the grace: not before the grace less
        # one health probe interval after we began stopping it (its last answer came at most
        # that long before), and within the grace, the publish loop's 1 s tick and the slack
        # after it was down.
        assert withdrawn - stopping >= UNREACHABLE_GRACE - HEALTH_INTERVAL, withdrawn - stopping
        assert withdrawn - stopped < UNREACHABLE_GRACE + 1.0 + SLACK, withdrawn - stopped
        conditions = {c["type"]: c for c in node["status"]["conditions"]}
        assert conditions["Ready"]["status"] == "True"
        assert conditions["MembersReachable"]["status"] == "False"
        assert "member-3" in conditions["MembersReachable"]["message"]
    finally:
        await lab_mod.start_cluster(lab.state_dir, "member-3")
    node = await eventually(lambda: gpus(240), timeout=40, what="member-3's capacity restored")
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["MembersReachable"] == "True"


async def test_member_cluster_objects_added_and_removed_at_run_time(
    lab: Lab, offline: KubeClient, tmp_path: Path, started: list[VkProcess]
) -> None:
    await install_member_cluster_crd(offline)
    proc = federation_vk(lab, tmp_path, ["member-1"])
    started.append(proc)
    proc.start()
    await proc.wait_ready()

    async def gpus(want: int) -> bool:
        node = await _node(offline, proc.node)
        return bool(node and node_vector(node)["gpu"] == want)

    await eventually(lambda: gpus(0), timeout=30, what="only member-1 (no GPUs)")
    secret = {
        "metadata": {"name": f"member-2-{proc.node}", "namespace": "default"},
        "data": {"kubeconfig": base64.b64encode(lab.kubeconfig("member-2").read_bytes()).decode()},
    }
    await offline.create("/api/v1/namespaces/default/secrets", secret)
    member = {
        "apiVersion": "vkprovider.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": "member-2"},
        "spec": {"kubeconfigSecretRef": {"namespace": "default", "name": secret["metadata"]["name"]}, "weight": 2},
    }
    path = "/apis/vkprovider.io/v1alpha1/memberclusters"
    await offline.create(path, member)
    try:
        await eventually(lambda: gpus(160), timeout=30, what="member-2 added at run time")

        async def reported() -> dict[str, Any] | None:
            obj = await offline.get(f"{path}/member-2")
            conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
            return obj if conditions.get("Reachable") == "True" and obj["status"].get("capacity") else None

        obj = await eventually(reported, timeout=30, what="MemberCluster status")
        assert obj["status"]["capacity"]["gpusByModel"] == {"Tesla-V100-SXM2-32GB": 160}
        assert obj["status"]["lastContact"]

        # A Secret whose kubeconfig would run a program inside the provider is refused (issue 35).
        doc = yaml.safe_load(lab.kubeconfig("member-3").read_text())
        for entry in doc["users"]:
            entry["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/evil"}}
        plugin = {
            "metadata": {"name": f"member-3-{proc.node}", "namespace": "default"},
            "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(doc).encode()).decode()},
        }
        await offline.create("/api/v1/namespaces/default/secrets", plugin)
        evil = {**member, "metadata": {"name": "member-3"}}
        evil["spec"] = {"kubeconfigSecretRef": {"namespace": "default", "name": plugin["metadata"]["name"]}}
        await offline.create(path, evil)

        async def refused() -> dict[str, Any] | None:
            obj = await offline.get(f"{path}/member-3")
            found = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
            ready = found.get("Ready", {})
            return ready if ready.get("status") == "False" and ready.get("reason") == "InvalidSpec" else None

        ready = await eventually(refused, timeout=30, what="member-3 refused with InvalidSpec")
        assert "'/bin/evil' is not on the provider's allow list" in ready["message"], ready
        assert await gpus(160), "a refused member lends nothing"
        await offline.delete(f"{path}/member-3")

        await offline.patch(f"{path}/member-2", {"spec": {"enabled": False}})
        await eventually(lambda: gpus(0), timeout=30, what="member-2 disabled")
        await offline.patch(f"{path}/member-2", {"spec": {"enabled": True}})
        await eventually(lambda: gpus(160), timeout=30, what="member-2 enabled again")
    finally:
        await offline.delete(f"{path}/member-2")
    await eventually(lambda: gpus(0), timeout=30, what="member-2 removed at run time")
    assert proc.proc is not None and proc.proc.poll() is None  # no restart needed


def _summary_of(view_member: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "lent",
        "used",
        "free",
        "online",
        "nodes",
        "largest",
        "gpusByModel",
        "gpusTotalByModel",
        "networkPods",
        "numa",
    )
    return {k: view_member.get(k) for k in keys}


async def test_agent_mode_equals_direct_mode(lab: Lab, tmp_path: Path, started: list[VkProcess]) -> None:
    with capacity_agents(lab, lab.members, tmp_path) as addresses:
        direct = federation_vk(lab, tmp_path, lab.members)
        via_agent = federation_vk(lab, tmp_path, lab.members)
        via_agent.overrides["provider.federation"] = {
            "members": [{"name": m, "source": "agent", "agent_address": addresses[m]} for m in lab.members],
            "publish_interval": 0.2,
        }
        started.extend([direct, via_agent])
        direct.start()
        via_agent.start()
        await asyncio.gather(direct.wait_ready(), via_agent.wait_ready())
        member_1 = lab.kubeconfig("member-1")
        try:
            for share in (0.0, 0.3):
                await online.set_load(member_1, cpu_share=share, wait=True, name="agent-cmp")

                differences: list[Any] = []

                async def same(differences: list[Any] = differences) -> dict[str, Any] | None:
                    a, b = await direct.view(), await via_agent.view()
                    left = {m: _summary_of(v) for m, v in a["members"].items()}
                    right = {m: _summary_of(v) for m, v in b["members"].items()}
                    caps = (a["virtualNodes"][direct.node]["capacity"], b["virtualNodes"][via_agent.node]["capacity"])
                    differences[:] = [
                        (m, k, left[m][k], right.get(m, {}).get(k))
                        for m in left
                        for k in left[m]
                        if left[m][k] != right.get(m, {}).get(k)
                    ] + ([caps] if caps[0] != caps[1] else [])
                    return left if not differences and len(left) == 3 else None

                try:
                    summary = await eventually(same, timeout=30, what=f"agent and direct equal at {share:.0%}")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; differences (direct, agent): {differences}") from None
                assert summary["member-2"]["gpusByModel"] == {"Tesla-V100-SXM2-32GB": 160}
            view = await via_agent.view()
            assert all(m["source"] == "agent" and m["reachable"] for m in view["members"].values())
        finally:
            await online.set_load(member_1, cpu_share=0, wait=True, name="agent-cmp")


@pytest.mark.lab_turn(alone=GPU_MEMBERS, shares=["offline"])
async def test_one_virtual_node_per_member(
    lab: Lab, offline: KubeClient, tmp_path: Path, started: list[VkProcess]
) -> None:
    proc = federation_vk(lab, tmp_path, GPU_MEMBERS)
    proc.overrides["provider.federation"]["virtual_nodes"] = "per-member"
    started.append(proc)
    proc.start()
    await proc.wait_ready()
    names = {m: f"{proc.node}-{m}" for m in GPU_MEMBERS}

    async def all_nodes() -> dict[str, dict[str, Any]] | None:
        found = {m: await _node(offline, n) for m, n in names.items()}
        if any(n is None or node_vector(n)["pods"] == 0 for n in found.values()):
            return None
        return {m: n for m, n in found.items() if n is not None}

    nodes = await eventually(all_nodes, timeout=30, what="one virtual node per member")
    for member, node in nodes.items():
        async with lab.client(member) as client:
            expected = await expected_lendable(client)
        assert node_vector(node)["gpu"] == expected["gpu"]
        assert node["metadata"]["labels"]["vkprovider.io/member"] == member
    assert nodes["member-2"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
    assert nodes["member-3"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    for name in names.values():
        lease = await offline.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
        assert lease["spec"]["holderIdentity"] == name
