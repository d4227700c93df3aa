"""`vkprovider drain`: take this provider out of every member before it is uninstalled.

The chart's pre-delete hook runs it while the provider still runs, so our pods leave through the
reclaim path as they would for online load (checkpoint notice, then graceful deletion):

1. every MemberCluster is disabled: the provider drains it (federation.members.fleet) and the
   front-end pods end Failed, reason Reclaimed, with their Events;
2. it waits until no member holds a pod of this provider (its instance, of this front end);
3. reflected ConfigMaps, Secrets and Services of this provider are deleted in every member;
4. the MemberCluster objects are deleted, and the provider's finalizer taken off them (it keeps
   a deleted object until its drain is done, federation.members.objects.FINALIZER: here the
   drain is done, and once the provider is gone nobody else would take it off);
5. with `--deployment`, the provider is scaled to zero and its pods awaited, so nothing
   registers the virtual nodes again;
6. the virtual nodes and their Leases are deleted.

Members declared in the settings file (not as objects) cannot be disabled from outside the
process, and a member whose kubeconfig Secret cannot be read cannot be looked into: drain names
them and stops with an error before changing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from federation import labels
from federation.config import FederationConfig
from federation.members.objects import FINALIZER, access_from_secret, front_end_uid, release
from vkprovider.kube import ApiError, KubeClient, NotFound, load_kubeconfig
from vkprovider.kube.access import in_cluster
from vkprovider.settings import Settings

POLL = 1.0


class DrainError(Exception):
    """Drain cannot go on; the message says why and what to do."""


def _say(message: str) -> None:
    print(f"drain: {message}", flush=True)


async def _until(check: Callable[[], Awaitable[bool]], *, deadline: float, what: str) -> None:
    while not await check():
        if time.monotonic() > deadline:
            raise DrainError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


async def _registered(member: KubeClient, tenant: str) -> set[str]:
    """The member namespaces a tenant's providers made (its registry; empty if unreadable)."""
    try:
        return set(((await member.get(labels.tenant_registry(tenant))).get("data") or {}).keys())
    except ApiError:
        return set()


def virtual_nodes(settings: Settings, config: FederationConfig, members: list[str]) -> list[str]:
    if config.virtual_nodes == "pooled":
        return [settings.node.name]
    return [f"{settings.node.name}-{m}" for m in members]


async def drain(settings: Settings, *, deployment: str | None, timeout: float) -> None:
    config = FederationConfig.model_validate(settings.provider.federation)
    if config.members:
        declared = ", ".join(m.name for m in config.members)
        raise DrainError(
            f"members declared in the settings ({declared}) cannot be drained from outside; make them MemberClusters"
        )
    kubeconfig = settings.kube.kubeconfig
    access = load_kubeconfig(kubeconfig, context=settings.kube.context) if kubeconfig else in_cluster()
    deadline = time.monotonic() + timeout
    async with KubeClient(access, user_agent="vkprovider-drain") as front:
        owner = labels.Owner(settings.node.name, await front_end_uid(front))
        chosen = {"labelSelector": config.member_selector} if config.member_selector else None
        objects = (await front.list(labels.MEMBERS_PATH, params=chosen))["items"]
        names = [o["metadata"]["name"] for o in objects]
        _say(f"{len(names)} member(s): {', '.join(names) or '-'}")
        clients: dict[str, KubeClient] = {}
        try:
            unreadable: list[str] = []
            for obj in objects:
                try:
                    clients[obj["metadata"]["name"]] = KubeClient(await access_from_secret(front, obj))
                except (ApiError, ValueError) as exc:
                    unreadable.append(f"{obj['metadata']['name']} ({exc})")
            if unreadable:
                # Without them, "no member holds a pod of ours" could not be told from "we could
                # not look": stop before changing anything, as for members of the settings file.
                raise DrainError(
                    f"cannot read the credentials of member(s) {'; '.join(unreadable)}: no member was changed;"
                    " fix their kubeconfig Secrets and drain again, or delete those MemberClusters"
                    " yourself once nothing of this provider runs there"
                )
            selector = {"labelSelector": owner.selector()}
            # A tenant's credential may not list across the member (federation.tenancy.policy): its
            # pods and copies are looked for in the namespaces its registry names.
            scoped: dict[str, set[str]] = {}
            for obj in objects:
                name = obj["metadata"]["name"]
                tenancy = (obj.get("spec") or {}).get("tenancy")
                if tenancy and name in clients:
                    scoped[name] = await _registered(clients[name], tenancy.get("tenant", ""))

            def collections(name: str, plural: str) -> list[str]:
                if name not in scoped:
                    return [f"/api/v1/{plural}"]
                return [f"/api/v1/namespaces/{ns}/{plural}" for ns in sorted(scoped[name])]

            for name in names:
                await front.patch(f"{labels.MEMBERS_PATH}/{name}", {"spec": {"enabled": False}})
            _say("members disabled: our pods there get checkpoint notices, then go")

            async def members_empty() -> bool:
                for name, client in clients.items():
                    try:
                        for collection in collections(name, "pods"):
                            if (await client.list(collection, params=selector))["items"]:
                                return False
                    except ApiError:
                        return False  # unreachable now: cannot tell, keep waiting
                return True

            await _until(members_empty, deadline=deadline, what="our pods to leave every member")
            _say("no member holds a pod of ours")
            reflected = {"labelSelector": owner.selector({labels.REFLECTED: "true"})}
            for name, client in clients.items():
                for collection in [
                    c for plural in ("configmaps", "secrets", "services") for c in collections(name, plural)
                ]:
                    for item in (await client.list(collection, params=reflected))["items"]:
                        meta = item["metadata"]
                        plural = collection.rpartition("/")[2]
                        with contextlib.suppress(NotFound):
                            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}")
                _say(f"{name}: reflected objects deleted")
        finally:
            for client in clients.values():
                await client.close()
        for name in names:
            with contextlib.suppress(NotFound):
                await front.delete(f"{labels.MEMBERS_PATH}/{name}")
            if not await release(front, name):
                raise DrainError(f"MemberCluster {name} kept changing: its finalizer {FINALIZER} is still on it")
        if deployment:
            await _stop_deployment(front, deployment, deadline)
        for node in virtual_nodes(settings, config, names):
            with contextlib.suppress(NotFound):
                await front.delete(f"/api/v1/nodes/{node}")
            with contextlib.suppress(NotFound):
                await front.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
            _say(f"virtual node {node} deleted")


async def _stop_deployment(front: KubeClient, deployment: str, deadline: float) -> None:
    namespace, _, name = deployment.partition("/")
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    try:
        current = await front.get(path)
    except NotFound:
        return
    await front.patch(path, {"spec": {"replicas": 0}})
    labels: dict[str, Any] = ((current.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    async def gone() -> bool:
        return not (await front.list(f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}))[
            "items"
        ]

    await _until(gone, deadline=deadline, what=f"the provider's pods ({deployment}) to stop")
    _say(f"{deployment} scaled to zero")


def main(settings: Settings, *, deployment: str | None, timeout: float) -> int:
    try:
        asyncio.run(drain(settings, deployment=deployment, timeout=timeout))
    except DrainError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    except ApiError as exc:
        print(f"error: the API refused the drain: {exc}", flush=True)
        return 1
    _say("done")
    return 0
