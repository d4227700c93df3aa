"""The virtual kubelet on the lab's front-end cluster with the in-memory provider: node and
lease, pods through their lifecycle, logs through the apiserver, deletion, restart safety and
leader election."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
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

from e2e import audit, binaries
from e2e.fixtures import Lab
from tests.e2e.helpers import KILL_TRIALS, delete_namespace, eventually, make_namespace, pod, pods
from tests.e2e.kubeletport import client_cert, grant_nodes_proxy, with_cert
from tests.e2e.vk import VkProcess
from vkprovider.kube import AlreadyExists, KubeClient, NotFound

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


@pytest.mark.lab_turn(shares=["offline"])
async def test_node_ready_lease_and_restart(offline: KubeClient, vk: Any) -> None:
    """Node registration and lease; a stop leaves the node Ready and its pod Running, and a
    restart adopts the running pod without asking the provider to create it again.
    Timing is judged by the order of events and the configured intervals, not by stopwatches;
    the start-up speed is measured by bench/runtime_pods.py."""
    proc = vk()
    proc.start()
    await proc.wait_ready()
    await eventually(lambda: _is(node_ready(offline, proc.node), "True"), timeout=30, what="node Ready")
    node = await offline.get(f"/api/v1/nodes/{proc.node}")
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet" and labels["kubernetes.io/role"] == "agent"
    assert node["spec"]["taints"] == [{"key": "virtual-kubelet.io/provider", "value": "memory", "effect": "NoSchedule"}]
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == proc.port
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{proc.node}"
    first = (await offline.get(lease_path))["spec"]["renewTime"]
    # Renewed every lease_renew_interval (10 s); 30 s of slack for a busy machine.
    await eventually(lambda: _changed(offline, lease_path, first), timeout=40, what="lease renewed", interval=0.5)

    ns = await make_namespace(offline, f"rt-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("keep", proc.node))
        await eventually(lambda: running(offline, ns, 1), what="pod running")
        before = await offline.get(f"/api/v1/namespaces/{ns}/pods/keep")

        assert proc.stop() == 0
        # A stop (a rollout, say) leaves the node as it was: Ready, its lease held, the pod
        # Running. When it turns NotReady is kube-controller-manager's node-lifecycle grace, not
        # ours, and is not tested here.
        stopped = await offline.get(f"/api/v1/nodes/{proc.node}")
        ready = next(c for c in stopped["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
        assert (await offline.get(f"/api/v1/namespaces/{ns}/pods/keep"))["status"]["phase"] == "Running"

        proc.start()
        await proc.wait_ready()
        await eventually(lambda: _is(node_ready(offline, proc.node), "True"), timeout=30, what="Ready again")
        after = await offline.get(f"/api/v1/namespaces/{ns}/pods/keep")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["phase"] == "Running"
        assert after["status"]["startTime"] == before["status"]["startTime"]
        # One create call in all, in the first run: the restarted runtime did not ask again.
        assert proc.create_calls() == {before["metadata"]["uid"]: [(1, "created")]}
    finally:
        await delete_namespace(offline, ns)


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def _is(awaitable: Any, want: str) -> bool:
    return bool(await awaitable == want)


async def _is_not(awaitable: Any, want: str) -> bool:
    value = await awaitable
    return value is not None and value != want


async def _changed(client: KubeClient, path: str, first: str) -> bool:
    return bool((await client.get(path))["spec"]["renewTime"] != first)


@pytest.mark.lab_turn(shares=["offline"])
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
        try:
            await eventually(lambda: _count(offline, ns, "app=web", 0), timeout=120, what="scaled to 0")
        except AssertionError as exc:
            # Where the pods stopped tells whose turn it was: no deletionTimestamp is the
            # ReplicaSet controller's, one without the provider's grace-0 delete is ours.
            left = await pods(offline, ns, "app=web")
            marked = [p["metadata"]["name"] for p in left if p["metadata"].get("deletionTimestamp")]
            deployment_now = await offline.get(f"/apis/apps/v1/namespaces/{ns}/deployments/web")
            raise AssertionError(
                f"{exc}: {len(left)} left, {len(marked)} marked for deletion (e.g. {marked[:3]}); "
                f"deployment status {deployment_now.get('status')}; provider log:\n{proc.tail(40)}"
            ) from exc
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


@pytest.mark.lab_turn(shares=["offline"])
async def test_logs_through_the_apiserver_and_refused_callers(lab: Lab, offline: KubeClient, vk: Any) -> None:
    proc = vk(**{"provider.memory.log_interval": 0.2})
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"logs-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("talker", proc.node))
        await eventually(lambda: running(offline, ns, 1), what="pod running")
        kubectl = [str(_kubectl()), "--kubeconfig", str(lab.kubeconfig("offline")), "-n", ns]

        async def three_lines() -> list[str] | None:  # a line every 0.2 s: three once it has run 0.6 s
            result = await asyncio.to_thread(
                subprocess.run,
                [*kubectl, "logs", "talker", "--tail", "3"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            lines = result.stdout.splitlines()
            return lines if len(lines) == 3 else None

        lines = await eventually(three_lines, timeout=30, what="three log lines")
        assert all(f"{ns}/talker/main line" in line for line in lines), lines

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
            nobody = client_cert(lab, "nobody", tmp := proc.workdir)
            async with session.get(url, ssl=with_cert(nobody)) as resp:
                assert resp.status == 403
                assert "nodes/proxy" in await resp.text()
            # The positive path for a plain user: RBAC on nodes/proxy lets the same request through.
            await grant_nodes_proxy(offline, "log-reader")
            reader = client_cert(lab, "log-reader", tmp)
            async with session.get(url + "?tailLines=1", ssl=with_cert(reader)) as resp:
                assert resp.status == 200
                assert "talker/main line" in await resp.text()
            async with session.get(
                f"https://127.0.0.1:{proc.port}/exec/{ns}/talker/main?command=true", ssl=with_cert(reader)
            ) as r:
                assert r.status == 400 and "SPDY" in await r.text()  # exec needs an upgrade
            # A client that reaches the kubelet port with a WebSocket (v5) runs a command too.
            query = [("command", "echo"), ("command", "direct"), ("output", "1")]
            async with session.ws_connect(
                f"https://127.0.0.1:{proc.port}/exec/{ns}/talker/main",
                params=query, protocols=("v5.channel.k8s.io",), ssl=with_cert(reader),
            ) as ws:  # fmt: skip
                said = [message.data async for message in ws]
            assert b"".join(m[1:] for m in said if m[:1] == b"\x01") == b"direct\n", said
            async with session.get(
                f"https://127.0.0.1:{proc.port}/portForward/{ns}/talker", ssl=with_cert(reader)
            ) as r:
                assert r.status == 501  # the in-memory provider forwards no ports
                assert "does not forward ports" in await r.text()
    finally:
        await delete_namespace(offline, ns)


@pytest.mark.lab_turn(shares=["offline"])
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
        # Not before the provider stopped it (stop_seconds 2, a lower bound a busy machine only
        # lengthens), and without waiting out the 30 s grace (the bound is the grace itself).
        assert 1.5 <= took < 30, took

        await offline.delete(f"/api/v1/namespaces/{ns}/pods/forced", params={"gracePeriodSeconds": 0})
        await eventually(lambda: _not_in_provider(proc, f"{ns}/forced"), timeout=20, what="forced pod gone in provider")

        await offline.delete(f"/api/v1/namespaces/{ns}/pods/slow")
        await eventually(lambda: _gone(offline, ns, "slow"), timeout=60, what="slow provider's pod removed")
        await eventually(lambda: _not_in_provider(slow, f"{ns}/slow"), timeout=20, what="slow pod gone in provider")
    finally:
        await delete_namespace(offline, ns)


@pytest.mark.lab_turn(shares=["offline"])
async def test_a_deleted_pod_ends_failed_before_it_goes_so_its_job_replaces_it(offline: KubeClient, vk: Any) -> None:
    """As the kubelet does, a deleted pod is given a terminal phase before it goes: a Job that
    replaces a pod only once it has failed (podReplacementPolicy: Failed) counts it, drops its
    tracking finalizer (else the pod would stay Terminating for ever) and starts another."""
    proc = vk()
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"jobdel-{uuid.uuid4().hex[:6]}")
    try:
        template = vk_pod("x", proc.node)
        template["spec"]["restartPolicy"] = "Never"
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "work"},
            "spec": {"backoffLimit": 3, "podReplacementPolicy": "Failed", "template": {"spec": template["spec"]}},
        }
        await offline.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
        first = (await eventually(lambda: running(offline, ns, 1), timeout=30, what="the Job's pod running"))[0]
        name = first["metadata"]["name"]
        await offline.delete(f"/api/v1/namespaces/{ns}/pods/{name}")

        async def replaced() -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            names = {p["metadata"]["name"] for p in items}
            return items if name not in names and len(items) == 1 else None

        await eventually(replaced, timeout=30, what="the deleted pod gone and a replacement created")
        status = (await offline.get(f"/apis/batch/v1/namespaces/{ns}/jobs/work"))["status"]
        assert status.get("failed") == 1, status
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


@pytest.mark.lab_turn(shares=["offline"])
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
        lost = await eventually(lambda: status_of("lost", "Failed", "ProviderPodLost"), what="lost pod Failed")
        await eventually(lambda: status_of("evicted", "Failed", "Evicted"), what="evicted pod Failed")
        # Never re-created: two seconds on, the provider's record of every create call it
        # received (not one look at what it holds) has the lost pod's first create only.
        await asyncio.sleep(2)
        assert proc.create_calls()[lost["metadata"]["uid"]] == [(1, "created")]
        assert "lost" not in {k.split("/")[1] for k in proc.provider_pods()}
    finally:
        await delete_namespace(offline, ns)


async def _both_running(client: KubeClient, ns: str) -> bool:
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in await pods(client, ns)}
    return phases.get("lost") == "Running" and phases.get("evicted") == "Running"


@pytest.mark.lab_turn(shares=["offline"])
async def test_kill_9_during_a_burst_never_duplicates_leaks_or_loses(offline: KubeClient, vk: Any) -> None:
    proc = vk(**{"provider.memory.startup_delay": 0.2})
    proc.start()
    await proc.wait_ready()
    rng = random.Random(20261129)
    limit = asyncio.Semaphore(50)
    ns = await make_namespace(offline, f"kill-{uuid.uuid4().hex[:6]}")
    try:
        for trial in range(KILL_TRIALS):
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
            # Exactly one create call per pod over all runs: the runtime asks the provider
            # about a pod before creating it, so a restart never asks again for a pod the
            # backend already has (which the backend would accept silently).
            calls = proc.create_calls()
            repeated = {
                uid: calls.get(uid, [])
                for uid in api.values()
                if [outcome for _, outcome in calls.get(uid, [])] != ["created"]
            }
            assert not repeated, f"trial {trial}: pods not created exactly once: {repeated}"
            await offline.delete(f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": 0})
            await eventually(lambda: _none_left(offline, ns, proc), timeout=60, what=f"trial {trial}: all gone")
    finally:
        await delete_namespace(offline, ns)


async def _create_limited(client: KubeClient, ns: str, body: dict[str, Any], limit: asyncio.Semaphore) -> None:
    async with limit:
        await client.create(f"/api/v1/namespaces/{ns}/pods", body)


async def _none_left(client: KubeClient, ns: str, proc: VkProcess) -> bool:
    return not await pods(client, ns) and not [k for k in proc.provider_pods() if k.startswith(ns + "/")]


#: Everything the in-memory runtime uses except Leases, which the test grants per namespace so
#: it can take one replica's election Lease away while the replica keeps its other rights.
ALL_BUT_LEASES = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "vkprovider-test-all-but-leases"},
    "rules": [
        {
            "apiGroups": ["", "events.k8s.io", "certificates.k8s.io", "authentication.k8s.io", "authorization.k8s.io"],
            "resources": ["*"],
            "verbs": ["*"],
        }
    ],
}
LEASES = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "vkprovider-test-leases"},
    "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}],
}


async def _bind(client: KubeClient, user: str, role: str, namespace: str | None = None) -> str:
    name = f"{role}-{user}"
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    base = "/apis/rbac.authorization.k8s.io/v1"
    path = f"{base}/namespaces/{namespace}/rolebindings" if namespace else f"{base}/clusterrolebindings"
    await client.create(path, body)
    return f"{path}/{name}"


async def _replica_identity(lab: Lab, client: KubeClient, user: str, election_ns: str) -> tuple[Path, str]:
    """An audited user with the runtime's rights; returns its kubeconfig and the path of the
    binding that lets it hold the election Lease."""
    for role in (ALL_BUT_LEASES, LEASES):
        with contextlib.suppress(AlreadyExists):
            await client.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    await _bind(client, user, "vkprovider-test-all-but-leases")
    await _bind(client, user, "vkprovider-test-leases", "kube-node-lease")
    election = await _bind(client, user, "vkprovider-test-leases", election_ns)
    return audit.user_kubeconfig(lab.state, "offline", user), election


def _log_time(proc: VkProcess, event: str) -> float | None:
    """When the replica logged `event` (its JSON log's timestamp), if it did."""
    for line in proc.log_path.read_text().splitlines():
        if f'"event": "{event}"' in line or f'"event":"{event}"' in line:
            stamp = json.loads(line)["timestamp"]
            return _seconds(stamp)
    return None


# Judged by its own replicas' audited writes, so it shares the front end (beside the reclaim chain).
@pytest.mark.lab_turn(shares=["offline"])
@pytest.mark.long
async def test_leader_election_hands_over_without_double_writes(lab: Lab, offline: KubeClient, vk: Any) -> None:
    """Three replicas of one node, each with its own audited identity, judged by the front-end
    apiserver's audit log rather than by their own counters:
    - while the first leads and serves pods (creates, status writes, a deletion), the standby
      sends no write of any verb;
    - killed, the first is replaced; its pod keeps its UID and was created once;
    - the second, alive, loses its Lease (its right to the Lease is revoked, so renewals fail):
      it steps down and exits, and its last write lands before the third replica's first,
      while pods keep being created throughout the handover."""
    tag = uuid.uuid4().hex[:6]
    node = f"vk-ha-{tag}"
    election_ns = await make_namespace(offline, f"ha-el-{tag}")
    users = {r: f"ha-{r}-{tag}" for r in ("a", "b", "c")}
    identities = {r: await _replica_identity(lab, offline, u, election_ns) for r, u in users.items()}
    # A takeover waits lease_duration from the last renewal a standby saw; a deposed leader stops
    # renew_deadline after its last renewal: 10 s and 6 s leave it 4 s to be quiet before the
    # next writes (the defaults' 15 s and 10 s leave 5 s; a write in flight on a loaded machine
    # needs the room more than the test needs the seconds). Renewals every second.
    settings = {
        "leader_election.enabled": True,
        "leader_election.namespace": election_ns,
        "leader_election.lease_duration": 10.0,
        "leader_election.renew_deadline": 6.0,
        "leader_election.retry_period": 1.0,
    }

    def replica(r: str) -> VkProcess:
        proc: VkProcess = vk(
            node, **settings, **{"kube.kubeconfig": str(identities[r][0]), "leader_election.identity": users[r]}
        )
        proc.replica = r
        return proc

    first = replica("a")
    first.start()
    await first.wait_ready()
    # The standby shares the provider state (as two replicas share their backend) and the port.
    second = replica("b")
    second.port = first.port
    second.start()
    await eventually(lambda: _logged(second, "waiting for the leader lease"), timeout=30, what="standby waiting")

    ns = await make_namespace(offline, f"ha-{tag}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("before", node))
        short = vk_pod("short", node, annotations={"vkprovider.io/memory-run-seconds": "1"})
        short["spec"]["restartPolicy"] = "Never"
        await offline.create(f"/api/v1/namespaces/{ns}/pods", short)
        await eventually(lambda: _phase(offline, ns, "short", "Succeeded"), what="short pod Succeeded")
        await eventually(lambda: _phase(offline, ns, "before", "Running"), what="pod running under the first leader")
        await offline.delete(f"/api/v1/namespaces/{ns}/pods/short")
        await eventually(lambda: _gone(offline, ns, "short"), what="short pod deleted")
        before = await offline.get(f"/api/v1/namespaces/{ns}/pods/before")
        first.kill()
        handover = time.time()
        await second.wait_ready(timeout=60)

        records = audit.records(lab.state, "offline", users=set(users.values()))
        led = [r for r in records if r.user == users["a"] and r.is_write and r.received < handover]
        assert {r.resource for r in led} >= {"pods", "leases", "nodes"}, "the audit log misses the leader's writes"
        standby = [
            (r.verb, r.uri, r.code) for r in records if r.user == users["b"] and r.is_write and r.received < handover
        ]
        assert not standby, f"the standby wrote while the first replica led: {standby}"

        await eventually(lambda: _is(node_ready(offline, node), "True"), timeout=30, what="node Ready after handover")
        after = await offline.get(f"/api/v1/namespaces/{ns}/pods/before")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["startTime"] == before["status"]["startTime"]
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("after", node))
        await eventually(lambda: running(offline, ns, 2), what="pods running under the new leader")
        assert second.create_calls()[before["metadata"]["uid"]] == [(1, "created")]

        third = replica("c")
        third.port = first.port
        third.start()
        await eventually(lambda: _logged(third, "waiting for the leader lease"), timeout=30, what="third waiting")
        stop_churn = asyncio.Event()
        churn = asyncio.create_task(_churn(offline, ns, node, stop_churn), name="test/churn")
        try:
            await asyncio.sleep(1.5)  # pods created under the second leader before its Lease is lost
            await offline.delete(identities["b"][1])  # the second leader's right to its Lease
            revoked = time.time()
            code = await asyncio.to_thread(second.proc.wait, 60)  # type: ignore[union-attr]
            assert code != 0, "a replica that lost its Lease exits with an error"
            await third.wait_ready(timeout=60)
            await asyncio.sleep(1.5)  # and under the third
        finally:
            stop_churn.set()  # not cancel: a create cut off in flight may land uncounted
            created = await asyncio.gather(churn, return_exceptions=True)
        count = 2 + len(created[0]) if isinstance(created[0], list) else None
        assert count is not None and count > 2, f"the churn did not run: {created}"
        try:
            await eventually(lambda: running(offline, ns, count), timeout=60, what="every churned pod running")
        except AssertionError as failed:
            story = await _stragglers(offline, ns, count, [first, second, third])
            raise AssertionError(f"{failed}\n{story}") from None

        stepped_down = _log_time(second, "stepping down")
        assert stepped_down is not None and stepped_down >= revoked, second.tail()
        records = audit.records(lab.state, "offline", users=set(users.values()))
        second_writes = [r for r in records if r.user == users["b"] and r.is_write and r.succeeded]
        third_writes = [r for r in records if r.user == users["c"] and r.is_write]
        assert second_writes and third_writes
        last_second = max(r.completed for r in second_writes)
        first_third = min(r.received for r in third_writes)
        assert any(r.received > revoked for r in second_writes if r.resource == "pods"), "no write to judge"
        assert last_second < first_third, (
            f"double writes: the deposed leader wrote until {last_second:.3f}, the new one from {first_third:.3f}"
        )
        assert stepped_down < first_third
    finally:
        await delete_namespace(offline, ns)
        await delete_namespace(offline, election_ns)


async def _stragglers(client: KubeClient, ns: str, count: int, replicas: list[VkProcess]) -> str:
    """The pods not Running, and what each replica's log says of them: a failure's story."""
    lines = [
        f"{p.replica} {line}" for p in replicas if p.log_path.exists() for line in p.log_path.read_text().splitlines()
    ]
    items = await pods(client, ns)
    told = [f"{len(items)} pods, {count} expected"]
    for item in items:
        name, status = item["metadata"]["name"], item.get("status", {})
        if status.get("phase") == "Running":
            continue
        told.append(f"{name}: {status.get('phase')} {status.get('reason', '')} {status.get('conditions', [])}")
        told.extend(f"  {line}" for line in lines if f"/{name}" in line or f'"{name}"' in line)
    return "\n".join(told)


async def _logged(proc: VkProcess, event: str) -> bool:
    return proc.log_path.exists() and _log_time(proc, event) is not None


async def _phase(client: KubeClient, ns: str, name: str, phase: str) -> bool:
    item = await client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return bool(item.get("status", {}).get("phase") == phase)


async def _churn(client: KubeClient, ns: str, node: str, stop: asyncio.Event) -> list[str]:
    """Create a pod every half second until `stop` is set; the names created."""
    names: list[str] = []
    while not stop.is_set():
        name = f"churn-{len(names):03d}"
        await client.create(f"/api/v1/namespaces/{ns}/pods", vk_pod(name, node))
        names.append(name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return names


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
    (with the host IP) first. The slow one's Running, a change the provider reported after the
    first write, is timed in vkprovider_status_lag_seconds."""
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

        # Observed once the status write has returned, which the watch above can see first.
        async def lagged() -> float | None:
            lag = await slow.metric("vkprovider_status_lag_seconds_count")
            return lag if lag >= 1 else None

        await eventually(lagged, timeout=10, what="the Running write timed in vkprovider_status_lag_seconds")
    finally:
        await delete_namespace(offline, ns)


async def _first_writes(client: KubeClient, ns: str, count: int) -> dict[str, str]:
    """The phase of each pod's first status write that carries a host IP (the runtime's), for
    the first `count` pods written."""
    listed = await client.list(f"/api/v1/namespaces/{ns}/pods")
    rv = listed["metadata"]["resourceVersion"]
    first: dict[str, str] = {}
    async for event in client.watch(f"/api/v1/namespaces/{ns}/pods", resource_version=rv, timeout_seconds=40):
        obj = event["object"]
        if event["type"] == "MODIFIED" and obj.get("status", {}).get("hostIP"):
            first.setdefault(obj["metadata"]["name"], obj["status"]["phase"])
            if len(first) == count:
                break
    return first


@pytest.mark.lab_turn(shares=["offline"])
async def test_in_a_burst_a_pod_that_starts_within_the_burst_settle_is_reported_once(
    offline: KubeClient, vk: Any
) -> None:
    """More new pods waiting for their first status write than there are workers (a burst): each
    waits up to pods.status_settle_burst while Pending, so pods that start 3 s after their
    create (beyond the 1 s settle) are first written as Running, with no Pending write before."""
    proc = vk(**{"provider.memory.startup_delay": 3.0, "pods.workers": 2})
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"burst-{uuid.uuid4().hex[:6]}")
    names = [f"p-{i:02d}" for i in range(12)]
    try:
        watching = asyncio.create_task(_first_writes(offline, ns, len(names)), name="test-watch/burst")
        await asyncio.sleep(0.3)
        await asyncio.gather(*(offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod(n, proc.node)) for n in names))
        first = await asyncio.wait_for(watching, timeout=45)
        assert first == dict.fromkeys(names, "Running")
    finally:
        await delete_namespace(offline, ns)


async def _service_account_token(client: KubeClient, ns: str, name: str) -> str:
    await client.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    answer = await client.create(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", request)
    return str(answer["status"]["token"])


async def _grant_to_service_account(client: KubeClient, ns: str, name: str, subresources: list[str]) -> None:
    role: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"test-{ns}-{name}"},
        "rules": [{"apiGroups": [""], "resources": [f"nodes/{s}" for s in subresources], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"test-{ns}-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }
    await client.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    await client.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)


@pytest.mark.lab_turn(shares=["offline"])
async def test_kubelet_api_tokens_serving_certificate_stats_and_pods(lab: Lab, offline: KubeClient, vk: Any) -> None:
    """The kubelet API as clients other than kubectl logs meet it:
    - its serving certificate comes from a kubelet-serving CSR the cluster signed, so a client
      that trusts the cluster CA verifies it;
    - bearer tokens are authenticated by TokenReview and authorized by SubjectAccessReview:
      a service account's token with nodes/proxy and nodes/stats gets in, one without is 403,
      a made-up token 401;
    - /pods lists the node's pods and /stats/summary reports them, as metrics-server reads them
      (straight from the kubelet port with its token). The apiserver's node proxy cannot be
      used in the lab: it refuses to proxy to loopback addresses, which the lab's nodes have."""
    proc = vk()
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"kapi-{uuid.uuid4().hex[:6]}")
    try:
        csrs = await offline.list(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            params={"labelSelector": "vkprovider.io/serving-certificate=true"},
        )
        ours = [c for c in csrs["items"] if c["metadata"]["name"].startswith(f"vkprovider-serving-{proc.node}-")]
        assert len(ours) == 1, "one serving CSR per start"
        csr = ours[0]
        assert csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
        assert {c["type"] for c in csr["status"]["conditions"]} >= {"Approved"} and csr["status"].get("certificate")

        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("probe", proc.node, requests={"cpu": "2"}))
        await eventually(lambda: running(offline, ns, 1), what="pod running")
        api_pod = await offline.get(f"/api/v1/namespaces/{ns}/pods/probe")

        ca = lab.state_dir / "clusters" / "offline" / "pki" / "ca.crt"
        verified = ssl.create_default_context(cafile=str(ca))
        verified.check_hostname = False  # the certificate names the node and its InternalIP, not "127.0.0.1" as a host
        base = f"https://127.0.0.1:{proc.port}"
        allowed = await _service_account_token(offline, ns, "scraper")
        await _grant_to_service_account(offline, ns, "scraper", ["proxy", "stats", "metrics"])
        refused = await _service_account_token(offline, ns, "nobody")
        async with aiohttp.ClientSession() as session:

            async def get(path: str, token: str) -> tuple[int, str]:
                headers = {"Authorization": f"Bearer {token}"}
                async with session.get(base + path, ssl=verified, headers=headers) as resp:
                    return resp.status, await resp.text()

            status, body = await get("/pods", allowed)
            assert status == 200, body
            listed = {p["metadata"]["uid"]: p for p in json.loads(body)["items"]}
            assert listed[api_pod["metadata"]["uid"]]["status"]["phase"] == "Running"
            status, body = await get("/stats/summary", allowed)
            assert status == 200, body
            summary = json.loads(body)
            assert summary["node"]["nodeName"] == proc.node
            stats = {p["podRef"]["uid"]: p for p in summary["pods"]}
            probe = stats[api_pod["metadata"]["uid"]]
            assert probe["podRef"] == {"name": "probe", "namespace": ns, "uid": api_pod["metadata"]["uid"]}
            assert probe["cpu"]["usageNanoCores"] > 0
            status, body = await get("/pods", refused)
            assert status == 403 and "nodes/proxy" in body, (status, body)
            status, body = await get("/stats/summary", refused)
            assert status == 403 and "nodes/stats" in body, (status, body)
            # The streaming endpoints are nodes/proxy too, refused before any upgrade.
            container = api_pod["spec"]["containers"][0]["name"]
            upgrade = {"Authorization": f"Bearer {refused}", "Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
            for path in (
                f"/exec/{ns}/probe/{container}?command=true&output=1",
                f"/attach/{ns}/probe/{container}?output=1",
                f"/portForward/{ns}/probe",
            ):
                async with session.post(base + path, ssl=verified, headers=upgrade) as resp:
                    body = await resp.text()
                    assert resp.status == 403 and 'cannot create resource "nodes/proxy"' in body, (path, body)
            status, _ = await get("/pods", "not-a-token")
            assert status == 401

            # A monitoring account (`get` on nodes/proxy, stats and metrics) reads what it scrapes
            # but cannot run anything: exec, attach and port-forward need `create`, whatever the
            # method of the upgrade (a WebSocket upgrade is a GET).
            for path in ("/stats/summary", "/metrics/resource"):
                status, body = await get(path, allowed)
                assert status == 200, (path, body)
            websocket = {
                "Authorization": f"Bearer {allowed}",
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Protocol": "v5.channel.k8s.io",
            }
            spdy = {"Authorization": f"Bearer {allowed}", "Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
            for path in (
                f"/exec/{ns}/probe/{container}?command=id&output=1",
                f"/attach/{ns}/probe/{container}?output=1",
                f"/portForward/{ns}/probe?ports=80",
            ):
                for method, headers in (("GET", websocket), ("POST", spdy)):
                    async with session.request(method, base + path, ssl=verified, headers=headers) as resp:
                        body = await resp.text()
                        assert resp.status == 403 and 'cannot create resource "nodes/proxy"' in body, (path, body)

    finally:
        await delete_namespace(offline, ns)
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NotFound):
                await offline.delete(f"/apis/rbac.authorization.k8s.io/v1/{kind}/test-{ns}-scraper")
