"""Direct mode: one member's nodes, bound live pods and NodeResourceTopology objects, listed and
watched into a compact Inventory.

Only what capacity needs is kept (`federation.capacity.inventory`); pods are watched with a field
selector that leaves out finished ones. Watch expiry (410) relists, failures reconnect with
backoff, and `last_contact` tells how long ago the member last answered.

With a `pods` feed (the dispatcher's MemberPods), the pod watch has no selector and serves both:
live pods go to the inventory, our own pods (finished ones too) to the feed, so the member's
pods are watched once and each event decoded once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from federation.capacity.inventory import Inventory
from vkprovider import logs
from vkprovider.kube import ApiError, ClusterAccess, Gone, KubeClient, NotFound
from vkprovider.kube.relist import Expiries, Relist, Whole, relist
from vkprovider.podstatus import TERMINAL_PHASES

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
TOPOLOGIES = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
#: Live pods, bound or not: unbound online pods that wait for room are what reclaim serves.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class PodFeed(Protocol):
    """Where our own member pods go (federation.members.pods.MemberPods)."""

    def ours(self, pod: dict[str, Any]) -> bool: ...

    def relist(self) -> Relist: ...

    def event(self, kind: str, pod: dict[str, Any]) -> None: ...

    def failed(self, error: Exception) -> None: ...


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


class SharedPods:
    """One watch of all the member's pods, shared: live ones to the inventory, ours (finished
    ones too) to the feed."""

    def __init__(self, inventory: Inventory, feed: PodFeed) -> None:
        self.inventory, self.feed = inventory, feed

    def relist(self) -> Relist:
        """A fresh list of all the member's pods, in pages: each page to both."""
        live, ours = self.inventory.relist_pods(), self.feed.relist()

        def put(pod: dict[str, Any]) -> str:
            if not _finished(pod):  # what the inventory's own field selector would list
                live.put(pod)
            if self.feed.ours(pod):
                ours.put(pod)
            return ""  # the two inner relists keep the keys; this one needs none

        def done(seen: set[str]) -> None:
            live.done()
            ours.done()

        return Relist(put, done)

    def upsert(self, pod: dict[str, Any]) -> None:
        # A pod that finished leaves the inventory, as it left the field selector's set.
        if _finished(pod):
            self.inventory.delete_pod(pod)
        else:
            self.inventory.upsert_pod(pod)
        if self.feed.ours(pod):
            self.feed.event("MODIFIED", pod)

    def delete(self, pod: dict[str, Any]) -> None:
        self.inventory.delete_pod(pod)
        if self.feed.ours(pod):
            self.feed.event("DELETED", pod)


class MemberWatcher:
    def __init__(
        self,
        name: str,
        access: ClusterAccess,
        *,
        on_change: Callable[[], None],
        network_pod_label: str,
        owner: str | None = None,
        track_owners: bool = False,
        health_interval: float = 2.0,
    ) -> None:
        self.name = name
        self.access = access
        #: `owner`: whose pods are ours (a provider's own watch); `track_owners`: each provider's
        #: share kept apart (the capacity agent's, federation.agent.server).
        self.inventory = Inventory(network_pod_label=network_pod_label, owner=owner, track_owners=track_owners)
        self._on_change = on_change
        self._health_interval = health_interval
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        self.last_contact: float | None = None  # monotonic time of the last answer
        self._started = time.monotonic()
        self.last_contact_wall: float | None = None
        self.last_error: str | None = None
        self.client: KubeClient | None = None
        #: Set before `run` to watch the member's pods once for capacity and dispatch.
        self.pods: PodFeed | None = None
        self._log = logs.get("member-watch", cluster=name)

    def _contact(self) -> None:
        self.last_contact = time.monotonic()
        self.last_contact_wall = time.time()
        self.last_error = None

    def unreachable_for(self) -> float:
        """Seconds since the member last answered, or since watching began if it never has:
        a member is not "lost" merely because this process has just started."""
        since = self.last_contact if self.last_contact is not None else self._started
        return time.monotonic() - since

    async def _loop(
        self,
        kind: str,
        path: str,
        *,
        params: dict[str, str] | None,
        relisted: Callable[[], Relist | Whole],
        upsert: Callable[[dict[str, Any]], Any],
        delete: Callable[[dict[str, Any]], None],
        failed: Callable[[Exception], None] = lambda error: None,
    ) -> None:
        assert self.client is not None
        failures, expiries = 0, Expiries()
        while True:
            try:
                rv = expiries.listed(await relist(self.client, path, relisted(), params=params))
                self._contact()
                self._listed.add(kind)
                if self._listed >= {"nodes", "pods", "topologies"}:
                    self.synced.set()
                self._on_change()
                failures = 0
                while True:
                    async for event in self.client.watch(path, resource_version=rv, params=params):
                        self._contact()
                        obj = event["object"]
                        rv = expiries.delivered(obj.get("metadata", {}).get("resourceVersion", rv))
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            delete(obj)
                        else:
                            upsert(obj)
                        self._on_change()
            except Gone:
                await expiries.wait(self._log, kind=kind)
            except NotFound:
                # The resource type does not exist here (no NodeResourceTopology CRD): nothing
                # to watch, but the member is fine.
                self._listed.add(kind)
                if self._listed >= {"nodes", "pods", "topologies"}:
                    self.synced.set()
                await asyncio.sleep(60)
            except ApiError as exc:
                failures += 1
                failed(exc)
                self.last_error = f"{kind}: {exc.reason}: {exc.message[:200]}"
                self._on_change()
                await asyncio.sleep(min(5.0, 0.25 * 2**failures))

    async def _health(self) -> None:
        assert self.client is not None
        while True:
            try:
                await self.client.get("/readyz", params={"verbose": "false"})
                self._contact()
            except ApiError as exc:
                self.last_error = f"health: {exc.reason}: {exc.message[:200]}"
            self._on_change()
            await asyncio.sleep(self._health_interval)

    def _pods_loop(self) -> Coroutine[Any, Any, None]:
        inv = self.inventory
        if self.pods is None:
            return self._loop(
                "pods",
                PODS,
                params={"fieldSelector": LIVE_PODS},
                relisted=inv.relist_pods,
                upsert=inv.upsert_pod,
                delete=inv.delete_pod,
            )
        shared = SharedPods(inv, self.pods)
        return self._loop(
            "pods",
            PODS,
            params=None,
            relisted=shared.relist,
            upsert=shared.upsert,
            delete=shared.delete,
            failed=self.pods.failed,
        )

    async def run(self) -> None:
        self._started = time.monotonic()
        inv = self.inventory

        def delete_node(obj: dict[str, Any]) -> None:
            inv.delete_node((obj.get("metadata") or {}).get("name", ""))

        def delete_topology(obj: dict[str, Any]) -> None:
            inv.delete_topology((obj.get("metadata") or {}).get("name", ""))

        loops: dict[str, Coroutine[Any, Any, None]] = {
            "nodes": self._loop(
                "nodes",
                NODES,
                params=None,
                relisted=lambda: Whole(inv.replace_nodes),
                upsert=inv.upsert_node,
                delete=delete_node,
            ),
            "pods": self._pods_loop(),
            "topologies": self._loop(
                "topologies",
                TOPOLOGIES,
                params=None,
                relisted=lambda: Whole(inv.replace_topologies),
                upsert=inv.upsert_topology,
                delete=delete_topology,
            ),
            "health": self._health(),
        }
        async with KubeClient(self.access, user_agent=f"vkprovider-member/{self.name}", request_timeout=10) as client:
            self.client = client
            tasks = [asyncio.create_task(coro, name=f"member/{self.name}/{kind}") for kind, coro in loops.items()]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.client = None
