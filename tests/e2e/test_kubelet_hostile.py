"""The kubelet port under clients that try to exhaust it (issue 35): one provider serves every
tenant of a front end, so one bad client must not take it down for all. The hostile clients
(e2e/hostile.py) reach the port directly over TLS; the well-behaved one is `kubectl exec`
through the real front-end apiserver, as users reach it. What is checked is what users see
(the exec answers, pods keep their status, the node its Lease) and what the provider holds (its
peak RSS from /proc, against the budget it was given), never how fast anything was."""

from __future__ import annotations

import asyncio
import collections
import datetime
import ssl
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e import hostile
from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace
from tests.e2e.kubeletport import client_cert, grant_nodes_proxy, with_cert
from tests.e2e.test_member_logs import kubectl
from tests.e2e.test_runtime import running, vk_pod
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

MIB = 1024 * 1024


def _exec_echo(lab: Lab, ns: str, word: str) -> subprocess.CompletedProcess[str]:
    argv = [*kubectl(lab, "offline", ns), "exec", "target", "--", "echo", word]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


async def _limits_hit(proc: VkProcess) -> dict[str, float]:
    names = ["header_timeout", "pending_per_address", "connections", "streams", "message_size", "sessions"]
    names += ["sessions_per_user", "frame_size"]
    counted = (await proc.scrape()).by_label("vkprovider_kubelet_limits_hit_total", "limit")
    return {n: counted.get(n, 0.0) for n in names}


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


async def _target_pod(offline: KubeClient, proc: VkProcess) -> str:
    ns = await make_namespace(offline, f"hostile-{uuid.uuid4().hex[:6]}")
    await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("target", proc.node))
    await eventually(lambda: running(offline, ns, 1), what="the target pod running")
    return ns


@pytest.mark.lab_turn(shares=["offline"])
async def test_clients_that_never_finish_their_headers_are_cut_and_exec_goes_on(
    lab: Lab, offline: KubeClient, vk: Any, tmp_path: Path
) -> None:
    proc = vk()  # the default limits: 10 s for TLS and headers, 64 unfinished per address
    proc.start()
    await proc.wait_ready()
    ns = await _target_pod(offline, proc)
    loop = asyncio.get_running_loop()
    try:
        anyone = ssl.create_default_context()  # no certificate: anyone who reaches the port
        anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
        target = hostile.Target(proc.port, ns, "target", "main", anyone, local="127.0.0.2")
        opened = loop.time()
        ended: list[float] = []

        async def stall() -> str:
            result = await hostile.stalled(target)
            ended.append(loop.time())
            return result

        stalls = [asyncio.create_task(stall(), name=f"stalled {i}") for i in range(300)]
        # Wait for the first refusals: the 64 the address may hold are then held.
        await eventually(lambda: _pending_refusals(proc), timeout=60, what="refusals beyond 64 per address")
        said = await asyncio.to_thread(_exec_echo, lab, ns, "through")
        exec_done = loop.time()
        assert (said.returncode, said.stdout) == (0, "through\n"), said
        results = await asyncio.wait_for(asyncio.gather(*stalls), timeout=60)
        assert results == ["closed"] * 300
        held_until = sorted(ended)[-64:]  # the 64 admitted, cut at the header deadline
        assert exec_done < held_until[0], "the exec waited for the stalled clients to go"
        assert held_until[-1] - opened <= 10.0 + 15.0, f"the last was cut {held_until[-1] - opened:.1f} s in"
        hits = await _limits_hit(proc)
        assert hits["header_timeout"] + hits["pending_per_address"] == 300, hits
        assert hits["header_timeout"] >= 64, hits
    finally:
        await delete_namespace(offline, ns)


async def _pending_refusals(proc: VkProcess) -> bool:
    return await proc.metric('vkprovider_kubelet_limits_hit_total{limit="pending_per_address"}') > 0


# Its own provider and node: it shares the front end (a storm at one kubelet's port is no
# trouble for the apiserver, as in a cluster where one node is attacked).
@pytest.mark.lab_turn(shares=["offline"])
async def test_a_hostile_mix_of_200_sessions_stays_within_the_budget_and_exec_goes_on(
    lab: Lab, offline: KubeClient, vk: Any, tmp_path: Path
) -> None:
    # 512 MiB hold 221 sessions at their worst; each identity may hold half. The 150 sessions
    # that stay open (50 big messages come and go) are all admitted, from two identities.
    budget = 512 * MIB
    proc = vk(
        **{
            "http.memory_budget_bytes": budget,
            "node.lease_renew_interval": 2.0,
            "node.lease_duration": 10,
        }
    )
    proc.start()
    await proc.wait_ready()
    assert proc.proc is not None
    pid = proc.proc.pid
    ns = await _target_pod(offline, proc)
    renewals = _LeaseWatch(offline, proc.node)
    tasks: list[asyncio.Task[str]] = []
    try:
        targets = []
        for user in ("tenant-hostile-a", "tenant-hostile-b"):
            await grant_nodes_proxy(offline, user)
            creds = with_cert(client_cert(lab, user, tmp_path))
            targets.append(hostile.Target(proc.port, ns, "target", "main", creds))
        assert _exec_echo(lab, ns, "before").returncode == 0
        baseline = _status_kib(pid, "VmRSS") * 1024
        renewals.start()
        tally = hostile.Tally()
        tasks, kinds = await hostile.mix(targets, per_kind=50, tally=tally)
        # Once every hostile session is in (or refused), the well-behaved client goes on.
        try:
            await eventually(lambda: _answered(tally), timeout=120, what="every hostile session answered")
        except AssertionError as exc:
            ended = collections.Counter(t.result() for t in tasks if t.done())
            raise AssertionError(f"{exc}: {tally}; ended {dict(ended)}; provider log:\n{proc.tail(30)}") from exc
        for i in range(3):
            said = await asyncio.to_thread(_exec_echo, lab, ns, f"during-{i}")
            assert (said.returncode, said.stdout) == (0, f"during-{i}\n"), said
        # Pod status keeps flowing: a pod created now runs, its status written by the provider.
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("newcomer", proc.node))
        await eventually(lambda: running(offline, ns, 2), timeout=60, what="a new pod running during the storm")
        # The storm lasts at least five renewals of the Lease (every 2 s) after all that.
        seen = renewals.count + 5
        await eventually(lambda: _renewed(renewals, seen), timeout=60, what="five more Lease renewals")
        stopped, tasks = tasks, []
        results = await hostile.stop(stopped)
        gaps = await renewals.stop()
        peak = _status_kib(pid, "VmHWM") * 1024
        by_kind: dict[str, dict[str, int]] = {}
        for task, result in zip(stopped, results, strict=True):
            kind = kinds[task.get_name()]
            by_kind.setdefault(kind, {})
            by_kind[kind][result.split(" (")[0]] = by_kind[kind].get(result.split(" (")[0], 0) + 1
        print(f"hostile results {by_kind}; RSS {baseline / MIB:.0f} MiB -> peak {peak / MIB:.0f} MiB; gaps {gaps}")
        assert peak - baseline <= budget, (
            f"RSS grew {(peak - baseline) / MIB:.0f} MiB over a {budget / MIB:.0f} MiB budget"
        )
        assert by_kind["big_message"].get("closed", 0) == 50, by_kind  # refused after the frame's header
        hits = await _limits_hit(proc)
        assert hits["message_size"] >= 1 and hits["streams"] >= 1, hits
        assert max(gaps, default=0.0) < 10.0, f"the node Lease went unrenewed for {max(gaps):.1f} s"
        assert (await asyncio.to_thread(_exec_echo, lab, ns, "after")).returncode == 0
    finally:
        await hostile.stop(tasks)
        await renewals.stop()
        await delete_namespace(offline, ns)


async def _answered(tally: hostile.Tally) -> bool:
    return tally.answered >= 200


async def _renewed(watch: _LeaseWatch, count: int) -> bool:
    return watch.count >= count


class _LeaseWatch:
    """The node Lease's renewals as they come: the gaps between renewTimes."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self._client, self._node = client, node
        self._times: list[datetime.datetime] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def count(self) -> int:
        return len(self._times)

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"lease watch {self._node}")

    async def _watch(self) -> None:
        # A watch, not polls: this process also runs the 200 hostile clients, and a poll it
        # makes late skips the renewals in between, reading as a gap the provider never had.
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        lease = await self._client.get(f"{path}/{self._node}")
        self._seen(lease)
        version = lease["metadata"]["resourceVersion"]
        params = {"fieldSelector": f"metadata.name={self._node}"}
        while True:  # the server may end a watch early: go on from the last version seen
            async for event in self._client.watch(path, resource_version=version, params=params):
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] == "MODIFIED":
                    self._seen(event["object"])

    def _seen(self, lease: dict[str, Any]) -> None:
        when = datetime.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))
        if not self._times or when != self._times[-1]:
            self._times.append(when)

    async def stop(self) -> list[float]:
        if self._task is None:
            return []
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return [round((b - a).total_seconds(), 2) for a, b in zip(self._times, self._times[1:], strict=False)]
