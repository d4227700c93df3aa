"""The federation provider: member clusters behind virtual nodes, composed from the packages of
federation/ for the runtime's provider contract (vkprovider.provider).

- members (federation.members.fleet): the member clusters, from the settings and from
  MemberCluster objects (federation.members.objects), each with a capacity source (direct
  watches, or the member's capacity agent, federation.agent) and our pods there;
- capacity (federation.capacity.nodes): what the virtual nodes show, published coalesced, at
  most every `publish_interval`;
- dispatch (federation.dispatch): pods to members, whole jobs at a time, and their status back;
- reclaim (federation.reclaim): capacity given back with notices, and the jobs told;
- tenancy (federation.tenancy): the namespaces our pods run in, readied for dispatch;
- streams (federation.streams): logs, exec, attach and port-forward to member pods;
- view (federation.view): the capacity history, gauges and the dashboard;
- usage (federation.usage): our pods' usage, from the members' Metrics API, as the kubelet's stats.
The features do not import each other: what one needs of another is handed in here. A member
unreachable past `unreachable_grace` lends nothing and is flagged on its MemberCluster and on
the node, which stays Ready; its pods are declared lost only after `pods_lost_after`
(federation.members.outages).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from federation import labels
from federation.agent.client import AgentSource
from federation.capacity.nodes import VirtualNodes
from federation.config import FederationConfig, MemberConfig
from federation.dispatch.dispatcher import Dispatcher
from federation.dispatch.gang import GangMetrics
from federation.dispatch.jobstate import Job
from federation.dispatch.webhook import RoutingWebhook
from federation.jobs import job_hash, job_of
from federation.members import disruption, outages
from federation.members.announcer import Announcer
from federation.members.fleet import Fleet, SourceFactory
from federation.members.lastlogs import LastLogs
from federation.members.member import CapacitySource, DirectSource, Member
from federation.members.objects import MemberObjects, SecretAllowance, front_end_uid
from federation.members.orphans import OrphanReconciler
from federation.members.outages import Outage
from federation.members.pods import MemberPods
from federation.members.recall import FrontRecall
from federation.members.scope import NamespaceScope
from federation.queues.kueue import QuotaKeeper
from federation.reclaim.metrics import ReclaimMetrics
from federation.reclaim.reclaimer import Reclaimer
from federation.streams import exec as member_exec
from federation.streams import forward, logs
from federation.streams.session import StreamLimits
from federation.tenancy.namespaces import MemberNamespaces
from federation.usage.reader import MetricsReader
from federation.usage.stats import UsageStats
from federation.view.readings import Readings
from federation.view.tide import FleetMetrics, TideMetrics
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, ClusterAccess, KubeClient
from vkprovider.logs import get as get_logger
from vkprovider.objects import Pod, PodStatus, pod_key
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


class FederationProvider(Readings):
    def __init__(
        self, config: FederationConfig, *, node_name: str, source_factory: SourceFactory | None = None
    ) -> None:
        self.config = config
        self.node_name = node_name
        self._log = get_logger("federation", node=node_name)
        #: Whose objects in the members are ours: this node's name, of this front end (learnt in run).
        self.owner = labels.Owner(node_name)
        self._client: KubeClient | None = None
        self._events: EventRecorder | None = None
        self._objects: MemberObjects | None = None  # from run(), if MemberCluster objects are followed
        self._pod_callbacks: list[PodChanged] = []
        self.fleet = Fleet(
            config,
            instance=node_name,
            new_source=source_factory or self._default_source,
            new_pods=self._member_pods,
            on_reachability=self._reachability_changed,
        )
        #: Set once the configured members are added and MemberCluster objects listed.
        self.started = self.fleet.started
        self.nodes = VirtualNodes(
            node_name,
            self.fleet.members,
            per_member=config.virtual_nodes == "per-member",
            damping_hold=config.damping_hold,
        )
        self.dispatcher = Dispatcher(
            owner=self.owner,
            members=self.fleet.serving,
            capacities=self.fleet.lending,
            notify=self._pod_changed,
            namespaces=MemberNamespaces(),
            outage=self.fleet.outage_of,
            draining=self.fleet.draining,
            virtual_nodes=self.node_names,
        )
        self.last_logs = LastLogs(per_pod=config.kept_log_bytes)
        self.recall = FrontRecall(self.fleet, instance=node_name)
        self.reclaimer = Reclaimer(members=self.fleet.serving, instance=node_name, keep_logs=self.last_logs.keep_member)
        self.reclaimer.job_notices.native_pods = self.dispatcher.native_pods.pods
        self.reclaimer.reports.split.native_pods = self.dispatcher.native_pods.pods
        self.reclaimer.reports.split.gang_min = self._gang_min
        self.dispatcher.gangs.on_timeout = self._split_after_timeout
        self.orphans = OrphanReconciler(
            members=self.fleet.serving, node_of=self.nodes.node_of, interval=config.orphan_interval
        )
        self.announcer = Announcer(
            job_of_pod=lambda key: self.dispatcher.job_of_pod.get(key, ""),
            job_object=self.reclaimer.reports.job_object,
            events=lambda: self._events,
        )
        history = config.history
        self._init_readings(history.tiers, max_series=history.max_series, file=history.file, save=history.save_interval)
        self.reclaimer.reports.on_reclaimed = self.reclaim_log.record
        self.quota = (
            QuotaKeeper(config.kueue_quota, front=lambda: self._client, node=self.node_name)
            if config.kueue_quota.enabled
            else None
        )
        self._stream_limits = StreamLimits(idle=config.streaming.idle_timeout, total=config.streaming.max_duration)
        self.usage = UsageStats(
            index=self.dispatcher.reports,
            members_of=lambda node: [m.name for m in self.nodes.members_of(node)],
            reader=MetricsReader(interval=config.usage_interval, selector=self.owner.selector),
        )

    async def _split_after_timeout(self, job: Job) -> None:
        """A hybrid gang whose virtual part no member could host: its native part is told."""
        first = next(iter(job.pods), None)
        if not job.native or first is None:
            return
        try:
            target = await self.reclaimer.reports.job_object(job.ref.key, first)
            await self.reclaimer.reports.split.check(None, job.ref.key, target)
        except ApiError as exc:
            self._log.warning("split gang not told", job=job.ref.key, error=str(exc))

    def _gang_min(self, job_key: str) -> int | None:
        """A dispatched job's whole gang minimum (native and virtual pods together)."""
        job = self.dispatcher.jobs.get(job_key)
        return job.gang.min_member if job is not None and job.gang.is_gang else None

    # -- members (federation.members) -----------------------------------------------------------

    def _default_source(
        self, config: MemberConfig, access: ClusterAccess | None, on_change: Callable[[], None]
    ) -> CapacitySource:
        if config.source == "agent":
            return AgentSource(config, on_change=on_change, owner=self.owner.key)
        if access is None:
            raise ProviderError(f"member {config.name}: no kubeconfig")
        return DirectSource(
            config.name, access, on_change=on_change, network_pod_label=config.network_pod_label, owner=self.owner.key
        )

    def _member_pods(self, config: MemberConfig, access: ClusterAccess) -> MemberPods:
        """Our pods in a member: their changes go to the runtime, their disruptions to reclaim's
        job reports, their tombstones to dispatch's reports, a fresh list to the orphan check; a
        tenant's are followed in the namespaces its registry names (federation.members.scope)."""
        scope = None
        if config.tenancy is not None:
            scope = NamespaceScope(registry=labels.tenant_registry(config.tenancy.tenant))
        return MemberPods(
            config.name,
            access,
            owner=self.owner,
            scope=scope,
            on_change=self._pod_changed,
            fence=self._client.fence if self._client is not None else None,
            on_disrupted=self.reclaimer.reports.disrupted,
            tombstones=self.dispatcher.reports.tombstones,
            on_listed=self.orphans.request,
            on_terminating=self.last_logs.keep_soon,
        )

    def _reachability_changed(self, member: Member, before: Outage | None) -> None:
        """A member moved along its outage clocks: its jobs are told when it first goes out, and
        each of its pods is synced again (condition added, lost, or back). A member not listed
        since the start is known by the front-end pods pinned to it."""
        listed = member.pods is not None and member.pods.synced.is_set()
        pinned = {} if listed else self.recall.pinned_to(member.name)
        if before is None and member.outage is not None and member.pods is not None:
            jobs = {key: entry.extra for key, entry in member.pods.by_origin.entries()}
            for key, front in pinned.items():  # not told yet: no condition from an earlier run
                if outages.recorded_since((front.get("status") or {}).get("conditions")) is None:
                    jobs.setdefault(key, job_hash(job_of(dict(front))))
            self.announcer.add(member.name, jobs, member.outage)
        keys = set(member.pods.by_origin) if member.pods is not None else set()
        keys |= {k for k, placed in self.dispatcher.reports.placed.items() if placed == member.name}
        keys |= set(pinned)
        for key in keys:
            self._pod_changed(key)

    # -- nodes (federation.capacity.nodes) ------------------------------------------------------

    def node_names(self) -> list[str]:
        return self.nodes.names()

    def notify_node_set(self, callback: Callable[[], None]) -> None:
        self.fleet.notify_node_set(callback)

    async def node_status(self, node_name: str) -> NodeStatus:
        return self.nodes.status(node_name)

    def notify_node_status(self, callback: Callable[[str], None]) -> None:
        self.nodes.notify(callback)

    async def _publish_loop(self) -> None:
        """Recompute summaries and node status on every change (at least once a second, to
        follow reachability and held increases), then what follows from them."""
        while True:
            try:
                await asyncio.wait_for(self.fleet.dirty.wait(), timeout=1.0)
            except TimeoutError:
                pass  # also re-check reachability and held increases once a second
            self.fleet.dirty.clear()
            self.fleet.refresh()
            self.nodes.publish(time.monotonic())
            if self.quota is not None:
                await self.quota.sync(self.nodes.status(self.quota.node).capacity)
            self.tide.observe(m.summary for m in self.fleet.members.values() if m.summary is not None)
            await self.announcer.flush()
            if self._objects is not None:
                await self._objects.write_statuses()
            await asyncio.sleep(self.config.publish_interval)

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, client: KubeClient) -> None:
        """Start the configured members, follow MemberCluster objects, publish capacity."""
        self._client = client
        # Before any member starts: every object we make there carries this front end's identity.
        self.owner.identify(await front_end_uid(client))
        self._events = EventRecorder(client, component="vkprovider-federation", host=self.node_name)
        for part in (self.dispatcher, self.reclaimer, self.orphans):
            part.front, part.events = client, self._events
        for member in self.config.members:
            self.fleet.add_configured_member(member)
        self.store.load()
        tasks = [
            asyncio.create_task(self._publish_loop(), name="federation/publish"),
            asyncio.create_task(self.dispatcher.writer.reflector.run(), name="federation/reflected-gc"),
            asyncio.create_task(self.reclaimer.run(), name="federation/reclaim"),
            asyncio.create_task(self.orphans.run(), name="federation/orphans"),
            asyncio.create_task(self.recall.outages(), name="federation/recall-outages"),
        ]
        if self.store.path is not None:
            tasks.append(asyncio.create_task(self.store.run(), name="federation/view-store"))
        if self.config.routing.enabled:
            webhook = RoutingWebhook(self.config.routing, name=self.node_name)
            tasks.append(asyncio.create_task(webhook.run(client), name="federation/routing-webhook"))
        if self.config.member_objects:
            allow = SecretAllowance(tuple(self.config.secret_exec_commands), tuple(self.config.secret_file_paths))
            self._objects = MemberObjects(
                self.fleet, client, selector=self.config.member_selector, node=self.node_name, allow=allow
            )
            tasks.append(asyncio.create_task(self._objects.run(), name="federation/member-objects"))
        else:
            self.started.set()
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self.fleet.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.last_logs.close()
            await self.store.save()

    # -- what people read (federation.view) -----------------------------------------------------

    def view(self) -> dict[str, Any]:
        """The resource view: per member and per virtual node, capacity, use, shapes and health."""
        return {
            "members": self.fleet.view(),
            "virtualNodes": self.nodes.view(),
            "jobs": self.dispatcher.view(),
            "reclaims": self.reclaimer.view(),
        }

    def register_metrics(self, registry: Any) -> None:
        """The features' counters, histograms and gauges, exposed with the runtime's (/metrics)."""
        self.reclaimer.metrics = ReclaimMetrics(registry)
        registry.register(TideMetrics(self.tide))
        registry.register(FleetMetrics(self.fleet.states, self.dispatcher.job_states))
        self.dispatcher.gangs.metrics = GangMetrics(registry)
        self.orphans.register_metrics(registry)

    # -- pods (federation.dispatch) -------------------------------------------------------------

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
        self.reclaimer.front_pods, self.reclaimer.front_listed = pods, listed
        self.recall.attach(pods, listed)
        self.orphans.follow(pods, listed)

    def notify_pods(self, callback: PodChanged) -> None:
        self._pod_callbacks.append(callback)

    async def create_pod(self, pod: Pod) -> None:
        await self.dispatcher.create(pod)

    async def update_pod(self, pod: Pod) -> None:
        key = pod_key(pod)
        job = self.dispatcher.reports.job_of(key)
        if job is not None and key in job.pods:
            job.pods[key] = pod

    async def delete_pod(self, pod: Pod) -> None:
        if not await self.dispatcher.delete(pod):
            raise ProviderNotFound("no member runs this pod")

    def _unknown_yet(self) -> None:
        """An absent pod means lost only once every member's pod list is known: before that
        (just after a restart, or while a member is unreachable) absence proves nothing."""
        waiting = self.fleet.unlisted()
        if waiting:
            raise ProviderError(f"pods of members {', '.join(waiting)} are not known yet")

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        key = f"{namespace}/{name}"
        pod = self.dispatcher.reports.pod(key) or self.recall.in_outage(key)
        if pod is None:
            self._unknown_yet()
            pod = self._gone_while_down(key)
        elif self.dispatcher.to_adopt(key) and (front := self.recall.front(key)) is not None:
            await self.dispatcher.adopt(front)  # a gang waiting in its member: its timer goes on
        return pod

    def _gone_while_down(self, key: str) -> Pod | None:
        """A front-end pod whose member pod went away while no provider watched: taken away,
        never ProviderPodLost; its job is told (federation.members.recall)."""
        found = self.recall.gone_unseen(key, serving=self.fleet.serving())
        if found is None:
            return None
        member, front, what = found
        self.reclaimer.reports.disrupted_front(member, dict(front), what.pod_reason)
        return {
            "metadata": front["metadata"],
            "spec": front["spec"],
            "status": disruption.disrupted_status(front, what),
        }

    async def get_pod_status(self, namespace: str, name: str) -> PodStatus | None:
        key = f"{namespace}/{name}"
        status = self.dispatcher.reports.status(key)[1]
        if status is None:
            pod = self.recall.in_outage(key)
            if pod is None:
                self._unknown_yet()
                pod = self._gone_while_down(key)
            status = pod["status"] if pod is not None else None
        return status

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str | None]:
        key = f"{namespace}/{name}"
        return {labels.MEMBER: self.dispatcher.reports.pin_of(key) or self.recall.kept_pin(key)}

    async def list_pods(self) -> list[Pod]:
        """Our member pods, as the front-end pods they run (this instance's only)."""
        return await self.fleet.our_pods()

    # -- streams (federation.streams) ----------------------------------------------------------

    async def container_logs(
        self, namespace: str, name: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        """The member pod's log, relayed as it arrives."""
        async for chunk in logs.stream(self.dispatcher.reports, namespace, name, container, options, self.last_logs):
            yield chunk

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        """The command runs in the member pod."""
        reports, limits = self.dispatcher.reports, self._stream_limits
        return await member_exec.run(reports, namespace, name, container, command, streams, limits)

    async def attach_to_container(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        """The streams attach to the member pod's container."""
        await member_exec.attach(self.dispatcher.reports, namespace, name, container, streams, self._stream_limits)

    async def port_forward(self, namespace: str, name: str, port: int, stream: ByteStream) -> None:
        """One forwarded connection to the member pod's port."""
        await forward.forward(self.dispatcher.reports, namespace, name, port, stream, self._stream_limits)

    async def stats_summary(self, node_name: str) -> dict[str, Any]:
        """Our pods' usage on `node_name`, as their members' Metrics API has it (federation.usage)."""
        return await self.usage.summary(node_name)


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
