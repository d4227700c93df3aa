"""The virtual kubelet on the lab's front-end cluster with the in-memory provider: node and
lease, pods through their lifecycle, logs through the apiserver, deletion, restart safety and
leader election."""

from __future__ import annotations

import asyncio
import random
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from e2e import binaries, pki
from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace, pod, pods
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

TOLERATE = {"tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]}


def vk_pod(name: str, node: str, **kwargs: Any) -> dict[str, Any]:
    body = pod(name, **kwargs)
    body["spec"].update(TOLERATE)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


@pytest.fixture
def vk(lab: Lab, tmp_path: Path) -> Any:
    started: list[VkProcess] = []

    def make(node: str | None = None, **overrides: Any) -> VkProcess:
        proc = VkProcess(lab=lab, node=node or f"vk-{uuid.uuid4().hex[:6]}", workdir=tmp_path, overrides=overrides)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.ensure_stopped()


async def node_ready(client: KubeClient, name: str) -> str | None:
    try:
        node = await client.get(f"/api/v1/nodes/{name}")
    except NotFound:
        return None
    for cond in node.get("status", {}).get("conditions", []):
        if cond["type"] == "Ready":
            return str(cond["status"])
    return None


async def running(client: KubeClient, ns: str, count: int, selector: str | None = None) -> list[dict[str, Any]] | None:
    items = await pods(client, ns, selector)
    ok = [p for p in items if p.get("status", {}).get("phase") == "Running"]
    return items if len(ok) == count and len(items) == count else None


async def test_node_ready_lease_and_restart(offline: KubeClient, vk: Any) -> None:
    proc = vk()
    proc.start()
    await proc.wait_ready()
    started = time.monotonic()
    await eventually(lambda: _is(node_ready(offline, proc.node), "True"), timeout=5, what="node Ready")
    node = await offline.get(f"/api/v1/nodes/{proc.node}")
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet" and labels["kubernetes.io/role"] == "agent"
    assert node["spec"]["taints"] == [{"key": "virtual-kubelet.io/provider", "value": "memory", "effect": "NoSchedule"}]
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == proc.port
    assert time.monotonic() - started < 5
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{proc.node}"
    first = (await offline.get(lease_path))["spec"]["renewTime"]
    await eventually(lambda: _changed(offline, lease_path, first), timeout=15, what="lease renewed", interval=0.5)

    ns = await make_namespace(offline, f"rt-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("keep", proc.node))
        await eventually(lambda: running(offline, ns, 1), what="pod running")
        before = await offline.get(f"/api/v1/namespaces/{ns}/pods/keep")

        assert proc.stop() == 0
        stopped = time.monotonic()
        # The node stays Ready while its lease is valid (40 s, node-monitor grace 40 s) ...
        await asyncio.sleep(20)
        assert await node_ready(offline, proc.node) == "True"
        # ... and only then turns NotReady (Unknown: the controller manager stopped hearing from it).
        await eventually(
            lambda: _is_not(node_ready(offline, proc.node), "True"), timeout=60, interval=1, what="node NotReady"
        )
        assert time.monotonic() - stopped >= 38

        proc.start()
        await proc.wait_ready()
        await eventually(lambda: _is(node_ready(offline, proc.node), "True"), timeout=15, what="Ready again")
        after = await offline.get(f"/api/v1/namespaces/{ns}/pods/keep")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["phase"] == "Running"
        assert after["status"]["startTime"] == before["status"]["startTime"]
        assert proc.create_counts() == {before["metadata"]["uid"]: 1}
    finally:
        await delete_namespace(offline, ns)


async def _is(awaitable: Any, want: str) -> bool:
    return bool(await awaitable == want)


async def _is_not(awaitable: Any, want: str) -> bool:
    value = await awaitable
    return value is not None and value != want


async def _changed(client: KubeClient, path: str, first: str) -> bool:
    return bool((await client.get(path))["spec"]["renewTime"] != first)


async def test_deployment_scales_and_job_completes(offline: KubeClient, vk: Any) -> None:
    proc = vk()
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"scale-{uuid.uuid4().hex[:6]}")
    try:
        template = vk_pod("x", proc.node, labels={"app": "web"})
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 100,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
            },
        }
        await offline.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
        items = await eventually(lambda: running(offline, ns, 100, "app=web"), timeout=120, what="100 running")
        for item in items:
            status = item["status"]
            conditions = {c["type"]: c["status"] for c in status["conditions"]}
            assert conditions["Ready"] == conditions["ContainersReady"] == conditions["PodScheduled"] == "True"
            container = status["containerStatuses"][0]
            assert container["ready"] and container["restartCount"] == 0 and "running" in container["state"]
            assert status["podIP"] and status["hostIP"] == "127.0.0.1" and status["startTime"]
        await offline.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web", {"spec": {"replicas": 0}})
        await eventually(lambda: _count(offline, ns, "app=web", 0), timeout=120, what="scaled to 0")
        assert proc.provider_pods() == {} or await eventually(
            lambda: _provider_empty(proc), timeout=10, what="provider empty"
        )

        job_template = vk_pod("j", proc.node, annotations={"vkprovider.io/memory-run-seconds": "1"})
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "batch"},
            "spec": {
                "completions": 50,
                "parallelism": 50,
                "template": {
                    "metadata": {"annotations": job_template["metadata"]["annotations"]},
                    "spec": {**job_template["spec"], "restartPolicy": "Never"},
                },
            },
        }
        await offline.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)

        async def complete() -> bool:
            item = await offline.get(f"/apis/batch/v1/namespaces/{ns}/jobs/batch")
            return bool(item.get("status", {}).get("succeeded") == 50)

        await eventually(complete, timeout=120, what="job of 50 complete")
        done = [p for p in await pods(offline, ns) if p["metadata"].get("labels", {}).get("job-name") == "batch"]
        succeeded = [p for p in done if p["status"]["phase"] == "Succeeded"]
        assert len(succeeded) >= 50
        terminated = succeeded[0]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    finally:
        await delete_namespace(offline, ns)


async def _count(client: KubeClient, ns: str, selector: str, want: int) -> bool:
    return len(await pods(client, ns, selector)) == want


async def _provider_empty(proc: VkProcess) -> bool:
    return proc.provider_pods() == {}


def _kubectl() -> Path:
    return binaries.ensure_all()["kubectl"]


async def test_logs_through_the_apiserver_and_refused_callers(lab: Lab, offline: KubeClient, vk: Any) -> None:
    proc = vk(**{"provider.memory.log_interval": 0.2})
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"logs-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("talker", proc.node))
        await eventually(lambda: running(offline, ns, 1), what="pod running")
        await asyncio.sleep(1.0)
        kubectl = [str(_kubectl()), "--kubeconfig", str(lab.kubeconfig("offline")), "-n", ns]
        result = subprocess.run(
            [*kubectl, "logs", "talker", "--tail", "3"], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 3 and all(f"{ns}/talker/main line" in line for line in lines)

        follow = subprocess.Popen([*kubectl, "logs", "-f", "talker", "--tail", "1"], stdout=subprocess.PIPE, text=True)
        try:
            assert follow.stdout is not None
            got = [await asyncio.to_thread(follow.stdout.readline) for _ in range(4)]  # new lines keep arriving
            numbers = [int(line.rsplit(" ", 1)[-1]) for line in got]
            assert numbers == sorted(numbers) and numbers[-1] - numbers[0] == 3
        finally:
            follow.kill()
            follow.wait()

        url = f"https://127.0.0.1:{proc.port}/containerLogs/{ns}/talker/main"
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        async with aiohttp.ClientSession() as session:
            async with session.get(url, ssl=insecure) as resp:
                assert resp.status == 401
            nobody = _client_cert(lab, "nobody", tmp := proc.workdir)
            async with session.get(url, ssl=_with_cert(nobody)) as resp:
                assert resp.status == 403
                assert "nodes/proxy" in await resp.text()
            # The positive path for a plain user: RBAC on nodes/proxy lets the same request through.
            await _grant_nodes_proxy(offline, "log-reader")
            reader = _client_cert(lab, "log-reader", tmp)
            async with session.get(url + "?tailLines=1", ssl=_with_cert(reader)) as resp:
                assert resp.status == 200
                assert "talker/main line" in await resp.text()
            async with session.get(f"https://127.0.0.1:{proc.port}/exec/{ns}/talker/main", ssl=_with_cert(reader)) as r:
                assert r.status == 501
    finally:
        await delete_namespace(offline, ns)


def _client_cert(lab: Lab, user: str, directory: Path) -> tuple[Path, Path]:
    pki_dir = lab.state_dir / "clusters" / "offline" / "pki"
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    pair = pki.issue(pki.KeyPair(ca_key, ca_cert), user, client=True)  # type: ignore[arg-type]
    return pair.write(directory, f"client-{user}")


def _with_cert(pair: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pair[0]), str(pair[1]))
    return ctx


async def _grant_nodes_proxy(client: KubeClient, user: str) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"test-{user}"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"test-{user}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"test-{user}"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    for path, body in (
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
    ):
        try:
            await client.create(path, body)
        except Exception:
            pass


async def test_deletion_graceful_forced_and_slow(offline: KubeClient, vk: Any) -> None:
    proc = vk(**{"provider.memory.stop_seconds": 2.0})
    slow = vk(**{"provider.memory.latency": 1.0})
    proc.start()
    slow.start()
    await asyncio.gather(proc.wait_ready(), slow.wait_ready())
    ns = await make_namespace(offline, f"del-{uuid.uuid4().hex[:6]}")
    try:
        for name, node in (("graceful", proc.node), ("forced", proc.node), ("slow", slow.node)):
            body = vk_pod(name, node)
            body["spec"]["terminationGracePeriodSeconds"] = 30
            await offline.create(f"/api/v1/namespaces/{ns}/pods", body)
        await eventually(lambda: running(offline, ns, 3), timeout=30, what="3 pods running")

        started = time.monotonic()
        await offline.delete(f"/api/v1/namespaces/{ns}/pods/graceful")
        item = await offline.get(f"/api/v1/namespaces/{ns}/pods/graceful")
        assert item["metadata"]["deletionGracePeriodSeconds"] == 30
        await eventually(lambda: _gone(offline, ns, "graceful"), timeout=40, what="graceful pod removed")
        took = time.monotonic() - started
        assert 1.5 <= took < 30, took  # the provider stopped it in ~2 s; no need to wait out 30 s

        await offline.delete(f"/api/v1/namespaces/{ns}/pods/forced", params={"gracePeriodSeconds": 0})
        await eventually(lambda: _not_in_provider(proc, f"{ns}/forced"), timeout=20, what="forced pod gone in provider")

        await offline.delete(f"/api/v1/namespaces/{ns}/pods/slow")
        await eventually(lambda: _gone(offline, ns, "slow"), timeout=60, what="slow provider's pod removed")
        await eventually(lambda: _not_in_provider(slow, f"{ns}/slow"), timeout=20, what="slow pod gone in provider")
    finally:
        await delete_namespace(offline, ns)


async def _gone(client: KubeClient, ns: str, name: str) -> bool:
    try:
        await client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    except NotFound:
        return True
    return False


async def _not_in_provider(proc: VkProcess, key: str) -> bool:
    return key not in proc.provider_pods()


async def test_provider_failures_lost_and_evicted_pods(offline: KubeClient, vk: Any) -> None:
    proc = vk()
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"fail-{uuid.uuid4().hex[:6]}")
    try:
        refused = {"vkprovider.io/memory-fail-create": "backend has no room"}
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("retry", proc.node, annotations=refused))
        never = vk_pod("never", proc.node, annotations=refused)
        never["spec"]["restartPolicy"] = "Never"
        await offline.create(f"/api/v1/namespaces/{ns}/pods", never)
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("lost", proc.node))
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("evicted", proc.node))

        async def status_of(name: str, phase: str, reason: str) -> dict[str, Any] | None:
            item = await offline.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            status = item.get("status", {})
            return item if status.get("phase") == phase and status.get("reason") == reason else None

        item = await eventually(lambda: status_of("retry", "Pending", "ProviderFailed"), what="retry ProviderFailed")
        assert item["status"]["message"] == "backend has no room"
        await eventually(lambda: status_of("never", "Failed", "ProviderFailed"), what="never Failed")

        async def warned() -> bool:
            # The Event follows the status write; it may land a moment later.
            events = await offline.list(f"/api/v1/namespaces/{ns}/events")
            reasons = {(e["involvedObject"]["name"], e["reason"], e["type"]) for e in events["items"]}
            return ("retry", "ProviderCreateFailed", "Warning") in reasons

        await eventually(warned, timeout=10, what="a ProviderCreateFailed Warning Event")

        await eventually(lambda: _both_running(offline, ns), what="lost and evicted pods running")
        for name, action in (("lost", "lose"), ("evicted", "evict")):
            await offline.patch(
                f"/api/v1/namespaces/{ns}/pods/{name}",
                {"metadata": {"annotations": {"vkprovider.io/memory-action": action}}},
            )
        await eventually(lambda: status_of("lost", "Failed", "ProviderPodLost"), what="lost pod Failed")
        await eventually(lambda: status_of("evicted", "Failed", "Evicted"), what="evicted pod Failed")
        await asyncio.sleep(2)  # never re-created
        assert "lost" not in {k.split("/")[1] for k in proc.provider_pods()}
    finally:
        await delete_namespace(offline, ns)


async def _both_running(client: KubeClient, ns: str) -> bool:
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in await pods(client, ns)}
    return phases.get("lost") == "Running" and phases.get("evicted") == "Running"


async def test_kill_9_during_a_burst_never_duplicates_leaks_or_loses(offline: KubeClient, vk: Any) -> None:
    proc = vk(**{"provider.memory.startup_delay": 0.2})
    proc.start()
    await proc.wait_ready()
    rng = random.Random(20261129)
    limit = asyncio.Semaphore(50)
    ns = await make_namespace(offline, f"kill-{uuid.uuid4().hex[:6]}")
    try:
        for trial in range(10):
            names = [f"t{trial}-p{i:03d}" for i in range(200)]

            burst = asyncio.gather(*(_create_limited(offline, ns, vk_pod(n, proc.node), limit) for n in names))
            await asyncio.sleep(rng.uniform(0.1, 3.0))
            proc.kill()
            await burst
            proc.start()
            await proc.wait_ready(timeout=60)
            await eventually(lambda: running(offline, ns, 200), timeout=120, what=f"trial {trial}: 200 running")
            api = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await pods(offline, ns)}
            provider = {k.split("/", 1)[1]: uid for k, uid in proc.provider_pods().items() if k.startswith(ns + "/")}
            assert provider == api, f"trial {trial}: provider and API disagree"
            counts = proc.create_counts()
            assert all(counts.get(uid) == 1 for uid in api.values()), f"trial {trial}: a pod was created twice"
            await offline.delete(f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": 0})
            await eventually(lambda: _none_left(offline, ns, proc), timeout=60, what=f"trial {trial}: all gone")
    finally:
        await delete_namespace(offline, ns)


async def _create_limited(client: KubeClient, ns: str, body: dict[str, Any], limit: asyncio.Semaphore) -> None:
    async with limit:
        await client.create(f"/api/v1/namespaces/{ns}/pods", body)


async def _none_left(client: KubeClient, ns: str, proc: VkProcess) -> bool:
    return not await pods(client, ns) and not [k for k in proc.provider_pods() if k.startswith(ns + "/")]


async def test_leader_election_hands_over_without_double_writes(offline: KubeClient, vk: Any) -> None:
    node = f"vk-ha-{uuid.uuid4().hex[:6]}"
    election = {"leader_election.enabled": True, "leader_election.namespace": "default"}
    first = vk(node, **election)
    first.start()
    await first.wait_ready()
    # The standby shares the provider state (as two replicas share their backend) and the port.
    second = vk(node, **election)
    second.port = first.port
    second.start()
    await asyncio.sleep(5)
    assert second.proc is not None and second.proc.poll() is None
    assert await second.metric("vkprovider_leader") == 0
    assert await second.metric('vkprovider_api_calls_total{verb="PATCH"}') == 0  # the standby wrote nothing
    assert await second.metric('vkprovider_api_calls_total{verb="PUT"}') == 0

    ns = await make_namespace(offline, f"ha-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("before", node))
        await eventually(lambda: running(offline, ns, 1), what="pod running under the first leader")
        first.kill()
        killed = time.monotonic()
        took = await second.wait_ready(timeout=40)
        assert took < 15 + 5, took  # election lease 15 s, retry period 2 s
        assert time.monotonic() - killed < 20
        assert await node_ready(offline, node) == "True"
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("after", node))
        await eventually(lambda: running(offline, ns, 2), what="pods running under the new leader")
    finally:
        await delete_namespace(offline, ns)


async def _status_writes(client: KubeClient, ns: str, name: str, until: str) -> list[str]:
    """The phases of the pod's status writes that carry a host IP (the runtime's), in order,
    up to the first with phase `until`."""
    listed = await client.list(f"/api/v1/namespaces/{ns}/pods")
    rv = listed["metadata"]["resourceVersion"]
    phases: list[str] = []
    async for event in client.watch(f"/api/v1/namespaces/{ns}/pods", resource_version=rv, timeout_seconds=30):
        obj = event["object"]
        if event["type"] != "MODIFIED" or obj["metadata"].get("name") != name:
            continue
        if obj.get("status", {}).get("hostIP"):  # nobody else changes the pod after our first write
            phases.append(obj["status"]["phase"])
            if obj["status"]["phase"] == until:
                break
    return phases


async def test_a_pod_that_starts_at_once_is_reported_once(offline: KubeClient, vk: Any) -> None:
    """A new pod's first status write waits up to pods.status_settle (1 s) while it is Pending:
    one that runs within that time is written once, as Running; a slower one is shown Pending
    (with the host IP) first."""
    quick = vk(**{"provider.memory.startup_delay": 0.3})
    slow = vk(**{"provider.memory.startup_delay": 3.0})
    quick.start()
    slow.start()
    await asyncio.gather(quick.wait_ready(), slow.wait_ready())
    ns = await make_namespace(offline, f"settle-{uuid.uuid4().hex[:6]}")
    try:
        for proc, expected in ((quick, ["Running"]), (slow, ["Pending", "Running"])):
            name = f"p-{proc.node}"
            watching = asyncio.create_task(_status_writes(offline, ns, name, "Running"), name="test-watch/settle")
            await asyncio.sleep(0.3)
            await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod(name, proc.node))
            assert await asyncio.wait_for(watching, timeout=40) == expected
    finally:
        await delete_namespace(offline, ns)
