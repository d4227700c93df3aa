"""Where our pods may be in a member whose credential may not read across it (a tenant's):
the member namespaces its providers made, and our pods in them, one list and watch each.

A tenant may not list namespaces (other tenants' names are not its business), nor pods across
the member. So every namespace a tenant's provider makes is recorded in a registry first (a
ConfigMap in the tenant's home namespace, written by federation.tenancy.namespaces before any pod
goes there), and read back at start: a provider restarted finds every pod of its own, also in
namespaces no front-end pod maps to any more (orphans). Namespaces readied since are followed
as they come (`follow`). The set only grows: namespaces go when the tenant is offboarded.

A tenant's provider that may read pods across the member (direct reads) is fed by the member's
capacity watch instead; its scope still names the namespaces its copies may be in.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from vkprovider import logs
from vkprovider.kube import ApiError, KubeClient

if TYPE_CHECKING:
    from federation.members.pods import MemberPods

#: Seconds between attempts to read the registry.
RETRY = 5.0


class NamespaceScope:
    def __init__(self, *, registry: str) -> None:
        self.registry = registry  # the registry ConfigMap's path
        #: The namespaces our pods may be in: recorded, or readied by this run.
        self.namespaces: set[str] = set()
        self._pods: MemberPods | None = None
        self._client: KubeClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._unlisted: set[str] = set()  # namespaces of the first read not listed yet
        self._log = logs.get("member-scope", registry=registry)

    async def _recorded(self, client: KubeClient) -> set[str]:
        """The registry's namespaces; retried until it can be read (the pods are unknown till then)."""
        while True:
            try:
                found = await client.get(self.registry)
            except ApiError as exc:
                self._log.warning("namespace registry not readable", error=str(exc))
                await asyncio.sleep(RETRY)
                continue
            return set((found.get("data") or {}).keys())

    async def run(self, pods: MemberPods, client: KubeClient, *, watch: bool) -> None:
        """Read the registry, then (with `watch`) follow our pods in every namespace until cancelled."""
        self._pods = pods
        self.namespaces |= await self._recorded(client)
        if not watch:
            await asyncio.Event().wait()  # until cancelled: the capacity watch feeds the pods
        # From here on a namespace readied is followed at once; before, it is only recorded.
        self._unlisted = set(self.namespaces)
        self._client = client
        if not self._unlisted:
            pods.synced.set()
        try:
            for namespace in sorted(self.namespaces):
                self._start(namespace)
            await asyncio.Event().wait()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def follow(self, namespace: str) -> None:
        """A namespace readied for our pods: their list and watch there start now."""
        self.namespaces.add(namespace)
        if self._client is not None and self._pods is not None:
            self._start(namespace)

    def _start(self, namespace: str) -> None:
        if namespace in self._tasks or self._pods is None or self._client is None:
            return
        self._tasks[namespace] = asyncio.get_running_loop().create_task(
            self._watch(namespace), name=f"federation/pods/{self._pods.name}/{namespace}"
        )

    async def _watch(self, namespace: str) -> None:
        pods, client = self._pods, self._client
        assert pods is not None and client is not None
        await pods.list_and_watch(
            client,
            f"/api/v1/namespaces/{namespace}/pods",
            lambda: pods.relist_in(namespace),
            listed=lambda: self._listed(namespace, pods),
        )

    def _listed(self, namespace: str, pods: MemberPods) -> None:
        if namespace in self._unlisted:
            self._unlisted.discard(namespace)
            if not self._unlisted:  # each namespace known at the start listed once
                pods.synced.set()
