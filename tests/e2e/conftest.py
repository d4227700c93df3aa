"""Fixtures shared by the e2e tests (the lab itself comes from e2e.fixtures)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from e2e.fixtures import Lab
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    """A client of the lab's offline (front-end) cluster."""
    async with lab.client("offline") as client:
        yield client


@pytest.fixture
def vk(lab: Lab, tmp_path: Path) -> Iterator[Callable[..., VkProcess]]:
    """Make provider processes (memory provider unless told otherwise); all stopped at the end."""
    started: list[VkProcess] = []

    def make(node: str | None = None, **overrides: Any) -> VkProcess:
        proc = VkProcess(lab=lab, node=node or f"vk-{uuid.uuid4().hex[:6]}", workdir=tmp_path, overrides=overrides)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.ensure_stopped()
