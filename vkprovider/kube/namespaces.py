"""Namespaces that pods can be created in at once.

A namespace is not ready for pods when it exists: the ServiceAccount admission plugin refuses
them until the controller manager has created the namespace's service account, moments later.
That controller can lag by half a minute after its apiserver restarted (its watches back off),
so a missing `default` account is created here after a short wait, as the controller would.

An existing namespace is given the labels asked for when some differ (one merge patch), unless
the caller names a label that marks its own namespaces and this one lacks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import AlreadyExists, Forbidden, NotFound

NAMESPACES = "/api/v1/namespaces"

DEFAULT_ACCOUNT_WAIT = 2.0  # seconds the controller manager gets to create `default` itself


async def ensure_namespace(
    client: KubeClient,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    owned_by: str | None = None,
    service_account: str = "default",
    timeout: float = 15.0,
) -> bool:
    """Create namespace `name` with `labels` unless it exists, else give it those of `labels`
    it lacks or has otherwise (with `owned_by`, only if it carries that label as `labels` does:
    a namespace someone else made keeps its own), and wait for its service account; False if
    the account did not appear within `timeout` seconds."""
    body: dict[str, dict[str, object]] = {"metadata": {"name": name}}
    if labels:
        body["metadata"]["labels"] = labels
    try:
        await client.create(NAMESPACES, body)
    except AlreadyExists:
        if labels:
            await _relabel(client, name, labels, owned_by)
    return await wait_for_account(client, name, service_account, timeout=timeout)


async def wait_for_account(
    client: KubeClient, name: str, service_account: str = "default", *, timeout: float, forbidden_for: float = 0.0
) -> bool:
    """Wait for the namespace's service account (creating `default` after a short wait); False
    if it did not appear within `timeout` seconds. `forbidden_for`: seconds a refusal counts as
    "not yet" (a RoleBinding just created takes a moment to reach the apiserver's authorizer)."""
    started = time.monotonic()
    created = False
    while True:
        try:
            await client.get(f"/api/v1/namespaces/{name}/serviceaccounts/{service_account}")
            return True
        except Forbidden:
            if time.monotonic() - started > forbidden_for:
                raise
        except NotFound:
            waited = time.monotonic() - started
            if waited > timeout:
                return False
            if service_account == "default" and waited > DEFAULT_ACCOUNT_WAIT and not created:
                created = True
                with contextlib.suppress(AlreadyExists):
                    account = {"metadata": {"name": "default"}}
                    await client.create(f"/api/v1/namespaces/{name}/serviceaccounts", account)
                continue
        await asyncio.sleep(0.1)


async def _relabel(client: KubeClient, name: str, labels: dict[str, str], owned_by: str | None) -> None:
    try:
        current = (await client.get(f"{NAMESPACES}/{name}"))["metadata"].get("labels") or {}
    except NotFound:
        return  # deleted meanwhile: the service-account wait below tells
    if owned_by is not None and current.get(owned_by) != labels.get(owned_by):
        return
    changed = {k: v for k, v in labels.items() if current.get(k) != v}
    if changed:
        await client.patch(f"{NAMESPACES}/{name}", {"metadata": {"labels": changed}})
