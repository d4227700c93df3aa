"""Prometheus metrics of one runtime: queue depth and wait, sync latency, errors, API calls,
open streaming sessions, and the event loop's tasks and lag.

One registry per runtime (not the global default), so several runtimes in one process, as in
tests, do not collide.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SYNC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Seconds between two looks at the event loop's lag: a stall this long or longer is always seen.
LAG_INTERVAL = 0.25


class _ApiCalls(Collector):
    def __init__(self, source: Callable[[], dict[str, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "vkprovider_api_calls", "Requests made to the front-end apiserver.", labels=["verb"]
        )
        for verb, count in sorted(self._source().items()):
            family.add_metric([verb], count)
        yield family


class _Tasks(Collector):
    """The event loop's tasks at scrape time: a number that only grows points at a leak."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("vkprovider_asyncio_tasks", "Tasks of the provider's event loop.")
        try:
            family.add_metric([], len(asyncio.all_tasks()))
        except RuntimeError:  # scraped outside the loop: nothing to count
            return
        yield family


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.queue_depth = Gauge("vkprovider_workqueue_depth", "Keys waiting in a work queue.", ["queue"], registry=r)
        self.sync_seconds = Histogram(
            "vkprovider_pod_sync_seconds", "Time to sync one pod.", ["result"], buckets=SYNC_BUCKETS, registry=r
        )
        self.queue_wait_seconds = Histogram(
            "vkprovider_workqueue_wait_seconds",
            "Time a key waited in a work queue before a worker took it, by lane (urgent: a pod the "
            "provider reports running or ended).",
            ["queue", "lane"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.status_lag_seconds = Histogram(
            "vkprovider_status_lag_seconds",
            "From a change the provider reported for a pod to the status it made written to the API: "
            "the queue, the sync and the write.",
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.loop_lag_seconds = Histogram(
            "vkprovider_event_loop_lag_seconds",
            "How late the event loop woke a timer: time every task waited for one that held the loop.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.errors = Counter("vkprovider_errors", "Errors by component and kind.", ["component", "kind"], registry=r)
        self.status_writes = Counter("vkprovider_pod_status_writes", "Pod status patches written.", registry=r)
        self.node_patches = Counter("vkprovider_node_status_patches", "Node status patches written.", registry=r)
        self.is_leader = Gauge("vkprovider_leader", "1 while this replica holds the leader Lease.", registry=r)
        self.stream_sessions = Gauge(
            "vkprovider_stream_sessions", "Open exec, attach and port-forward sessions.", ["kind"], registry=r
        )
        self.kubelet_limits_hit = Counter(
            "vkprovider_kubelet_limits_hit",
            "Times a client of the kubelet port reached a limit (connections, header_timeout, streams, ...).",
            ["limit"],
            registry=r,
        )
        r.register(_Tasks())

    async def probe_loop_lag(self, interval: float = LAG_INTERVAL) -> None:
        """Observe how late a sleep of `interval` wakes, until cancelled. Every latency the
        provider reports (a status, a dispatch) includes any time the loop was held by one
        task; this says whether a tail is that, or waiting on an apiserver."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval)
            self.loop_lag_seconds.observe(max(0.0, loop.time() - start - interval))

    def sync_children(self) -> dict[str, Histogram]:
        """`sync_seconds` by result, looked up once: `labels()` takes a lock and builds a key on
        every call, several times per pod in a burst."""
        return {result: self.sync_seconds.labels(result) for result in ("ok", "conflict", "parked", "error")}

    def queue_waits(self, queue: str) -> Callable[[float, bool], None]:
        """What a WorkQueue calls with each key's wait and whether it was urgent."""

        # The children looked up once: `labels()` takes a lock and builds a key on every call.
        urgent_wait, plain_wait = (self.queue_wait_seconds.labels(queue, lane) for lane in ("urgent", "plain"))

        def observe(seconds: float, urgent: bool) -> None:
            (urgent_wait if urgent else plain_wait).observe(seconds)

        return observe

    def track_api_calls(self, source: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_ApiCalls(source))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
