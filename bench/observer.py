"""A separate process that times pod phases for a benchmark: when each pod of a few streams
(cluster, namespace, label selector) was first seen in each phase.

Why a process of its own: a benchmark's own watches share one event loop with its load (the
creates, the deletes, the watches it settles on, of namespaces 10,000 pods big), so on a
saturated machine a status change can sit unread in that loop for seconds, and the round trip
it measures then holds the benchmark's own delay. Here each stream is narrowed by a label
selector to the pods being timed, and read by a process that does nothing else; the times are
CLOCK_MONOTONIC, the same clock as the parent's time.monotonic().

Run by `Observer` (the parent's side); `python -m bench.observer SPEC OUT` is the child: SPEC a
JSON list of streams, OUT where it writes {stream: {pod: {phase: time}}} when sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypedDict

from bench.endtoend import Phases
from vkprovider.kube import KubeClient, load_kubeconfig


class Stream(TypedDict):
    """One watch: `key` names a pod by its own name ("name") or by an annotation's value."""

    name: str
    kubeconfig: str
    namespace: str
    selector: str
    key: str


Seen = dict[str, dict[str, float]]


class Observer:
    """The parent's side: start the child on `streams`, wait until all its watches are open,
    and on `stop` collect what it saw."""

    def __init__(self, streams: list[Stream], workdir: Path) -> None:
        self.streams, self.workdir = streams, workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.out = workdir / "observer.json"

    async def __aenter__(self) -> Self:
        spec = self.workdir / "observer-spec.json"
        spec.write_text(json.dumps(self.streams))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.observer", str(spec), str(self.out), stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"bench.observer did not start: {line!r}")
        return self

    async def stop(self) -> dict[str, Seen]:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 60)
        seen: dict[str, Seen] = json.loads(self.out.read_text()) if self.out.exists() else {}
        return seen

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _name_of(key: str) -> Callable[[dict[str, Any]], str]:
    if key == "name":
        return lambda obj: str(obj["metadata"]["name"])
    return lambda obj: str((obj["metadata"].get("annotations") or {}).get(key, ""))


async def _child(streams: list[Stream], out: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        watches = {}
        for s in streams:
            client = await stack.enter_async_context(KubeClient(load_kubeconfig(Path(s["kubeconfig"]))))
            watches[s["name"]] = await stack.enter_async_context(
                Phases(client, s["namespace"], name_of=_name_of(s["key"]), selector=s["selector"])
            )
        print("ready", flush=True)
        await stop.wait()
        out.write_text(json.dumps({name: w.seen for name, w in watches.items()}))


if __name__ == "__main__":
    asyncio.run(_child(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])))
