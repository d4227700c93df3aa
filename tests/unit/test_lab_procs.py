"""The lab's process bookkeeping: a child counts as running from the moment `spawn` returns."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from e2e import procs


def test_a_child_is_alive_right_after_spawn(tmp_path: Path) -> None:
    # /proc/<pid>/cmdline can read empty just after spawn; CI once failed a lab start-up on it.
    # Many rounds because the window is small (about 2 % of spawns on a 2-core machine).
    for _ in range(200):
        pid = procs.spawn(["sleep", "30"], log_path=tmp_path / "sleep.log")
        try:
            assert procs.alive(pid, "sleep")
        finally:
            os.kill(pid, signal.SIGKILL)
        procs._children[pid].wait()
        assert not procs.alive(pid, "sleep")
        assert procs.exit_code(pid) == -signal.SIGKILL
