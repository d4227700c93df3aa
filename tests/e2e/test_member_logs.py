"""`kubectl logs` of a pod on the virtual node reads its member pod's log (issue 12, part 2):
through the front-end apiserver, our kubelet port, the member's `pods/log` and KWOK's log
server in the member, with the same answer as the member's own `kubectl logs` for every flag,
new lines while following, the end of its log once the member pod is deleted there (kept while
it terminated), and a clear message when nothing was kept."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e import binaries
from e2e import lab as lab_mod
from e2e.fixtures import Lab
from tests.e2e.helpers import eventually, make_namespace, pods
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_outages import member_pods, plain_pod, start_provider
from vkprovider.kube import KubeClient

#: Not member-1, so the test runs beside the reclaim chain (e2e.fixtures); alone there, as it
#: writes the member's KWOK container log.
MEMBER = "member-3"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(alone=[MEMBER], shares=["offline"]),
]


def append(log: Path, lines: list[str]) -> None:
    """Lines in the CRI log format KWOK reads, stamped now."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with log.open("a") as out:
        out.writelines(f"{now} stdout F {line}\n" for line in lines)


def kubectl(lab: Lab, cluster: str, namespace: str) -> list[str]:
    return [str(binaries.ensure_all()["kubectl"]), "--kubeconfig", str(lab.kubeconfig(cluster)), "-n", namespace]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


async def test_kubectl_logs_of_a_member_pod_answer_as_the_member_does(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, [MEMBER])
    await start_provider(proc, 1)
    ns = await make_namespace(offline, f"logs-{uuid.uuid4().hex[:6]}")
    log = lab_mod.kwok_log_file(lab.state_dir, MEMBER)
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("talker", proc.node))

        async def running() -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            return items if items and items[0]["status"].get("phase") == "Running" else None

        await eventually(running, timeout=60, what="the pod running in the member")
        member_pod = (await member_pods(lab, MEMBER, ns))["talker"]["metadata"]
        append(log, [f"{ns} line {i}" for i in range(6)])
        front = [*kubectl(lab, "offline", ns), "logs", "talker"]
        member = [*kubectl(lab, MEMBER, member_pod["namespace"]), "logs", member_pod["name"]]
        for flags in (
            [],
            ["--tail", "3"],
            ["--timestamps", "--tail", "2"],
            ["-c", "work", "--tail", "1"],
            ["--since", "60s"],
            ["--since-time", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "--tail", "1"],
            ["--limit-bytes", "40"],
        ):
            ours, theirs = run(front + flags), run(member + flags)
            assert ours.returncode == 0, (flags, ours.stderr)
            assert ours.stdout == theirs.stdout, flags
            if flags == ["--tail", "3"]:
                assert ours.stdout.splitlines() == [f"{ns} line {i}" for i in (3, 4, 5)]

        follow = subprocess.Popen([*front, "-f", "--tail", "1"], stdout=subprocess.PIPE, text=True)
        try:
            assert follow.stdout is not None
            first = await asyncio.to_thread(follow.stdout.readline)
            assert first == f"{ns} line 5\n"
            for i in range(3):  # new lines keep arriving
                append(log, [f"{ns} later {i}"])
                got = await asyncio.wait_for(asyncio.to_thread(follow.stdout.readline), timeout=30)
                assert got == f"{ns} later {i}\n"
        finally:
            follow.kill()
            follow.wait()

        # The member pod deleted in the member (with its grace period): the end of its log is
        # read while it terminates and kept, so kubectl still prints it on the Failed pod.
        async with lab.client(MEMBER) as admin:
            path = f"/api/v1/namespaces/{member_pod['namespace']}/pods/{member_pod['name']}"
            await admin.delete(path, body={"gracePeriodSeconds": 5})

        async def failed() -> bool:
            items = await pods(offline, ns)
            return bool(items) and items[0]["status"].get("phase") == "Failed"

        await eventually(failed, timeout=60, what="the front-end pod failed")
        kept = run(front)
        assert kept.returncode == 0 and f"{ns} later 2" in kept.stdout, (kept.stdout[-300:], kept.stderr)

        # A restarted provider keeps no logs in memory: kubectl says no member holds the pod.
        proc.kill()
        await start_provider(proc, 1)
        gone = run(front)
        assert gone.returncode != 0 and "has no pod in any member" in gone.stderr, gone.stderr
    finally:
        await cleanup_and_stop(lab, offline, ns, proc)
