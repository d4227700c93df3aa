"""One virtual-kubelet process: the order things start in, and a bounded, explicit shutdown.

Start: (leader election) → pod controller, ready once it has listed its pods → node
registration → node status and lease loops → kubelet API. The pod controller is ready before
the node exists, so no pod bound to a fresh node waits for a cold cache. Stop (SIGTERM, a
failed task, lost leadership): the kubelet API closes, tasks get `shutdown.grace` seconds, the
lease is released on a clean stop, the first error is re-raised.
"""

from __future__ import annotations

import asyncio
import importlib
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from vkprovider import heap, logs
from vkprovider.election import LeaderElector
from vkprovider.events import EventRecorder
from vkprovider.httpapi.auth import Authenticator, Authorizer
from vkprovider.httpapi.certs import serving_certificate
from vkprovider.httpapi.limits import ConnectionGuard, GuardedSite, StreamLimits, max_sessions
from vkprovider.httpapi.server import KubeletApi, health_app, kubelet_auth, tls_context
from vkprovider.kube import ApiError, ClusterAccess, KubeClient, WriteFence, load_kubeconfig
from vkprovider.kube.access import in_cluster
from vkprovider.kube.client import set_watch_timeout
from vkprovider.lease import LeaseController
from vkprovider.memory import MemoryProvider, MemorySettings
from vkprovider.metrics import Metrics
from vkprovider.node import NodeController
from vkprovider.pods import PodController
from vkprovider.provider import (
    DashboardSource,
    ForecastSource,
    HistorySource,
    MetricsSource,
    MultiNode,
    PodLifecycle,
    ReclaimSource,
    Runnable,
    Viewable,
)
from vkprovider.settings import Settings, SettingsError
from vkprovider.supervisor import Supervisor

#: Providers other than the in-memory one: settings.provider.type -> "module:factory(settings)".
PROVIDERS = {"federation": "federation.provider:from_settings"}
#: What the kubelet's HTTP probes ask without credentials, when the plain port asks for them.
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})


def build_provider(settings: Settings) -> PodLifecycle:
    if settings.provider.type in PROVIDERS:
        # Providers live in packages above the runtime (layers import downwards only), so they
        # are found by name, the way plugins are.
        module_name, _, factory = PROVIDERS[settings.provider.type].partition(":")
        provider: PodLifecycle = getattr(importlib.import_module(module_name), factory)(settings)
        return provider
    if settings.provider.type == "memory":
        m = settings.provider.memory
        return MemoryProvider(
            MemorySettings(
                startup_delay=m.startup_delay,
                stop_seconds=m.stop_seconds,
                log_interval=m.log_interval,
                latency=m.latency,
                capacity=dict(m.capacity),
                state_file=m.state_file,
            )
        )
    raise SettingsError(f"provider type {settings.provider.type!r} is not available in this release")


def cluster_access(settings: Settings) -> ClusterAccess:
    if settings.kube.kubeconfig:
        return load_kubeconfig(settings.kube.kubeconfig, context=settings.kube.context)
    return in_cluster()


async def _client_ca(client: KubeClient, settings: Settings) -> bytes | None:
    if settings.http.client_ca_file:
        return settings.http.client_ca_file.read_bytes()
    try:
        cm = await client.get("/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
    except ApiError:
        return None
    ca = cm.get("data", {}).get("client-ca-file")
    return ca.encode() if ca else None


class Runtime:
    def __init__(self, settings: Settings, provider: PodLifecycle, *, access: ClusterAccess | None = None) -> None:
        self.settings = settings
        self.provider = provider
        self._access = access
        self.metrics = Metrics()
        if isinstance(provider, MetricsSource):
            provider.register_metrics(self.metrics.registry)
        self._stop = asyncio.Event()
        self._ready = False
        self._log = logs.get("runtime", node=settings.node.name)
        self.pods: PodController | None = None
        self._nodes: NodeSet | None = None
        self.elector: LeaderElector | None = None

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def ready(self) -> bool:
        return self._ready

    async def _until(self, awaitable: Any, supervisor: Supervisor) -> bool:
        """Wait for `awaitable`, a stop request or a task failure; True if it completed."""
        target = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stop.wait())
        failed = asyncio.ensure_future(supervisor.wait_failure())
        try:
            await asyncio.wait({target, stop, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (target, stop, failed):
                if not fut.done():
                    fut.cancel()
            await asyncio.gather(target, stop, failed, return_exceptions=True)
        if supervisor.first_error is not None:
            raise supervisor.first_error
        return target.done() and not target.cancelled() and target.exception() is None

    async def run(self) -> None:
        settings = self.settings
        node_name = settings.node.name
        access = self._access or cluster_access(settings)
        set_watch_timeout(settings.kube.watch_timeout)
        # One fence for every client of this process (the provider's member clients take it
        # from this one): losing leadership closes it before anything else can write.
        client = KubeClient(
            access,
            # The replica too: an audit log tells two writers apart (one at a time, by the Lease).
            user_agent=f"vkprovider/{node_name} ({settings.leader_election.identity})",
            request_timeout=settings.kube.request_timeout,
            fence=WriteFence(),
        )
        self.metrics.track_api_calls(lambda: dict(client.calls))
        supervisor = Supervisor("runtime")
        runners: list[web.AppRunner] = []
        clean = False
        # One cache of who may do what for both listeners.
        authn = Authenticator(client, ttl=settings.http.authn_cache_seconds)
        authz = Authorizer(
            client,
            node=node_name,
            allow_ttl=settings.http.authz_allow_cache_seconds,
            deny_ttl=settings.http.authz_deny_cache_seconds,
        )
        try:
            if settings.http.health_port:
                gate = kubelet_auth(authn, authz, node=node_name, open_paths=HEALTH_PATHS)
                runner = web.AppRunner(
                    health_app(
                        middlewares=(gate,) if settings.http.health_auth else (),
                        metrics=self.metrics,
                        alive=lambda: supervisor.first_error is None,
                        ready=lambda: self._ready,
                        view=self.provider.view if isinstance(self.provider, Viewable) else None,
                        history=self.provider if isinstance(self.provider, HistorySource) else None,
                        dashboard=self.provider if isinstance(self.provider, DashboardSource) else None,
                        reclaims=self.provider if isinstance(self.provider, ReclaimSource) else None,
                        forecast=self.provider if isinstance(self.provider, ForecastSource) else None,
                    ),
                    access_log=None,
                )
                await runner.setup()
                await web.TCPSite(runner, settings.http.health_bind, settings.http.health_port).start()
                runners.append(runner)
            if settings.leader_election.enabled:
                self.elector = LeaderElector(
                    client, settings.leader_election, name=settings.leader_election.name or f"vkprovider-{node_name}"
                )
                if not await self._until(self.elector.acquire(), supervisor):
                    clean = True
                    return
                self.metrics.is_leader.set(1)
                supervisor.start("election", self.elector.hold())

            if isinstance(self.provider, MemoryProvider):
                self.provider.resume()
            node_set_changed = asyncio.Event()
            if isinstance(self.provider, MultiNode):
                self.provider.notify_node_set(node_set_changed.set)
            if isinstance(self.provider, Runnable):
                supervisor.start("provider", self.provider.run(client))
                started = getattr(self.provider, "started", None)
                if isinstance(started, asyncio.Event) and not await self._until(started.wait(), supervisor):
                    clean = True
                    return
            node_names = self._node_names()
            events = EventRecorder(
                client,
                component="vkprovider",
                host=node_names[0] if node_names else node_name,
                dedupe_seconds=settings.pods.event_dedupe_seconds,
            )
            self.pods = PodController(
                client=client,
                provider=self.provider,
                node_names=node_names,
                host_ip=settings.node.internal_ip(),
                settings=settings.pods,
                events=events,
                metrics=self.metrics,
            )
            supervisor.start("pods", self.pods.run())
            pods = self.pods
            supervisor.start("heap-trim", heap.trim_periodically(lambda: pods.syncs))
            supervisor.start("loop-lag", self.metrics.probe_loop_lag())
            if not await self._until(self.pods.ready.wait(), supervisor):
                clean = True
                return
            self._nodes = NodeSet(
                client=client, settings=settings, provider=self.provider, metrics=self.metrics, supervisor=supervisor
            )
            await self._nodes.sync(node_names)
            if isinstance(self.provider, MultiNode):
                supervisor.start("node-set", self._follow_node_set(node_set_changed))

            runners.append(await self._serve_kubelet_api(client, authn, authz))
            self._ready = True
            self._log.info(
                "ready",
                port=settings.http.port,
                address=settings.node.internal_ip(),
                event_loop=type(asyncio.get_running_loop()).__module__,
            )
            await self._until(asyncio.Event().wait(), supervisor)
            clean = True
        finally:
            self._ready = False
            self._log.info("stopping", clean=clean)
            for runner in reversed(runners):
                await runner.cleanup()
            await supervisor.stop(settings.shutdown.grace)
            if clean and self.elector is not None:
                await self.elector.release()
            self.metrics.is_leader.set(0)
            await client.close()
            close = getattr(self.provider, "close", None)
            if callable(close):
                close()
            self._log.info("stopped")

    def _node_names(self) -> list[str]:
        if isinstance(self.provider, MultiNode):
            return self.provider.node_names()
        return [self.settings.node.name]

    async def _follow_node_set(self, changed: asyncio.Event) -> None:
        """Nodes come and go with members (per-member virtual nodes)."""
        assert self.pods is not None and self._nodes is not None
        while True:
            await changed.wait()
            changed.clear()
            names = self._node_names()
            self.pods.set_nodes(names)
            await self._nodes.sync(names)

    async def _serve_kubelet_api(self, client: KubeClient, authn: Authenticator, authz: Authorizer) -> web.AppRunner:
        settings = self.settings
        node_name = settings.node.name
        client_ca = await _client_ca(client, settings)
        # The issued or self-signed pair is on disk only until the context has loaded it: neither
        # a stop nor a kill -9 leaves a key behind (given files stay where they were given).
        with tempfile.TemporaryDirectory(prefix=f"vkprovider-{node_name}-") as cert_dir:
            cert = await serving_certificate(
                client, settings.http, node=node_name, address=settings.node.internal_ip(), directory=Path(cert_dir)
            )
            ssl_context = tls_context(cert_file=str(cert.cert_file), key_file=str(cert.key_file), client_ca=client_ca)
        if client_ca is None:
            self._log.warning("no client CA: only bearer tokens can authenticate to the kubelet API")
        http = settings.http
        hits = self.metrics.kubelet_limits_hit

        def hit(limit: str) -> None:
            hits.labels(limit).inc()

        limits = StreamLimits(
            max_streams=http.max_streams,
            max_port_forward_pairs=http.max_port_forward_pairs,
            max_frame_bytes=http.max_frame_bytes,
            max_message_bytes=http.max_message_bytes,
            resize_buffer_bytes=http.resize_buffer_bytes,
            session_buffer_bytes=http.session_buffer_bytes,
            outbox_bytes=http.outbox_bytes,
            idle_seconds=http.stream_idle,
            control_frames_per_second=http.control_frames_per_second,
            control_frame_burst=http.control_frame_burst,
            hit=hit,
        )
        guard = ConnectionGuard(
            max_connections=http.max_connections,
            max_pending_per_address=http.max_pending_per_address,
            header_seconds=http.header_timeout,
            idle_seconds=http.keepalive_idle,
            hit=hit,
        )
        api = KubeletApi(
            node=node_name,
            node_of=self.pods.node_of if self.pods else None,
            provider=self.provider,
            pods=lambda: list(self.pods.cache.values()) if self.pods else [],
            authenticator=authn,
            authorizer=authz,
            sessions=self.metrics.stream_sessions,
            limits=limits,
            max_sessions=max_sessions(http.memory_budget_bytes, limits),
            max_sessions_per_user=http.max_sessions_per_user,
            guard=guard,
            exposition=self.metrics.exposition,
        )
        runner = web.AppRunner(api.app(), access_log=None, keepalive_timeout=http.keepalive_idle)
        await runner.setup()
        await GuardedSite(runner, http.bind, http.port, guard=guard, ssl_context=ssl_context).start()
        self._log.info("kubelet API serving", port=settings.http.port, certificate=cert.source)
        return runner


class NodeSet:
    """The virtual nodes this process serves: for each, registration, status and lease."""

    def __init__(
        self, *, client: KubeClient, settings: Settings, provider: object, metrics: Metrics, supervisor: Supervisor
    ) -> None:
        self._client = client
        self._settings = settings
        self._provider = provider
        self._metrics = metrics
        self._supervisor = supervisor
        self.controllers: dict[str, NodeController] = {}
        self.leases: dict[str, LeaseController] = {}
        self._log = logs.get("nodes")

    async def sync(self, names: list[str]) -> None:
        for name in [n for n in self.controllers if n not in names]:
            await self._supervisor.stop(self._settings.shutdown.grace, names=[f"node-status/{name}", f"lease/{name}"])
            del self.controllers[name]
            del self.leases[name]
            try:
                await self._client.delete(f"/api/v1/nodes/{name}")
            except ApiError as exc:
                self._log.warning("virtual node not deleted", node=name, error=str(exc))
            self._log.info("virtual node removed", node=name)
        for name in names:
            if name in self.controllers:
                continue
            node = NodeController(
                client=self._client,
                settings=self._settings.node,
                provider=self._provider,
                port=self._settings.http.port,
                metrics=self._metrics,
                name=name,
            )
            node_uid = await node.register()
            self._supervisor.start(f"node-status/{name}", node.run())
            lease = LeaseController(
                client=self._client,
                node=name,
                node_uid=node_uid,
                duration=self._settings.node.lease_duration,
                interval=self._settings.node.lease_renew_interval,
                metrics=self._metrics,
            )
            await lease.renew()
            self._supervisor.start(f"lease/{name}", lease.run())
            self.controllers[name] = node
            self.leases[name] = lease
