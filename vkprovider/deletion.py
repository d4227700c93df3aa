"""A pod's deletion on the provider's side: ask the provider to delete it, and tell whether it
is gone there, with the provider's last status of it (what the pod's terminal status is made of
when the provider saw it end). The API side (grace period, terminal status, the grace-0 delete)
stays with `vkprovider.pods`."""

from __future__ import annotations

from vkprovider.objects import Pod, PodStatus, split_key
from vkprovider.provider import PodLifecycle, ProviderNotFound


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
