"""The federation provider: member clusters behind virtual nodes.

It owns the set of members (federation.members: from the settings, and from MemberCluster
objects changed at run time through federation.memberobjects), one capacity source per member
(direct watches, or the member's capacity agent), and when the virtual nodes' status is
published (federation.virtualnodes: what lends now, damped): coalesced, at most every
`publish_interval`. A member unreachable past `unreachable_grace` lends nothing and is flagged
on its MemberCluster and on the node, which stays Ready; its pods are declared lost only after
`pods_lost_after` (federation.outages). Pods go to members through federation.dispatch.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import Counter as PromCounter

from federation import labels
from federation.agent.client import AgentSource
from federation.capacity.nodes import VirtualNodes
from federation.capacity.summary import MemberCapacity
from federation.config import FederationConfig, MemberConfig
from federation.dispatch.dispatcher import Dispatcher
from federation.dispatch.jobstate import Job
from federation.dispatch.webhook import RoutingWebhook
from federation.members import outages
from federation.members.member import CapacitySource, DirectSource, Member, UnusableSource
from federation.members.objects import MemberObjects
from federation.members.pods import MemberPods
from federation.reclaim.reclaimer import Reclaimer, ReclaimMetrics
from federation.streams import exec as memberexec
from federation.streams import forward as memberforward
from federation.streams import logs as memberlogs
from federation.streams.session import StreamLimits
from federation.view.tide import FleetMetrics, GangMetrics, MemberState, Tide, TideMetrics
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ClusterAccess, KubeClient, load_kubeconfig
from vkprovider.kube.access import KubeconfigError
from vkprovider.objects import Pod, PodStatus
from vkprovider.podstore import PodStore
from vkprovider.provider import (
    ByteStream,
    ExecStreams,
    LogOptions,
    NodeStatus,
    PodChanged,
    ProviderError,
    ProviderNotFound,
)
from vkprovider.settings import SettingsError


class FederationProvider:
    def __init__(
        self,
        config: FederationConfig,
        *,
        node_name: str,
        source_factory: Callable[[MemberConfig, ClusterAccess | None, Callable[[], None]], CapacitySource]
        | None = None,
    ) -> None:
        self.config = config
        self.node_name = node_name
        self._stream_limits = StreamLimits(idle=config.streaming.idle_timeout, total=config.streaming.max_duration)
        self.tide = Tide.with_tiers(config.history.tiers, max_series=config.history.max_series)
        self._dashboard: bytes | None = None
        self.members: dict[str, Member] = {}
        self._node_set_callbacks: list[Callable[[], None]] = []
        self._dirty = asyncio.Event()
        self.nodes = VirtualNodes(
            node_name, self.members, per_member=config.virtual_nodes == "per-member", damping_hold=config.damping_hold
        )
        self._source_factory = source_factory or self._default_source
        self._client: KubeClient | None = None
        self._objects: MemberObjects | None = None  # from run(), if MemberCluster objects are followed
        self._pod_callbacks: list[PodChanged] = []
        self.dispatcher = Dispatcher(
            instance=node_name,
            members=lambda: {n: m for n, m in self.members.items() if m.serves_pods},
            capacities=lambda: {n: m.summary for n, m in self.members.items() if m.summary is not None and m.reachable},
            notify=self._pod_changed,
            outage=lambda name: self.members[name].outage if name in self.members else None,
            draining=lambda name: name in self.members and self.members[name].draining,
            virtual_nodes=self.node_names,
        )
        self.reclaimer = Reclaimer(
            members=lambda: {n: m for n, m in self.members.items() if m.serves_pods},
            instance=node_name,
        )
        self.orphans = outages.OrphanReconciler(
            members=lambda: {n: m for n, m in self.members.items() if m.serves_pods},
            node_of=self.nodes.node_of,
            interval=config.orphan_interval,
        )
        self.announcer = outages.Announcer(
            job_of_pod=lambda key: self.dispatcher.job_of_pod.get(key, ""),
            job_object=self.reclaimer.job_object,
            events=lambda: self.dispatcher.events,
        )
        #: Set once the configured members are added and MemberCluster objects listed.
        self.started = asyncio.Event()
        #: How often the kubeconfig of a member that could not use it is read again.
        self.kubeconfig_retry = 30.0
        self._log = logs.get("federation", node=node_name)

    # -- members ---------------------------------------------------------------------------------

    def _default_source(
        self, config: MemberConfig, access: ClusterAccess | None, on_change: Callable[[], None]
    ) -> CapacitySource:
        if config.source == "agent":
            return AgentSource(config, on_change=on_change)
        if access is None:
            raise ProviderError(f"member {config.name}: no kubeconfig")
        return DirectSource(config.name, access, on_change=on_change, network_pod_label=config.network_pod_label)

    def _changed(self) -> None:
        self._dirty.set()

    def add_configured_member(self, config: MemberConfig) -> None:
        """A member of the settings. A kubeconfig that cannot be used makes that member's error
        (logged, shown by `vkprovider status`, the member unreachable), not the process's."""
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
            self._changed()
            return
        self.add_member(config, access)

    def _now_usable(self, config: MemberConfig, access: ClusterAccess) -> None:
        current = self.members.get(config.name)
        if current is None or not isinstance(current.source, UnusableSource) or current.config != config:
            return  # removed or replaced meanwhile
        self._log.info("member kubeconfig usable again", cluster=config.name)
        self.add_member(config, access)

    def add_member(self, config: MemberConfig, access: ClusterAccess | None, *, from_object: bool = False) -> None:
        """Start (or restart with new settings) one member."""
        self.remove_member(config.name, quiet=True)
        source = self._source_factory(config, access, self._changed)
        member = Member(config=config, source=source, from_object=from_object)
        self.members[config.name] = member
        if config.enabled:
            loop = asyncio.get_running_loop()
            if access is not None:
                member.pods = MemberPods(
                    config.name,
                    access,
                    instance=self.node_name,
                    on_change=self._pod_changed,
                    fence=self._client.fence if self._client is not None else None,
                    on_disrupted=self.reclaimer.disrupted,
                    tombstones=self.dispatcher.tombstones,
                    on_listed=self.orphans.request,
                )
                # A direct source watches the member's pods anyway: ours come from that watch.
                shared = False
                if isinstance(source, DirectSource):
                    source.watcher.pods, shared = member.pods, True
                member.pods_task = loop.create_task(
                    member.pods.run(watch=not shared), name=f"federation/pods/{config.name}"
                )
            member.task = loop.create_task(source.run(), name=f"federation/member/{config.name}")
        self._log.info("member added", cluster=config.name, enabled=config.enabled, source=config.source)
        self._node_set_changed()
        self._changed()

    def remove_member(self, name: str, *, quiet: bool = False) -> None:
        member = self.members.pop(name, None)
        if member is None:
            return
        if member.task is not None:
            member.task.cancel()
        if member.pods_task is not None:
            member.pods_task.cancel()
        if not quiet:
            self._log.info("member removed", cluster=name)
            self._node_set_changed()
        self._changed()

    def _node_set_changed(self) -> None:
        for callback in self._node_set_callbacks:
            callback()

    def capacity_of(self, name: str) -> MemberCapacity | None:
        """The member's latest summary (the Python API placement uses)."""
        member = self.members.get(name)
        return member.summary if member else None

    # -- nodes -----------------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return self.nodes.names()

    def notify_node_set(self, callback: Callable[[], None]) -> None:
        self._node_set_callbacks.append(callback)

    async def node_status(self, node_name: str) -> NodeStatus:
        return self.nodes.status(node_name)

    def notify_node_status(self, callback: Callable[[str], None]) -> None:
        self.nodes.notify(callback)

    def _publish(self) -> None:
        """Recompute summaries and node status; notify nodes whose published status changed."""
        now = time.monotonic()
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
        self.nodes.publish(now)
        self.tide.observe(m.summary for m in self.members.values() if m.summary is not None)

    def _follow_outage(self, member: Member) -> None:
        """Move the member along the two clocks (federation.outages); its pods are re-synced
        at each step (condition added, lost, or back)."""
        before = member.outage
        member.outage = outages.follow(
            before,
            member.source.unreachable_for(),
            grace=self.config.unreachable_grace,
            lost_after=self.config.pods_lost_after,
        )
        member.reachable = member.outage is None
        was, now = (o.state if o is not None else "reachable" for o in (before, member.outage))
        if was == now:
            return
        if before is None and member.outage is not None and member.pods is not None:
            jobs = {key: entry.extra for key, entry in member.pods.by_origin.entries()}
            self.announcer.add(member.name, jobs, member.outage)
        self._log.warning("member reachability changed", cluster=member.name, state=now, was=was)
        keys = set(member.pods.by_origin) if member.pods is not None else set()
        keys |= {k for k, placed in self.dispatcher.placed.items() if placed == member.name}
        for key in keys:
            self._pod_changed(key)

    def _finish_drain(self, member: Member) -> None:
        """A drained member (no pod of ours left) is removed, or kept disabled without watches."""
        pods = member.pods
        if pods is None or not pods.synced.is_set() or pods.by_origin:
            return
        self._log.info("member drained", cluster=member.name, removed=member.removed)
        if member.removed:
            self.remove_member(member.name)
        else:
            self.add_member(member.config, pods.access, from_object=member.from_object)

    def reconfigure(self, member: Member, config: MemberConfig) -> None:
        """New settings for a member reached the same way (capacity, weights, reclaim, pod
        security): applied in place, watches and notices kept; member namespaces are
        relabelled before the next pod goes there."""
        member.config = config
        member.draining = member.removed = False
        self._node_set_changed()
        self._changed()

    def drain(self, member: Member, config: MemberConfig, *, removed: bool) -> bool:
        """Disable (or remove) a member whose pods must leave through notices first; False when
        none of ours runs there (it can go at once)."""
        if member.pods is None or (member.pods.synced.is_set() and not member.pods.by_origin):
            return False
        member.config = config
        member.draining = True
        member.removed = member.removed or removed
        member.summary = None
        self._log.info("draining member", cluster=member.name, pods=len(member.pods.by_origin), removed=removed)
        self._node_set_changed()
        self._changed()
        return True

    async def _publish_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=1.0)
            except TimeoutError:
                pass  # also re-check reachability and held increases once a second
            self._dirty.clear()
            self._publish()
            await self.announcer.flush()
            if self._objects is not None:
                await self._objects.write_statuses()
            await asyncio.sleep(self.config.publish_interval)

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, client: KubeClient) -> None:
        """Start the configured members, follow MemberCluster objects, publish capacity."""
        self._client = client
        self.dispatcher.front = client
        self.dispatcher.events = EventRecorder(client, component="vkprovider-federation", host=self.node_name)
        self.reclaimer.front = client
        self.reclaimer.events = self.dispatcher.events
        self.orphans.front = client
        self.orphans.events = self.dispatcher.events
        for member in self.config.members:
            self.add_configured_member(member)
        tasks = [
            asyncio.create_task(self._publish_loop(), name="federation/publish"),
            asyncio.create_task(self.dispatcher.writer.reflector.run(), name="federation/reflected-gc"),
            asyncio.create_task(self.reclaimer.run(), name="federation/reclaim"),
            asyncio.create_task(self.orphans.run(), name="federation/orphans"),
        ]
        if self.config.routing.enabled:
            webhook = RoutingWebhook(self.config.routing, name=self.node_name)
            tasks.append(asyncio.create_task(webhook.run(client), name="federation/routing-webhook"))
        if self.config.member_objects:
            self._objects = MemberObjects(self, client, selector=self.config.member_selector, node=self.node_name)
            tasks.append(asyncio.create_task(self._objects.run(), name="federation/member-objects"))
        else:
            self.started.set()
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for name in list(self.members):
                self.remove_member(name, quiet=True)
            await asyncio.gather(*tasks, return_exceptions=True)

    def view(self) -> dict[str, Any]:
        """The resource view: per member and per virtual node, capacity, use, shapes and health."""
        jobs = {}
        for key, job in sorted(self.dispatcher.jobs.items()):
            state = _job_state(job)
            jobs[key] = {
                "member": job.member,
                "pods": len(job.pods),
                "gangMin": job.gang.min_member,
                "state": state,
                "networkPod": job.place.network_pod if job.place else None,
            }
        return {
            "members": {name: member.view() for name, member in sorted(self.members.items())},
            "virtualNodes": self.nodes.view(),
            "jobs": jobs,
            "reclaims": self.reclaimer.view(),
        }

    def dashboard_page(self) -> bytes:
        """The dashboard (federation/view/dashboard/index.html), read once."""
        if self._dashboard is None:
            self._dashboard = importlib.resources.files("federation").joinpath("view/dashboard/index.html").read_bytes()
        return self._dashboard

    def history(
        self, since_seconds: float, member: str | None, resource: str | None, points: int | None = None
    ) -> dict[str, Any]:
        """The capacity history (federation.tide), served at /history on the plain port."""
        return self.tide.query(since_seconds=since_seconds, member=member, resource=resource, max_points=points)

    def _member_states(self) -> list[MemberState]:
        return [(name, m.reachable, m.summary) for name, m in sorted(self.members.items()) if m.config.enabled]

    def _job_states(self) -> dict[str, int]:
        counts = {"waiting": 0, "dispatched": 0}
        for job in self.dispatcher.jobs.values():
            state = _job_state(job)
            counts[state] = counts.get(state, 0) + 1
        return counts

    def register_metrics(self, registry: Any) -> None:
        """Reclaim's counters and histograms, exposed with the runtime's (/metrics)."""
        self.reclaimer.metrics = ReclaimMetrics(registry)
        registry.register(TideMetrics(self.tide))
        registry.register(FleetMetrics(self._member_states, self._job_states))
        self.dispatcher.gang_metrics = GangMetrics(registry)
        self.orphans.deleted = PromCounter(
            "vkprovider_orphans_deleted",
            "Member pods of ours deleted because their front-end pod is gone, replaced or ended.",
            ["member", "why"],
            registry=registry,
        )

    # -- pods: dispatch to members (federation.dispatch) ---------------------------------------

    def _pod_changed(self, key: str, phase: str | None = None) -> None:
        """`phase`: the member pod's unless it is going away (Pending: the runtime may fold the
        write; Running or an end: it goes ahead of creates and deletes)."""
        namespace, _, name = key.partition("/")
        pod: Pod = {"metadata": {"namespace": namespace, "name": name}, "spec": {}}
        if phase:
            pod["status"] = {"phase": phase}
        for callback in self._pod_callbacks:
            callback(pod)

    def read_pod_cache(self, pods: PodStore[Pod], listed: asyncio.Event) -> None:
        """The dispatcher's front-end pods and the orphan check read the runtime's cache."""
        self.dispatcher.front_pods.attach(pods)
        self.orphans.follow(pods, listed)

    def notify_pods(self, callback: PodChanged) -> None:
        self._pod_callbacks.append(callback)

    async def create_pod(self, pod: Pod) -> None:
        await self.dispatcher.create(pod)

    async def update_pod(self, pod: Pod) -> None:
        key = f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
        job_key = self.dispatcher.job_of_pod.get(key)
        job = self.dispatcher.jobs.get(job_key) if job_key else None
        if job is not None and key in job.pods:
            job.pods[key] = pod

    async def delete_pod(self, pod: Pod) -> None:
        if not await self.dispatcher.delete(pod):
            raise ProviderNotFound("no member runs this pod")

    def _unknown_yet(self) -> None:
        """An absent pod means lost only once every member's pod list is known: before that
        (just after a restart, or while a member is unreachable) absence proves nothing."""
        waiting = [n for n, m in self.members.items() if m.pods is not None and not m.pods.synced.is_set()]
        if waiting:
            raise ProviderError(f"pods of members {', '.join(sorted(waiting))} are not known yet")

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        key = f"{namespace}/{name}"
        front, status = self.dispatcher.status(key)
        if status is None:
            self._unknown_yet()
            return None
        if front is None:
            # A pod this run did not create (adopted after a restart): its UID is on its member
            # pod, or on the last state of one taken away. Without it the runtime would take the
            # pod for an older one of the same name and delete it, and with it the tombstone.
            found = self.dispatcher.member_pod(key)
            tomb = self.dispatcher.tombstone(key)
            source = found[1] if found else (tomb[0] if tomb else None)
            uid = ((source or {}).get("metadata", {}).get("labels") or {}).get(labels.ORIGIN_UID, "")
            front = {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}}
        pod: Pod = {"metadata": front["metadata"], "spec": front["spec"], "status": status}
        return pod

    async def container_logs(
        self, namespace: str, name: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        """The member pod's log, relayed as it arrives (federation.memberlogs)."""
        async for chunk in memberlogs.stream(self.dispatcher, namespace, name, container, options):
            yield chunk

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        """The command runs in the member pod (federation.memberexec)."""
        return await memberexec.run(self.dispatcher, namespace, name, container, command, streams, self._stream_limits)

    async def attach_to_container(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        """The streams attach to the member pod's container (federation.memberexec)."""
        await memberexec.attach(self.dispatcher, namespace, name, container, streams, self._stream_limits)

    async def port_forward(self, namespace: str, name: str, port: int, stream: ByteStream) -> None:
        """One forwarded connection to the member pod's port (federation.memberforward)."""
        await memberforward.forward(self.dispatcher, namespace, name, port, stream, self._stream_limits)

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str | None]:
        return {labels.MEMBER: self.dispatcher.pin_of(f"{namespace}/{name}")}

    async def get_pod_status(self, namespace: str, name: str) -> PodStatus | None:
        status = self.dispatcher.status(f"{namespace}/{name}")[1]
        if status is None:
            self._unknown_yet()
        return status

    async def list_pods(self) -> list[Pod]:
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


def _job_state(job: Job) -> str:
    """waiting, dispatched, or why it failed (GangTimeout, MemberRemoved)."""
    return job.failed or ("dispatched" if job.dispatched_at is not None else "waiting")


def from_settings(settings: Any) -> FederationProvider:
    """The runtime's factory for `provider.type: federation` (see vkprovider.runtime.PROVIDERS)."""
    try:
        config = FederationConfig.model_validate(settings.provider.federation)
    except ValueError as exc:
        raise SettingsError(f"invalid provider.federation settings: {exc}") from exc
    for member in config.members:
        if member.kubeconfig is None and member.source == "direct":
            raise SettingsError(f"member {member.name}: kubeconfig is required with source: direct")
    return FederationProvider(config, node_name=settings.node.name)
