"""One-shot commands end on SIGTERM (vkprovider.cli._end_on_sigterm): as a container's first
process, a signal without a handler would be ignored and its pod's deletion would wait out the
grace period."""

from __future__ import annotations

import signal
import subprocess
import sys
import time


def test_a_one_shot_command_ends_on_sigterm_with_143() -> None:
    code = "import time, vkprovider.cli as cli\ncli._end_on_sigterm()\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert time.monotonic() - began < 10
