"""Streams to member pods when things go wrong (issue 12): a reader that stops reading, a
member credential without `pods/exec`, and a member apiserver that dies under 20 sessions.
Each must end in a clear message and leave nothing behind: the provider's memory stays within a
bound, and its open sessions, event-loop tasks and sockets return to what they were."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from e2e import lab as lab_mod
from e2e.fixtures import Lab
from tests.e2e.helpers import eventually, make_namespace, service_account_kubeconfig
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_member_logs import kubectl
from tests.e2e.test_outages import plain_pod, start_provider
from tests.e2e.test_runtime import running
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: How much the provider's resident memory may grow while a reader stops reading a command that
#: writes without end (aiohttp's and our buffers are well under 4 MiB per session).
SLOW_READER_BOUND = 32 * 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def pid_of(proc: VkProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


async def start_worker(lab: Lab, offline: KubeClient, tmp_path: Path, member: str, **overrides: Any) -> Any:
    proc = federation_vk(lab, tmp_path, [member], **overrides)
    await start_provider(proc, 1)
    ns = await make_namespace(offline, f"sfault-{uuid.uuid4().hex[:6]}")
    await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("worker", proc.node))
    await eventually(lambda: running(offline, ns, 1), timeout=60, what=f"the pod running in {member}")
    return proc, ns


@pytest.mark.shares_lab
async def test_a_reader_that_stops_reading_does_not_grow_the_providers_memory(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc, ns = await start_worker(lab, offline, tmp_path, "member-1")
    try:
        before = rss(pid_of(proc))
        # 1 GiB of output, to a kubectl whose stdout nobody reads: its pipe fills, then every hop
        # back to the command must hold still.
        reader = await asyncio.create_subprocess_exec(
            *kubectl(lab, "offline", ns), "exec", "worker", "--", "head", "-c", str(1 << 30), "/dev/zero",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

        async def opened() -> bool:
            if reader.returncode is not None:
                _, err = await reader.communicate()
                bound = (await offline.get(f"/api/v1/namespaces/{ns}/pods/worker"))["spec"].get("nodeName", "")
                node = await offline.get(f"/api/v1/nodes/{bound}")
                raise AssertionError(
                    f"kubectl exec ended ({reader.returncode}): {err.decode()}; the pod is on {bound} (ours: "
                    f"{proc.node}, port {proc.port}), whose status says {node['status'].get('daemonEndpoints')}"
                )
            return bool(await proc.metric('vkprovider_stream_sessions{kind="exec"}') == 1.0)

        await eventually(opened, what="the session open")
        peak = 0
        for _ in range(10):  # 5 s
            await asyncio.sleep(0.5)
            peak = max(peak, rss(pid_of(proc)) - before)
        assert peak < SLOW_READER_BOUND, f"grew {peak} bytes while nobody read"
        print(f"slow reader: the provider grew by at most {peak / 2**20:.1f} MiB")
        # Taking 8 MiB, then stopping again, moves the stream on without growing either.
        assert reader.stdout is not None
        taken = 0
        while taken < 8 * 1024 * 1024:
            taken += len(await asyncio.wait_for(reader.stdout.read(1 << 20), timeout=30))
        for _ in range(4):  # 2 s of looks, as above: the worst of them is what counts
            await asyncio.sleep(0.5)
            peak = max(peak, rss(pid_of(proc)) - before)
        assert peak < SLOW_READER_BOUND, f"grew {peak} bytes after a partial read"
        reader.kill()
        await reader.communicate()  # drains the pipe: wait() alone waits for its end forever
        await eventually(
            lambda: _zero(proc.metric('vkprovider_stream_sessions{kind="exec"}')), what="the session closed"
        )

        # A client that goes away while the command waits on it (cat, whose stdin KWOK never
        # closes): the member session ends with it, it does not run on unheard.
        idle = await asyncio.create_subprocess_exec(
            *kubectl(lab, "offline", ns), "exec", "-i", "worker", "--", "cat",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert idle.stdin is not None and idle.stdout is not None
        idle.stdin.write(b"ping\n")
        assert await asyncio.wait_for(idle.stdout.readline(), timeout=30) == b"ping\n"
        idle.kill()
        await idle.communicate()
        await eventually(
            lambda: _zero(proc.metric('vkprovider_stream_sessions{kind="exec"}')), what="the abandoned session closed"
        )
    finally:
        await cleanup_and_stop(lab, offline, ns, proc)


async def _zero(value: Awaitable[float]) -> bool:
    return await value == 0.0


async def _everything_but_pods_exec(member: KubeClient) -> list[dict[str, Any]]:
    """RBAC rules for every resource of the member except pods/exec (RBAC has no deny)."""
    core = await member.get("/api/v1")
    names = sorted(r["name"] for r in core["resources"] if r["name"] != "pods/exec")
    groups = await member.get("/apis")
    return [
        {"apiGroups": [""], "resources": names, "verbs": ["*"]},
        {"apiGroups": [g["name"] for g in groups["groups"]], "resources": ["*"], "verbs": ["*"]},
    ]


@pytest.mark.lab_turn(shares=["offline", "member-2"])
async def test_a_member_credential_without_pods_exec_is_a_clear_error(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """The member refuses pods/exec to the provider's credential: kubectl says so at once, and
    the rest (here, logs) still works with that credential."""
    name = f"no-exec-{uuid.uuid4().hex[:6]}"
    kubeconfig = tmp_path / "member-2-no-exec.yaml"
    async with lab.client("member-2") as member:
        await member.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": name}})
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        await member.create(
            f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": await _everything_but_pods_exec(member)}
        )
        await member.create(
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
            },
        )
        await service_account_kubeconfig(lab, member, "member-2", "default", name, kubeconfig)
    proc, ns = None, None
    try:
        proc = federation_vk(lab, tmp_path, [])
        proc.overrides["provider.federation"]["members"] = [{"name": "member-2", "kubeconfig": str(kubeconfig)}]
        await start_provider(proc, 1)
        ns = await make_namespace(offline, f"sfault-{uuid.uuid4().hex[:6]}")
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("worker", proc.node))
        await eventually(lambda: running(offline, ns, 1), timeout=60, what="the pod running in member-2")

        said = await asyncio.create_subprocess_exec(
            *kubectl(lab, "offline", ns), "exec", "worker", "--", "true",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(said.communicate(), timeout=30)
        assert said.returncode != 0
        assert "member member-2 refuses pods/exec to this provider" in err.decode(), err
        logs = await asyncio.create_subprocess_exec(
            *kubectl(lab, "offline", ns), "logs", "worker", stdout=asyncio.subprocess.PIPE
        )
        await asyncio.wait_for(logs.communicate(), timeout=30)
        assert logs.returncode == 0
    finally:
        if proc is not None and ns is not None:
            await cleanup_and_stop(lab, offline, ns, proc)
        elif proc is not None:
            proc.ensure_stopped()
        async with lab.client("member-2") as member:
            rbac = "/apis/rbac.authorization.k8s.io/v1"
            for path in (
                f"{rbac}/clusterrolebindings/{name}",
                f"{rbac}/clusterroles/{name}",
                f"/api/v1/namespaces/default/serviceaccounts/{name}",
            ):
                with contextlib.suppress(NotFound):
                    await member.delete(path)


@pytest.mark.lab_turn(alone=["member-3"], shares=["offline"])  # member-3 stops
async def test_twenty_sessions_end_with_a_message_when_the_member_apiserver_dies(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc, ns = await start_worker(lab, offline, tmp_path, "member-3")
    pid = pid_of(proc)
    sessions = 'vkprovider_stream_sessions{kind="exec"}'
    children: list[asyncio.subprocess.Process] = []
    restarted = False
    try:
        tasks_before, sockets_before = await proc.metric("vkprovider_asyncio_tasks"), sockets(pid)
        argv = [*kubectl(lab, "offline", ns), "exec", "worker", "--", "sh", "-c", "echo started; sleep 600"]
        pipe = asyncio.subprocess.PIPE
        children += [await asyncio.create_subprocess_exec(*argv, stdout=pipe, stderr=pipe) for _ in range(20)]
        for child in children:
            assert child.stdout is not None
            assert await asyncio.wait_for(child.stdout.readline(), timeout=60) == b"started\n"
        assert await proc.metric(sessions) == 20

        await asyncio.to_thread(lab_mod.stop_cluster, lab.state_dir, "member-3")
        ended = await asyncio.wait_for(asyncio.gather(*(c.communicate() for c in children)), timeout=60)
        for child, (_, err) in zip(children, ended, strict=True):
            assert child.returncode != 0
            assert "the connection to the member ended before the command did" in err.decode(), err
        await eventually(lambda: _zero(proc.metric(sessions)), what="every session closed")

        await lab_mod.start_cluster(lab.state_dir, "member-3")
        restarted = True

        async def settled() -> tuple[float, int] | None:
            view = (await proc.view()).get("members", {}).get("member-3", {})
            tasks, open_sockets = await proc.metric("vkprovider_asyncio_tasks"), sockets(pid)
            if view.get("reachable") and tasks <= tasks_before + 3 and open_sockets <= sockets_before + 3:
                return tasks, open_sockets
            return None

        await eventually(settled, timeout=90, what=f"tasks and sockets back to {tasks_before} and {sockets_before}")
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
        if not restarted:
            with contextlib.suppress(lab_mod.LabError):
                await lab_mod.start_cluster(lab.state_dir, "member-3")
        await cleanup_and_stop(lab, offline, ns, proc)
