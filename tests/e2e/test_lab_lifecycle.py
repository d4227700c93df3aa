"""Bringing labs up and down, and what `up` does with bad input: one clear line, exit status 1,
and nothing left running of what it had started. Each starts a small lab of its own (its own
ports and state directory) beside the shared one, so they take no turn at it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import binaries, ports
from e2e.fixtures import Lab
from tests.e2e.helpers import lab_processes

pytestmark = pytest.mark.e2e


def _cli(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "e2e", *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[e2e]")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def real_binaries() -> dict[str, Path]:
    return binaries.ensure_all()


@pytest.mark.shares_lab
def test_up_then_down_leaves_no_process(tmp_path: Path) -> None:
    state = tmp_path / "small"
    result = _cli("up", "--members", "1", "--nodes-per-member", "2", "--state", state)
    assert result.returncode == 0, result.stderr
    assert "member-1" in result.stdout
    assert lab_processes(str(state))  # the lab really runs
    assert (state / "kubeconfig" / "offline.yaml").is_file()
    assert (state / "kubeconfig" / "member-1.yaml").is_file()
    status = _cli("status", "--state", state)
    assert status.returncode == 0 and "2/2" in status.stdout, status
    result = _cli("down", "--state", state)
    assert result.returncode == 0, result.stderr
    assert lab_processes(str(state)) == []


@pytest.mark.shares_lab
def test_up_on_a_busy_port_fails_cleanly(tmp_path: Path) -> None:
    base = ports.find_base(2)  # a block that is free now, so only our socket makes it busy
    port = base + ports.ETCD_PORTS  # the offline cluster's apiserver port
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        result = _cli("up", "--members", "1", "--nodes-per-member", "1", "--port-base", str(base), "--state", tmp_path)
    line = _one_line_error(result)
    assert f"port {port}" in line and "in use" in line
    assert lab_processes(str(tmp_path)) == []


@pytest.mark.shares_lab
def test_up_with_a_missing_binary_fails_cleanly(tmp_path: Path, real_binaries: dict[str, Path]) -> None:
    bin_dir = tmp_path / "bin"
    binaries.link_dir({k: v for k, v in real_binaries.items() if k != "kube-scheduler"}, bin_dir)
    result = _cli("up", "--members", "1", "--nodes-per-member", "1", "--bin-dir", bin_dir, "--state", tmp_path / "s")
    line = _one_line_error(result)
    assert "kube-scheduler" in line and "not found" in line
    assert lab_processes(str(tmp_path)) == []


@pytest.mark.shares_lab
def test_up_with_a_broken_binary_fails_cleanly(tmp_path: Path, real_binaries: dict[str, Path]) -> None:
    bin_dir = binaries.link_dir({k: v for k, v in real_binaries.items() if k != "kube-apiserver"}, tmp_path / "bin")
    broken = bin_dir / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'this kube-apiserver is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    state = tmp_path / "s"
    result = _cli("up", "--members", "1", "--nodes-per-member", "1", "--bin-dir", bin_dir, "--state", state)
    line = _one_line_error(result)
    assert "kube-apiserver exited during start-up" in line and "broken" in line
    # etcd had started before the apiserver failed: it must be gone too.
    assert lab_processes(str(state)) == []


@pytest.mark.shares_lab
def test_up_on_a_running_lab_fails_and_leaves_it_running(lab: Lab) -> None:
    before = sorted(lab_processes(str(lab.state_dir)))
    result = _cli("up", "--members", "1", "--state", lab.state_dir)
    line = _one_line_error(result)
    assert "already running" in line
    assert sorted(lab_processes(str(lab.state_dir))) == before
    assert os.path.exists(lab.state_dir / "state.json")
