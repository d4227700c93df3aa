"""Reading our pods' metrics from one member's Metrics API (`metrics.k8s.io/v1beta1` PodMetrics,
served by the member's own metrics-server), about once per member per `interval` at most.

However often the provider is scraped (metrics-server every resolution, Prometheus beside it,
one scrape per virtual node), a member is asked once per interval, by label selector for our
pods only; concurrent scrapes wait for the one read in flight. A credential that may not list
PodMetrics across the member (a tenant's) reads them namespace by namespace, in the namespaces
our pods are in. A member without a Metrics API, or one that refuses it, is logged once per
change and read again an interval later; its pods are left out of the stats meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vkprovider import logs
from vkprovider.kube import ApiError, Forbidden, KubeClient

API = "/apis/metrics.k8s.io/v1beta1"

#: (member namespace, member pod name) -> its PodMetrics
Samples = dict[tuple[str, str], dict[str, Any]]

#: The part of the interval a read stays fresh for, counted from when it began. A scraper on the
#: same period as the interval (metrics-server at 10 s against the default 10 s) comes back a
#: little early or late by its own and our scheduling; were a read fresh for the whole interval
#: from when it ended, every other scrape would get the last one's samples, twice as old.
FRESH = 0.9


@dataclass
class _Cached:
    at: float = -float("inf")  # monotonic time of the last read
    samples: Samples = field(default_factory=dict)
    per_namespace: bool = False  # the member refused a list across it
    problem: str = ""  # why the last read failed ("" when it did not)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MetricsReader:
    def __init__(self, *, interval: float, selector: Callable[[], str], clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._selector = selector
        self._clock = clock
        self._members: dict[str, _Cached] = {}
        #: Reads per member and outcome ("ok", or the failure's kind), for the provider's metrics.
        self.reads: dict[tuple[str, str], int] = {}
        self._log = logs.get("member-usage")

    async def samples(self, member: str, client: KubeClient, namespaces: set[str]) -> Samples:
        """Our pods' PodMetrics in `member`, read at most once per interval."""
        cached = self._members.setdefault(member, _Cached())
        async with cached.lock:
            started = self._clock()
            if started - cached.at < self.interval * FRESH:
                return cached.samples
            try:
                cached.samples = await self._read(cached, client, namespaces)
                outcome = "ok"
                problem = ""
            except ApiError as exc:
                cached.samples = {}
                outcome = type(exc).__name__
                problem = str(exc)
            cached.at = started
            self.reads[(member, outcome)] = self.reads.get((member, outcome), 0) + 1
            if problem != cached.problem:
                if problem:
                    self._log.warning("member metrics unreadable; its pods show no usage", member=member, error=problem)
                else:
                    self._log.info("member metrics readable again", member=member)
                cached.problem = problem
            return cached.samples

    async def _read(self, cached: _Cached, client: KubeClient, namespaces: set[str]) -> Samples:
        params = {"labelSelector": self._selector()}
        if not cached.per_namespace:
            try:
                return _index(await client.get(f"{API}/pods", params=params))
            except Forbidden:
                cached.per_namespace = True
        out: Samples = {}
        for namespace in sorted(namespaces):
            out.update(_index(await client.get(f"{API}/namespaces/{namespace}/pods", params=params)))
        return out

    def forget(self, member: str) -> None:
        self._members.pop(member, None)


def _index(listed: dict[str, Any]) -> Samples:
    out: Samples = {}
    for item in listed.get("items") or []:
        meta = item.get("metadata") or {}
        out[(meta.get("namespace", ""), meta.get("name", ""))] = item
    return out
