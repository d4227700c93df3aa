"""`kubectl exec` on a pod of the virtual node, through the real front-end apiserver (issue 12):
kubectl speaks WebSockets to the apiserver, which translates them to SPDY/3.1 toward our kubelet
port (the virtual node does not declare ExtendWebSocketsToKubelet). The in-memory provider runs
its built-in commands (vkprovider.minishell); the federation provider runs the command in the
member pod through the member's pods/exec."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import pty
import select
import struct
import subprocess
import termios
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_member_logs import kubectl
from tests.e2e.test_outages import member_pods, plain_pod, start_provider
from tests.e2e.test_runtime import running, vk_pod
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


def in_terminal(argv: list[str], rows: int = 40, cols: int = 120) -> str:
    """Run argv on a pseudo-terminal of that size; what it printed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    child = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the child
                break
            if not chunk:
                break
            out += chunk
    finally:
        child.wait(timeout=30)
        os.close(leader)
    return out.decode(errors="replace")


def exec_argv(lab: Lab, ns: str, *args: str) -> list[str]:
    return [*kubectl(lab, "offline", ns), "exec", *args]


@pytest.mark.shares_lab
async def test_kubectl_exec_streams_both_ways_and_reports_the_exit_code(lab: Lab, offline: KubeClient, vk: Any) -> None:
    proc = vk()
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"exec-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("shell", proc.node))
        await eventually(lambda: running(offline, ns, 1), what="pod running")

        said = subprocess.run(
            exec_argv(lab, ns, "shell", "--", "sh", "-c", "echo out; echo err >&2; exit 3"),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (said.returncode, said.stdout, said.stderr.splitlines()[0]) == (3, "out\n", "err"), said

        data = os.urandom(5 * 1024 * 1024)
        piped = subprocess.run(
            exec_argv(lab, ns, "-i", "shell", "--", "sha256sum"),
            input=data, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout.decode() == f"{hashlib.sha256(data).hexdigest()}  -\n"

        echoed = subprocess.run(
            exec_argv(lab, ns, "-i", "shell", "--", "cat"), input=data[:300_000], capture_output=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert echoed.returncode == 0 and echoed.stdout == data[:300_000], echoed.stderr

        missing = subprocess.run(
            exec_argv(lab, ns, "shell", "--", "nosuch"), capture_output=True, text=True, timeout=60, check=False
        )
        assert missing.returncode == 127 and "nosuch: not found" in missing.stderr, missing

        # Ten sessions at once.
        async def one(i: int) -> str:
            child = await asyncio.create_subprocess_exec(
                *exec_argv(lab, ns, "shell", "--", "echo", f"session-{i}"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(child.communicate(), timeout=60)
            return out.decode()

        outputs = await asyncio.gather(*(one(i) for i in range(10)))
        assert outputs == [f"session-{i}\n" for i in range(10)]

        # attach: the container's output as it is written (the simulated log, a line a second).
        attach = await asyncio.create_subprocess_exec(
            *kubectl(lab, "offline", ns), "attach", "shell",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert attach.stdout is not None
        first = await asyncio.wait_for(attach.stdout.readline(), timeout=30)
        assert first.decode().startswith(f"{ns}/shell/"), first
        attach.terminate()
        await attach.communicate()

        # A terminal: kubectl sends its size on the resize stream, the command sees it.
        said_tty = await asyncio.to_thread(in_terminal, exec_argv(lab, ns, "-it", "shell", "--", "stty", "size"))
        assert "40 120" in said_tty, said_tty
    finally:
        await delete_namespace(offline, ns)


@pytest.mark.shares_lab
async def test_kubectl_exec_runs_in_the_member_pod(lab: Lab, offline: KubeClient, tmp_path: Path) -> None:
    """A federation pod: the command runs in its member pod (the lab's KWOK runs it on this
    machine), through the member's pods/exec over a WebSocket."""
    proc = federation_vk(lab, tmp_path, ["member-1"])
    await start_provider(proc, 1)
    ns = await make_namespace(offline, f"mexec-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("worker", proc.node))
        await eventually(lambda: running(offline, ns, 1), timeout=60, what="the pod running in member-1")

        script = ["sh", "-c", "echo out; echo err >&2; exit 3"]
        said = subprocess.run(
            exec_argv(lab, ns, "worker", "--", *script), capture_output=True, text=True, timeout=60, check=False
        )
        # As the member's own kubectl says it: KWOK v0.8.0 reports a command's exit status as an
        # error message, not as a NonZeroExitCode status (a kubelet does; unit-tested), so both
        # exit 1 here.
        member_pod = (await member_pods(lab, "member-1", ns))["worker"]["metadata"]
        direct = subprocess.run(
            [*kubectl(lab, "member-1", member_pod["namespace"]), "exec", member_pod["name"], "--", *script],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert said.stdout == direct.stdout == "out\n"
        assert said.stderr.splitlines()[0] == direct.stderr.splitlines()[0] == "err"
        assert said.returncode == direct.returncode != 0 and "exit status 3" in said.stderr, said

        data = os.urandom(20 * 1024 * 1024)
        # KWOK v0.8.0 never closes a command's stdin (the member's own kubectl exec -i hangs
        # the same), so the command reads exactly the bytes sent instead of to the end.
        piped = subprocess.run(
            exec_argv(lab, ns, "-i", "worker", "--", "sh", "-c", f"head -c {len(data)} | sha256sum"),
            input=data, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout.decode().split()[0] == hashlib.sha256(data).hexdigest()

        # The lab's KWOK (v0.8.0, pkg/kwok/server/debugging_exec_other.go) races a tty command
        # both ends: it applies the first size while the command starts, and closes the pty as
        # soon as the command exits, dropping output its copier has not read yet (under load,
        # all of it: a shared run once saw nothing). So the command waits a moment both sides.
        sized = exec_argv(lab, ns, "-it", "worker", "--", "sh", "-c", "sleep 1; stty size; sleep 1")
        said_tty = await asyncio.to_thread(in_terminal, sized)
        assert "40 120" in said_tty, said_tty
    finally:
        # The provider deletes the member pod before it stops: an orphan left Running in member-1
        # would be counted against the next test's capacity.
        await cleanup_and_stop(lab, offline, ns, proc)
