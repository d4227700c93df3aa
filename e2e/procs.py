"""Starting and stopping the lab's processes.

Processes run in their own session so they outlive the CLI that started them. A recorded PID is
trusted only while its command line still names the lab (`marker`), so a PID reused by an
unrelated process after a crash is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

#: Processes this Python process started: polled instead of reaped blindly, so their exit
#: status is kept for error messages.
_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn(argv: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    _children[proc.pid] = proc
    return proc.pid


def _reap(pid: int) -> None:
    """Collect `pid` if it is an ended child this process did not start through `spawn`."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int | None, marker: str) -> bool:
    """True while `pid` runs (not a zombie) and its command line contains `marker`."""
    if not pid:
        return False
    child = _children.get(pid)
    if child is not None:
        # Our own child: Popen knows. Reading /proc right after spawn can see an empty
        # cmdline (the exec is not visible yet), which once failed a lab start-up in CI.
        return child.poll() is None
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and marker in cmdline


def find(marker: str) -> list[int]:
    """PIDs of live processes whose command line contains `marker`, this process and its
    parent excepted (`python -m e2e up --state DIR` names the lab too)."""
    skip = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def exit_code(pid: int) -> int | None:
    """The exit status of a child that has ended, if this process started it and it has ended."""
    child = _children.get(pid)
    if child is not None:
        return child.poll()
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def terminate(pids: list[int], marker: str, *, grace: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace` seconds; returns the PIDs that were still running."""
    running = [pid for pid in pids if alive(pid, marker)]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid, marker) for pid in running):
        time.sleep(0.05)
    for pid in running:
        if alive(pid, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid, marker) for pid in running):
        time.sleep(0.05)
    return running


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:300] for line in text[-lines:])
