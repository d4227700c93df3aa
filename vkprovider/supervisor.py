"""Named, owned and stopped asyncio tasks.

A Supervisor starts each background task under a name, notices the first one that fails, and
stops them all within a bounded grace on shutdown: in-flight work is awaited, then cancelled,
and the first error is re-raised at the end (temporalio's worker does the same).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from vkprovider import logs


class Supervisor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._failed = asyncio.Event()
        self._first_error: BaseException | None = None
        self._log = logs.get("supervisor", supervisor=name)

    def start(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise RuntimeError(f"task {name} is already running")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}/{name}")
        task.add_done_callback(self._on_done)
        self._tasks[name] = task
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self._first_error is None:
                self._first_error = exc
                self._log.error("task failed", task=task.get_name(), error=repr(exc), exc_info=exc)
            self._failed.set()

    @property
    def first_error(self) -> BaseException | None:
        return self._first_error

    async def wait_failure(self) -> BaseException:
        await self._failed.wait()
        assert self._first_error is not None
        return self._first_error

    async def stop(self, grace: float, *, names: list[str] | None = None) -> None:
        """Cancel the named tasks (all by default) and wait up to `grace` seconds for them."""
        selected = [t for n, t in self._tasks.items() if names is None or n in names]
        for task in selected:
            task.cancel()
        if selected:
            _, pending = await asyncio.wait(selected, timeout=grace)
            for task in pending:
                self._log.warning("task did not stop within the grace", task=task.get_name())
        for name in [n for n, t in self._tasks.items() if t.done()]:
            del self._tasks[name]
