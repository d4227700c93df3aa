"""A pod's deletion on the provider's side: ask the provider to delete it, and tell whether it
is gone there, with the provider's last status of it (what the pod's terminal status is made of
when the provider saw it end); and, once at start-up, deleting the provider's pods that no API
pod stands for any more. The API side (grace period, terminal status, the grace-0 delete) stays
with `vkprovider.pods`."""

from __future__ import annotations

import asyncio
from typing import Any

from vkprovider.objects import Pod, PodStatus, pod_key, split_key
from vkprovider.podstore import PodStore
from vkprovider.provider import PodLifecycle, ProviderError, ProviderNotFound


async def delete_in_provider(provider: PodLifecycle, key: str, pod: Pod) -> tuple[bool, PodStatus | None]:
    """(gone, last status): gone once the provider holds no pod of this name and UID. Raises
    ProviderError when the provider cannot tell."""
    namespace, name = split_key(key)
    uid = pod["metadata"].get("uid")
    remote = await provider.get_pod(namespace, name)
    if remote is None or remote["metadata"].get("uid") != uid:
        return True, None
    provided = remote.get("status")
    try:
        await provider.delete_pod(pod)
    except ProviderNotFound:
        return True, provided
    remote = await provider.get_pod(namespace, name)
    if remote is None or remote["metadata"].get("uid") != uid:
        return True, provided
    return False, remote.get("status")


async def delete_orphans(provider: PodLifecycle, cache: PodStore[Pod], listed: asyncio.Event, log: Any) -> None:
    """Once `listed` (the API's pods fully in `cache`): provider pods with no pod of the same UID."""
    await listed.wait()
    try:
        owned = await provider.list_pods()
    except ProviderError as exc:
        log.warning("start-up clean-up skipped: provider list failed", error=str(exc))
        return
    for pod in owned:
        key = pod_key(pod)
        if cache.uid(key) == pod["metadata"].get("uid"):
            continue
        log.info("deleting orphaned provider pod", pod=key, uid=pod["metadata"].get("uid"))
        try:
            await provider.delete_pod(pod)
        except ProviderNotFound:
            pass
        except ProviderError as exc:
            log.warning("orphan delete failed", pod=key, error=str(exc))
