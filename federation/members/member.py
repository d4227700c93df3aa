"""A member as the federation provider holds it: where its capacity comes from (direct watches,
its capacity agent, or nothing while its kubeconfig cannot be used), our pods there, and where
it stands (reachable, in an outage, draining). The set is federation.members.fleet's;
MemberCluster objects change it at run time (federation.members.objects).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from federation.capacity.inventory import Inventory
from federation.capacity.summary import CapacityPolicy, MemberCapacity, Summarizer
from federation.config import MemberConfig
from federation.members import outages
from federation.members.pods import MemberPods
from federation.members.tokens import TokenKeeper, TokenStore
from federation.members.watch import MemberWatcher
from vkprovider.kube import ClusterAccess
from vkprovider.kube.access import KubeconfigError


class CapacitySource(Protocol):
    """Where a member's inventory comes from: direct watches or the member's agent."""

    name: str

    @property
    def synced(self) -> asyncio.Event: ...

    def unreachable_for(self) -> float: ...

    @property
    def last_error(self) -> str | None: ...

    @property
    def last_contact_wall(self) -> float | None: ...

    @property
    def inventory(self) -> Inventory: ...

    def summarize(self, policy: CapacityPolicy) -> MemberCapacity: ...

    async def run(self) -> None: ...


class DirectSource:
    """Capacity from watching the member's apiserver."""

    def __init__(
        self,
        name: str,
        access: ClusterAccess,
        *,
        on_change: Callable[[], None],
        network_pod_label: str,
        owner: str | None = None,
    ) -> None:
        self.name = name
        self.watcher = MemberWatcher(
            name, access, on_change=on_change, network_pod_label=network_pod_label, owner=owner
        )
        self._summarizer = Summarizer(name)

    @property
    def synced(self) -> asyncio.Event:
        return self.watcher.synced

    @property
    def last_error(self) -> str | None:
        return self.watcher.last_error

    @property
    def last_contact_wall(self) -> float | None:
        return self.watcher.last_contact_wall

    def unreachable_for(self) -> float:
        return self.watcher.unreachable_for()

    @property
    def inventory(self) -> Inventory:
        return self.watcher.inventory

    def summarize(self, policy: CapacityPolicy) -> MemberCapacity:
        return self._summarizer.summarize(self.watcher.inventory, policy)

    async def run(self) -> None:
        await self.watcher.run()


class UnusableSource:
    """A member whose kubeconfig cannot be used (unreadable, unknown context, no such user): it
    lends nothing, says why as its last error (and is unreachable once the grace has passed),
    and reads the kubeconfig again now and then, handing the member over when it works."""

    def __init__(
        self,
        config: MemberConfig,
        error: str,
        *,
        load: Callable[[], ClusterAccess],
        usable: Callable[[ClusterAccess], None],
        retry_interval: float,
    ) -> None:
        self.name = config.name
        self._error = error
        self._load = load
        self._usable = usable
        self._retry_interval = retry_interval
        self._synced = asyncio.Event()  # never set: nothing is known of the member
        self._inventory = Inventory(network_pod_label=config.network_pod_label)
        self._started = time.monotonic()

    @property
    def synced(self) -> asyncio.Event:
        return self._synced

    def unreachable_for(self) -> float:
        return time.monotonic() - self._started

    @property
    def last_error(self) -> str | None:
        return self._error

    @property
    def last_contact_wall(self) -> float | None:
        return None

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def summarize(self, policy: CapacityPolicy) -> MemberCapacity:
        return Summarizer(self.name).summarize(self._inventory, policy)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._retry_interval)
            try:
                access = self._load()
            except KubeconfigError as exc:
                self._error = str(exc)
                continue
            # Not from inside this task: handing over replaces the member, and cancels us.
            asyncio.get_running_loop().call_soon(self._usable, access)
            return


@dataclass
class Member:
    config: MemberConfig
    source: CapacitySource
    from_object: bool = False
    task: asyncio.Task[None] | None = None
    pods: MemberPods | None = None  # our pods there (None: the member only lends, no kubeconfig)
    pods_task: asyncio.Task[None] | None = None
    #: A tenant member's token, renewed and watched for revocation (federation.members.tokens).
    keeper: TokenKeeper | None = None
    keeper_task: asyncio.Task[None] | None = None
    store: TokenStore | None = None  # where its token is kept (its kubeconfig Secret)
    summary: MemberCapacity | None = None
    reachable: bool = True
    outage: outages.Outage | None = None  # unreachable past the grace: since when, lost or not
    status_written: dict[str, Any] = field(default_factory=dict)
    #: Disabled or removed while our pods ran there: they leave through reclaim notices first.
    draining: bool = False
    removed: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    def inventory(self) -> Inventory | None:
        return self.source.inventory

    def view(self) -> dict[str, Any]:
        """This member in the resource view: settings, health and its latest summary."""
        entry: dict[str, Any] = {
            "enabled": self.config.enabled,
            "reachable": self.reachable,
            "source": self.config.source,
            "unreachableFor": None if self.reachable else round(self.source.unreachable_for(), 1),
            "lastError": self.source.last_error,
        }
        if self.summary is not None:
            entry.update(self.summary.to_json())
        if self.draining:
            entry["draining"] = True
        return entry

    @property
    def lends(self) -> bool:
        """Reachable, and its credential accepted: our pods can go there now."""
        return self.reachable and not (self.keeper is not None and self.keeper.rejected)

    @property
    def serves_pods(self) -> bool:
        """Our pods there are followed (and their status reported): enabled, or draining."""
        return self.pods is not None and (self.config.enabled or self.draining)
