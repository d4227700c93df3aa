"""The provider contract: what the runtime asks of whatever runs the pods.

Small protocols, so a provider implements only what it can: pod lifecycle is required; status
push, node status, logs and stats are optional and detected at start-up. Every method may be
called again after a restart with the same pod (same UID) and must be idempotent.

Errors a provider raises: `ProviderNotFound` (the pod is not there: a delete treats it as done),
`ProviderInvalid` (this pod can never be created as it is: it ends Failed, with the provider's
reason if it names one), anything else (transient: retried).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vkprovider.objects import Pod, PodStatus
from vkprovider.podstore import PodStore

#: Label on every virtual node: `"true"`, so selectors can find all of them.
NODE_LABEL = "vkprovider.io/node"
#: Label on a virtual node: which provider serves it (`memory`, `federation`, the `node.provider_id` setting).
PROVIDER_LABEL = "vkprovider.io/provider"


class ProviderError(Exception):
    """A provider failure the runtime should retry."""


class ProviderNotFound(ProviderError):
    """The pod (or container) does not exist in the provider."""


class ProviderInvalid(ProviderError):
    """The pod cannot be run as specified; retrying will not help. `reason` (a CamelCase word)
    becomes the Failed pod's reason and its Event's; without it they are ProviderFailed and
    ProviderCreateFailed."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class PodLifecycle(Protocol):
    """Required: pods in and out of the provider, keyed by namespace, name and UID."""

    async def create_pod(self, pod: Pod) -> None:
        """Start the pod; a second call for the same UID is a no-op."""

    async def update_pod(self, pod: Pod) -> None:
        """Apply changes to mutable fields (images, labels, annotations, activeDeadlineSeconds)."""

    async def delete_pod(self, pod: Pod) -> None:
        """Stop the pod (honouring its grace period) and forget it; ProviderNotFound if absent.
        Afterwards `get_pod_status` reports a terminal status until the pod is gone."""

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The provider's view of the pod, or None."""

    async def get_pod_status(self, namespace: str, name: str) -> PodStatus | None:
        """The pod's current status as the provider sees it, or None if it has no such pod."""

    async def list_pods(self) -> list[Pod]:
        """Pods this instance owns: never another instance's, since start-up clean-up deletes
        whatever is listed here and not in the API."""


PodChanged = Callable[[Pod], None]


@runtime_checkable
class PodNotifier(Protocol):
    """Optional: push status changes instead of being polled."""

    def notify_pods(self, callback: PodChanged) -> None:
        """Register `callback`, called (never blocking) with the pod whenever its status changes.
        The pod may be a skeleton (metadata only); a status phase in it must be the pod's
        phase now: a change that leaves a new pod Pending may then wait for its settle timer."""


@runtime_checkable
class PodCacheReader(Protocol):
    """Optional: read the runtime's cache of the API's pods bound to our nodes (read-only), as
    a Go provider reads the pod lister virtual-kubelet hands it, instead of copies of its own."""

    def read_pod_cache(self, pods: PodStore[Pod], listed: asyncio.Event) -> None:
        """Called once, before the first pod is synced. `listed` is set once every node's pods
        were listed: before it, a pod missing from the cache may still exist."""


@runtime_checkable
class PodAnnotator(Protocol):
    """Optional: annotations the provider records on the API pod (where it runs the pod, say),
    written in the same request as the pod's status so they cost no extra API call."""

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str | None]:
        """The annotations the pod should carry now; None removes one."""


@dataclass(kw_only=True)
class NodeStatus:
    """What the provider says about its node: resources, extra labels and conditions."""

    capacity: dict[str, str]
    allocatable: dict[str, str] | None = None  # defaults to capacity
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    conditions: list[dict[str, Any]] = field(default_factory=list)  # extra, provider-owned types


@runtime_checkable
class NodeProvider(Protocol):
    """Optional: node capacity and provider conditions (default: a fixed capacity from settings)."""

    async def node_status(self, node_name: str) -> NodeStatus:
        """The node's current resources and provider-owned conditions."""

    def notify_node_status(self, callback: Callable[[str], None]) -> None:
        """Register `callback(node_name)`, called when a node's status changed."""


@dataclass(frozen=True, kw_only=True)
class LogOptions:
    follow: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_seconds: int | None = None
    since_time: str | None = None  # RFC 3339
    timestamps: bool = False
    previous: bool = False


@runtime_checkable
class LogProvider(Protocol):
    """Optional: container logs for `kubectl logs`."""

    def container_logs(self, namespace: str, name: str, container: str, options: LogOptions) -> AsyncIterator[bytes]:
        """Lines (each ending in a newline) as they become available; ends unless following."""


@dataclass(frozen=True)
class TermSize:
    width: int
    height: int


class StreamReader(Protocol):
    async def read(self) -> bytes:
        """The next bytes; b"" once the client closed its side."""


class StreamWriter(Protocol):
    async def write(self, data: bytes) -> None:
        """Send bytes; waits while the client is slower than the command (back-pressure)."""


@dataclass(frozen=True)
class ExecStreams:
    """What the client of `kubectl exec` asked for: None where it did not (no stderr with a tty)."""

    stdin: StreamReader | None
    stdout: StreamWriter | None
    stderr: StreamWriter | None
    tty: bool = False
    #: Terminal sizes as the client sends them (the first at the start), with a tty only.
    resizes: AsyncIterator[TermSize] | None = None


@runtime_checkable
class ExecProvider(Protocol):
    """Optional: `kubectl exec` (and `cp`, which runs tar through it)."""

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        """Run `command` in the container with these streams; its exit status. Raise
        ProviderNotFound or ProviderError when it cannot run (the client is told why)."""


@runtime_checkable
class AttachProvider(Protocol):
    """Optional: `kubectl attach` to the streams of a container's running process."""

    async def attach_to_container(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        """Relay the container's output (and the client's input) until either side ends. Raise
        ProviderNotFound or ProviderError when it cannot attach (the client is told why)."""


class ByteStream(Protocol):
    """One forwarded connection: bytes both ways, each side closing its half."""

    async def read(self) -> bytes:
        """The next bytes; b"" once the client closed its side."""

    async def write(self, data: bytes) -> None:
        """Send bytes; waits while the client is slower (back-pressure)."""

    async def close(self) -> None:
        """We send nothing more."""


@runtime_checkable
class PortForwardProvider(Protocol):
    """Optional: `kubectl port-forward`, one call per forwarded connection."""

    async def port_forward(self, namespace: str, name: str, port: int, stream: ByteStream) -> None:
        """Carry `stream` to `port` of the pod until both sides closed. Raise ProviderError
        when the pod's port cannot be reached (the client is told why)."""


@runtime_checkable
class StatsProvider(Protocol):
    """Optional: resource usage for /stats/summary and /metrics/resource."""

    async def stats_summary(self, node_name: str) -> dict[str, Any]:
        """A `stats/v1alpha1` Summary."""


@runtime_checkable
class Runnable(Protocol):
    """Optional: a provider with background work (watching backends, publishing capacity)."""

    async def run(self, client: Any) -> None:
        """Run until cancelled; `client` is the front-end cluster's KubeClient. A provider may
        also have a `started` asyncio.Event: the runtime then waits for it before asking for
        node names and pods (say, until its backends are known)."""


@runtime_checkable
class MultiNode(Protocol):
    """Optional: a provider that serves several virtual nodes, whose set may change."""

    def node_names(self) -> list[str]:
        """The virtual nodes to serve now."""

    def notify_node_set(self, callback: Callable[[], None]) -> None:
        """Register `callback`, called when the set of nodes changed."""


@runtime_checkable
class Viewable(Protocol):
    """Optional: a JSON view of the provider's state (served at /capacity on the plain port)."""

    def view(self) -> dict[str, Any]:
        """The current view."""


@runtime_checkable
class HistorySource(Protocol):
    """Optional: capacity over time (served at /history on the plain port)."""

    def history(
        self, since_seconds: float, member: str | None, resource: str | None, points: int | None = None
    ) -> dict[str, Any]:
        """Series from `since_seconds` ago until now, optionally of one member or resource, each
        thinned to at most `points` points."""


@runtime_checkable
class ReclaimSource(Protocol):
    """Optional: the pods given back to their owners (served at /reclaims on the plain port)."""

    def reclaims(self, since_seconds: float, member: str | None) -> dict[str, Any]:
        """Reclaims from `since_seconds` ago until now, oldest first, optionally of one member."""


@runtime_checkable
class ForecastSource(Protocol):
    """Optional: what the provider expects to be able to use ahead (served at /forecast)."""

    def forecast(self, hours: float) -> dict[str, Any]:
        """The outlook over the next `hours`, with its method and its error on the past."""


@runtime_checkable
class DashboardSource(Protocol):
    """Optional: a read-only web page served at / on the plain port."""

    def dashboard_page(self) -> bytes:
        """The page (HTML, self-contained: it fetches nothing from outside the provider)."""


@runtime_checkable
class MetricsSource(Protocol):
    """Optional: a provider's own Prometheus metrics, served with the runtime's at /metrics."""

    def register_metrics(self, registry: Any) -> None:
        """Create the provider's metrics in `registry` (a prometheus_client CollectorRegistry)."""
