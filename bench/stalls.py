"""Hand profiling of event-loop stalls: runs `vkprovider.cli`, timing every callback the loop
runs and every garbage collection, and appends each one longer than $BENCH_STALLS_MS (20 by
default) to the file $BENCH_STALLS, one JSON object per line:
  - `{"at": t, "ms": d, "cpu_ms": c, "task": name, "coro": qualname, "stacks": {stack: n}}` for a
    callback (a task's step names its task; `coro` is where the task stopped after the step;
    `stacks` is where the time went: the main thread's stack sampled every 5 ms by a thread of
    its own while the callback ran, innermost frame last; `cpu_ms` is the CPU the loop's thread
    used meanwhile, so a step far longer than its CPU was the OS running other processes);
  - `{"at": t, "ms": d, "gc": generation, "collected": n}` for a collection.
`at` is the loop's clock (time.monotonic) when it began. The provider's /metrics say how late
its loop is (`vkprovider_event_loop_lag_seconds`); this says which task held it.

Used by the benches' Provider when BENCH_STALLS is set (bench.common). Timing each callback
costs about a microsecond, so CPU figures of such a run are a little high.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from typing import Any, TextIO

from vkprovider import cli


def _record(out: TextIO, entry: dict[str, Any]) -> None:
    out.write(json.dumps(entry) + "\n")
    out.flush()


class _Sampler:
    """Samples the main thread's stack while one callback runs longer than `threshold`."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.started: float | None = None  # the running callback's start, None between callbacks
        self.stacks: Counter[str] = Counter()
        self._main = threading.main_thread().ident
        threading.Thread(target=self._sample, name="stall-sampler", daemon=True).start()

    def _sample(self) -> None:
        while True:
            time.sleep(0.005)
            started = self.started
            if started is None or time.monotonic() - started < self.threshold / 2:
                continue
            frame = sys._current_frames().get(self._main or 0)
            names: list[str] = []
            while frame is not None and len(names) < 12:
                code = frame.f_code
                names.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}:{code.co_name}")
                frame = frame.f_back
            if self.started == started:
                self.stacks[";".join(reversed(names))] += 1

    def begin(self) -> float:
        self.stacks = Counter()
        self.started = time.monotonic()
        return self.started

    def end(self) -> dict[str, int]:
        self.started = None
        return dict(self.stacks.most_common(4))


def _watch_callbacks(out: TextIO, threshold: float) -> None:
    run = asyncio.events.Handle._run
    sampler = _Sampler(threshold)

    def timed(handle: asyncio.events.Handle) -> None:
        started, cpu = sampler.begin(), time.thread_time()
        try:
            run(handle)
        finally:
            took = time.monotonic() - started
            stacks = sampler.end()
            if took > threshold:
                callback = getattr(handle, "_callback", None)
                task = getattr(callback, "__self__", None)  # a task's step: its task
                if isinstance(task, asyncio.Task):
                    coro = task.get_coro()
                    where = {"task": task.get_name(), "coro": getattr(coro, "__qualname__", repr(coro))}
                else:
                    # Its name only: a repr can have side effects (aiohttp's ClientResponse
                    # caches its headers, None if read before the response has started).
                    where = {"callback": getattr(callback, "__qualname__", type(callback).__qualname__)}
                used = round((time.thread_time() - cpu) * 1000, 1)  # less than `ms`: the OS ran others
                _record(
                    out,
                    {"at": round(started, 3), "ms": round(took * 1000, 1), "cpu_ms": used, **where, "stacks": stacks},
                )

    asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]


def _watch_gc(out: TextIO, threshold: float) -> None:
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.monotonic()
            return
        took = time.monotonic() - began[0]
        if took > threshold:
            _record(
                out,
                {
                    "at": round(began[0], 3),
                    "ms": round(took * 1000, 1),
                    "gc": info["generation"],
                    "collected": info["collected"],
                },
            )

    gc.callbacks.append(timed)


def main() -> None:
    threshold = float(os.environ.get("BENCH_STALLS_MS", "20")) / 1000
    out = open(os.environ["BENCH_STALLS"], "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    _watch_callbacks(out, threshold)
    _watch_gc(out, threshold)
    sys.argv[0] = "vkprovider"
    sys.exit(cli.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
