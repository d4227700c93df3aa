"""Shared test set-up: the lab fixture, and a guard that fails tests which leave asyncio tasks
running behind them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

pytest_plugins = ["e2e.fixtures"]


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def _no_leftover_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    if leftover:
        for task in leftover:
            task.cancel()
        names = ", ".join(sorted(t.get_name() for t in leftover))
        pytest.fail(f"{request.node.nodeid} left asyncio tasks running: {names}")
