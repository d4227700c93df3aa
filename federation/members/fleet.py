"""The members the provider holds: started from the settings or from MemberCluster objects
(federation.members.objects), reconfigured, drained and removed at run time, and followed along
their outage clocks (federation.members.outages).

A member whose kubeconfig cannot be used is that member's error (logged, shown by `vkprovider
status`, the member unreachable), not the process's; the kubeconfig is read again every
`kubeconfig_retry` seconds. A member that is disabled or removed while our pods run there is
drained first: its pods leave through reclaim notices (federation.reclaim), and it goes once
none is left. A member added disabled (at start-up, after a restart in the middle of its drain)
is drained the same way first: watched as if enabled until no pod of ours is left there, then
kept without watches; the notices are annotations on the pods, so a resumed drain keeps their
deadlines. Where capacity comes from (direct watches, the member's agent) and how our pods
there are followed is handed in by the provider, which composes the features on top.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from federation import labels
from federation.capacity.summary import MemberCapacity
from federation.config import FederationConfig, MemberConfig
from federation.members import outages
from federation.members.member import CapacitySource, DirectSource, Member, UnusableSource
from federation.members.pods import MemberPods
from federation.members.tokens import TokenKeeper, TokenStore
from vkprovider import logs
from vkprovider.kube import ClusterAccess, load_kubeconfig
from vkprovider.kube.access import KubeconfigError
from vkprovider.kube.credentials import HeldToken
from vkprovider.objects import Pod

SourceFactory = Callable[[MemberConfig, ClusterAccess | None, Callable[[], None]], CapacitySource]


class Fleet:
    def __init__(
        self,
        config: FederationConfig,
        *,
        instance: str,
        new_source: SourceFactory,
        new_pods: Callable[[MemberConfig, ClusterAccess], MemberPods],
        on_reachability: Callable[[Member, outages.Outage | None], None],
    ) -> None:
        self.config = config
        self.members: dict[str, Member] = {}
        #: Set once the configured members are added and MemberCluster objects listed.
        self.started = asyncio.Event()
        #: How often the kubeconfig of a member that could not use it is read again.
        self.kubeconfig_retry = 30.0
        self._new_source = new_source
        self._new_pods = new_pods
        self._on_reachability = on_reachability  # (member, its outage before the change)
        self._node_set_callbacks: list[Callable[[], None]] = []
        self._removed_callbacks: list[Callable[[str], None]] = []
        self.dirty = asyncio.Event()
        #: When members stopped answering, as recorded before this process started (on the
        #: front-end pods: federation.members.outages.recorded_since); the outage clocks of a
        #: member that has not answered since count from there.
        self.recorded_outages: dict[str, float] = {}
        self._log = logs.get("federation", node=instance)

    # -- what the features read ------------------------------------------------------------------

    def serving(self) -> dict[str, Member]:
        """Members whose pods of ours are followed: enabled, or draining."""
        return {n: m for n, m in self.members.items() if m.serves_pods}

    def lending(self) -> dict[str, MemberCapacity]:
        """The latest summary of each reachable member."""
        return {n: m.summary for n, m in self.members.items() if m.summary is not None and m.lends}

    def outage_of(self, name: str) -> outages.Outage | None:
        return self.members[name].outage if name in self.members else None

    def draining(self, name: str) -> bool:
        return name in self.members and self.members[name].draining

    def unlisted(self) -> list[str]:
        """Members whose pods of ours are not listed yet (after a start, or while unreachable)."""
        return sorted(n for n, m in self.members.items() if m.pods is not None and not m.pods.synced.is_set())

    def states(self) -> list[tuple[str, bool, MemberCapacity | None]]:
        """(name, reachable, latest summary) of each enabled member, for the gauges."""
        return [(name, m.reachable, m.summary) for name, m in sorted(self.members.items()) if m.config.enabled]

    def view(self) -> dict[str, Any]:
        return {name: member.view() for name, member in sorted(self.members.items())}

    async def our_pods(self) -> list[Pod]:
        """Our member pods, as the front-end pods they run (this instance's only)."""
        out: list[Pod] = []
        for member in self.members.values():
            if member.pods is None:
                continue
            async for key, member_pod in member.pods.by_origin.walk():
                namespace, _, name = key.partition("/")
                uid = (member_pod["metadata"].get("labels") or {}).get(labels.ORIGIN_UID, "")
                out.append({"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}})
        return out

    def notify_node_set(self, callback: Callable[[], None]) -> None:
        self._node_set_callbacks.append(callback)

    def notify_drained_away(self, callback: Callable[[str], None]) -> None:
        """`callback(name)` once a removed member is drained and gone (its MemberCluster may
        let go of its finalizer: federation.members.objects)."""
        self._removed_callbacks.append(callback)

    def _node_set_changed(self) -> None:
        for callback in self._node_set_callbacks:
            callback()

    def changed(self) -> None:
        self.dirty.set()

    # -- adding, changing and removing members ---------------------------------------------------

    def add_configured_member(self, config: MemberConfig) -> None:
        """A member of the settings, reached with its kubeconfig file if it has one."""
        if config.kubeconfig is None:
            self.add_member(config, None)
            return
        path = config.kubeconfig

        def load() -> ClusterAccess:
            return load_kubeconfig(path, name=f"member {config.name}")

        try:
            access = load()
        except KubeconfigError as exc:
            self._log.error("member kubeconfig cannot be used", cluster=config.name, error=str(exc))
            self.remove_member(config.name, quiet=True)
            source = UnusableSource(
                config,
                str(exc),
                load=load,
                usable=lambda a: self._now_usable(config, a),
                retry_interval=self.kubeconfig_retry,
            )
            member = Member(config=config, source=source)
            self.members[config.name] = member
            member.task = asyncio.get_running_loop().create_task(source.run(), name=f"federation/member/{config.name}")
            self._node_set_changed()
            self.changed()
            return
        self.add_member(config, access)

    def _now_usable(self, config: MemberConfig, access: ClusterAccess) -> None:
        current = self.members.get(config.name)
        if current is None or not isinstance(current.source, UnusableSource) or current.config != config:
            return  # removed or replaced meanwhile
        self._log.info("member kubeconfig usable again", cluster=config.name)
        self.add_member(config, access)

    def add_member(
        self,
        config: MemberConfig,
        access: ClusterAccess | None,
        *,
        from_object: bool = False,
        store: TokenStore | None = None,
        removed: bool = False,
        settled: bool = False,
    ) -> None:
        """Start (or restart with new settings) one member; a tenant's token is kept renewed
        (and written back to `store`).

        A disabled member our pods can reach (`access`) may still run some of them: this process
        may not have seen it disabled (a restart in the middle of its drain, a member disabled
        while no provider ran). Unless `settled` (just drained), it is drained first, watched as
        if enabled; `_finish_drain` keeps it without watches once none of ours is left, after
        one list when there was none. `removed`: its MemberCluster is being deleted, so it goes
        once drained."""
        self.remove_member(config.name, quiet=True)
        drain_first = not config.enabled and not settled and access is not None
        watched = config.enabled or drain_first
        keeper = None
        if access is not None and config.tenancy is not None and watched:
            access, keeper = self._token_keeper(config, access, store)
        source = self._new_source(config, access, self.changed)
        member = Member(config=config, source=source, from_object=from_object, store=store, keeper=keeper)
        member.draining, member.removed = drain_first, drain_first and removed
        self.members[config.name] = member
        if watched:
            loop = asyncio.get_running_loop()
            if keeper is not None:
                member.keeper_task = loop.create_task(keeper.run(), name=f"federation/token/{config.name}")
            if access is not None:
                member.pods = self._new_pods(config, access)
                # A direct source watches the member's pods anyway: ours come from that watch.
                shared = False
                if isinstance(source, DirectSource):
                    source.watcher.pods, shared = member.pods, True
                member.pods_task = loop.create_task(
                    member.pods.run(watch=not shared), name=f"federation/pods/{config.name}"
                )
            member.task = loop.create_task(source.run(), name=f"federation/member/{config.name}")
        self._log.info(
            "member added", cluster=config.name, enabled=config.enabled, source=config.source, draining=drain_first
        )
        self._node_set_changed()
        self.changed()

    def _token_keeper(
        self, config: MemberConfig, access: ClusterAccess, store: TokenStore | None
    ) -> tuple[ClusterAccess, TokenKeeper | None]:
        """A tenant member reached with a service-account token: every client of it shares one
        token, renewed before it expires (federation.members.tokens); other credentials are
        used as they are."""
        held = access.credentials if isinstance(access.credentials, HeldToken) else None
        if held is None and access.token and access.credentials is None:
            held = HeldToken(access.token)
            access = dataclasses.replace(access, credentials=held)
        if held is None or config.tenancy is None:
            return access, None
        keeper = TokenKeeper(
            config.name,
            access,
            held,
            seconds=config.tenancy.token_seconds,
            renew_after=self.config.token_renew_after,
            probe_every=self.config.credential_probe_interval,
            store=store,
        )
        return access, keeper

    def remove_member(self, name: str, *, quiet: bool = False) -> None:
        member = self.members.pop(name, None)
        if member is None:
            return
        if member.task is not None:
            member.task.cancel()
        if member.pods_task is not None:
            member.pods_task.cancel()
        if member.keeper_task is not None:
            member.keeper_task.cancel()
        if not quiet:
            self._log.info("member removed", cluster=name)
            self._node_set_changed()
        self.changed()

    def reconfigure(self, member: Member, config: MemberConfig) -> None:
        """New settings for a member reached the same way (capacity, weights, reclaim, pod
        security): applied in place, watches and notices kept; member namespaces are
        relabelled before the next pod goes there."""
        member.config = config
        member.draining = member.removed = False
        self._node_set_changed()
        self.changed()

    def drain(self, member: Member, config: MemberConfig, *, removed: bool) -> bool:
        """Disable (or remove) a member whose pods must leave through notices first; False when
        none of ours runs there (it can go at once)."""
        if member.pods is None or (member.pods.synced.is_set() and not member.pods.by_origin):
            return False
        if member.draining and not member.config.enabled and (member.removed or not removed):
            member.config = config
            return True  # already draining so (each event of a deleted object comes here again)
        member.config = config
        member.draining = True
        member.removed = member.removed or removed
        member.summary = None
        self._log.info("draining member", cluster=member.name, pods=len(member.pods.by_origin), removed=removed)
        self._node_set_changed()
        self.changed()
        return True

    def stop(self) -> None:
        """Every member's tasks cancelled (the provider awaits its own)."""
        for name in list(self.members):
            self.remove_member(name, quiet=True)

    # -- where each member stands ----------------------------------------------------------------

    def refresh(self) -> None:
        """Each member's summary and outage state now; drained members finished."""
        for member in list(self.members.values()):
            if not member.config.enabled:
                member.summary = None
                if member.draining:
                    self._follow_outage(member)
                    self._finish_drain(member)
                continue
            self._follow_outage(member)
            if member.source.synced.is_set():
                member.summary = member.source.summarize(member.config.capacity.policy())
                member.summary.reachable = member.reachable

    def _follow_outage(self, member: Member) -> None:
        """Move the member along the two clocks; the provider hears of every step (its pods are
        re-synced: condition added, lost, or back)."""
        before = member.outage
        unreachable_for, recorded = member.source.unreachable_for(), None
        if member.source.last_contact_wall is None:  # not one answer since this process started
            recorded = self.recorded_outages.get(member.name)
            if recorded is not None:
                unreachable_for = max(unreachable_for, time.time() - recorded)
        member.outage = outages.follow(
            before,
            unreachable_for,
            grace=self.config.unreachable_grace,
            lost_after=self.config.pods_lost_after,
            recorded=recorded,
            from_restart=member.source.last_contact_wall is None and recorded is None,
        )
        member.reachable = member.outage is None
        was, now = (o.state if o is not None else "reachable" for o in (before, member.outage))
        if was == now:
            return
        self._log.warning("member reachability changed", cluster=member.name, state=now, was=was)
        self._on_reachability(member, before)

    def _finish_drain(self, member: Member) -> None:
        """A drained member (no pod of ours left) is removed, or kept disabled without watches."""
        pods = member.pods
        if pods is None or not pods.synced.is_set() or pods.by_origin:
            return
        self._log.info("member drained", cluster=member.name, removed=member.removed)
        if member.removed:
            self.remove_member(member.name)
            for callback in self._removed_callbacks:
                callback(member.name)
        else:
            self.add_member(
                member.config, pods.access, from_object=member.from_object, store=member.store, settled=True
            )
