"""Namespaces that pods can be created in at once.

A namespace is not ready for pods when it exists: the ServiceAccount admission plugin refuses
them until the controller manager has created the namespace's service account, moments later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import AlreadyExists, NotFound


async def ensure_namespace(
    client: KubeClient,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    service_account: str = "default",
    timeout: float = 15.0,
) -> bool:
    """Create namespace `name` unless it exists and wait for its service account; False if the
    account did not appear within `timeout` seconds."""
    body: dict[str, dict[str, object]] = {"metadata": {"name": name}}
    if labels:
        body["metadata"]["labels"] = labels
    with contextlib.suppress(AlreadyExists):
        await client.create("/api/v1/namespaces", body)
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.get(f"/api/v1/namespaces/{name}/serviceaccounts/{service_account}")
            return True
        except NotFound:
            if time.monotonic() > deadline:
                return False
        await asyncio.sleep(0.1)
