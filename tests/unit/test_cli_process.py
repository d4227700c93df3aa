"""The command line's process: the event loop the settings name, and one-shot commands that end
on SIGTERM (vkprovider.cli._end_on_sigterm): as a container's first process, a signal without
a handler would be ignored, and its pod's deletion would wait out the grace period."""

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


def test_the_runtime_runs_on_the_event_loop_the_settings_name() -> None:
    """The standard library's loop by default (settings runtime.event_loop), uvloop on request."""
    import asyncio

    import uvloop

    from vkprovider.cli import loop_factory
    from vkprovider.settings import load

    async def which() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    for name, expected in (("uvloop", uvloop.Loop), ("asyncio", asyncio.SelectorEventLoop)):
        with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
            assert issubclass(runner.run(which()), expected), name
    assert load().runtime.event_loop == "asyncio"
