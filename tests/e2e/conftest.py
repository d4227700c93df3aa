"""Fixtures shared by the e2e tests (the lab itself comes from e2e.fixtures)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from e2e.fixtures import Lab
from vkprovider.kube import KubeClient


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    """A client of the lab's offline (front-end) cluster."""
    async with lab.client("offline") as client:
        yield client
