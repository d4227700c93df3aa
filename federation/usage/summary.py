"""Our pods' usage as the kubelet reports it (pure): the members' Metrics API samples
(`metrics.k8s.io/v1beta1` PodMetrics) turned into a `stats/v1alpha1` Summary of a virtual node.

A member's Metrics API gives each container's CPU as a rate (cores over the sample's window) and
its working set; a kubelet reports cumulative CPU time, and metrics-server takes the rate
between two of its scrapes. So the rates are integrated into counters (`CpuCounters`), sample
by sample at the member's own timestamps: between two samples the counter grows by the later
rate times the time between them, and metrics-server's rate over that span is the member's.
A counter starts as if the container had run at its first rate since it started (as a fresh
container's cgroup counter would read), and restarts from there when its member pod is new.

A pod with no sample yet (just started, or its member has no Metrics API) is left out, as a
kubelet leaves out a container it has no stats of; the node's figures are the sums of its pods.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from federation.capacity.quantities import QuantityError, parse
from vkprovider.times import epoch, rfc3339

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def seconds_of(duration: str | None) -> float:
    """A Go duration as metav1.Duration writes it ('10.027s', '1m0s') in seconds; 0 if none."""
    if not duration:
        return 0.0
    return sum(float(value) * _UNIT_SECONDS[unit] for value, unit in _DURATION.findall(duration))


def _nanocores(quantity: str | None) -> int:
    try:
        return int(parse(quantity or "0") * Decimal(10**9))
    except QuantityError:
        return 0


def _bytes(quantity: str | None) -> int:
    try:
        return int(parse(quantity or "0"))
    except QuantityError:
        return 0


@dataclass(frozen=True, kw_only=True)
class ContainerSample:
    name: str
    nanocores: int  # CPU in use, in billionths of a core
    working_set: int  # bytes
    started: float | None  # when the container (last) started, epoch seconds


@dataclass(frozen=True, kw_only=True)
class PodSample:
    """One member sample of one of our pods, named as the front-end pod it runs."""

    namespace: str
    name: str
    uid: str  # the front-end pod's
    member_uid: str  # its member pod's: a new member pod starts new counters
    started: float | None
    at: float  # when the member measured it, epoch seconds
    window: float  # seconds the rate is averaged over
    containers: tuple[ContainerSample, ...]


def pod_sample(front_key: str, member_pod: dict[str, Any], metrics: dict[str, Any], uid: str) -> PodSample | None:
    """The sample of front-end pod `front_key` from its member pod and that pod's PodMetrics;
    None when the metrics carry no time (nothing to integrate from)."""
    at = epoch(metrics.get("timestamp"))
    if at is None:
        return None
    status = member_pod.get("status") or {}
    started_at: dict[str, float | None] = {}
    for cs in status.get("containerStatuses") or []:
        running = (cs.get("state") or {}).get("running") or {}
        started_at[cs.get("name", "")] = epoch(running.get("startedAt"))
    pod_started = epoch(status.get("startTime"))
    containers = tuple(
        ContainerSample(
            name=c.get("name", ""),
            nanocores=_nanocores((c.get("usage") or {}).get("cpu")),
            working_set=_bytes((c.get("usage") or {}).get("memory")),
            started=started_at.get(c.get("name", "")) or pod_started,
        )
        for c in metrics.get("containers") or []
    )
    namespace, _, name = front_key.partition("/")
    return PodSample(
        namespace=namespace,
        name=name,
        uid=uid,
        member_uid=(member_pod.get("metadata") or {}).get("uid", ""),
        started=pod_started,
        at=at,
        window=seconds_of(metrics.get("window")),
        containers=containers,
    )


class CpuCounters:
    """Cumulative CPU core-nanoseconds per container of our pods, integrated from the samples."""

    def __init__(self) -> None:
        #: (member pod uid, container) -> (time of the last sample, core-nanoseconds until then)
        self._totals: dict[tuple[str, str], tuple[float, float]] = {}
        #: node -> (time of its last sample, core-nanoseconds until then): a counter of its own,
        #: so that a pod leaving the node does not make it go back.
        self._nodes: dict[str, tuple[float, float]] = {}

    def advance(self, member_uid: str, sample: ContainerSample, at: float, window: float) -> int:
        key = (member_uid, sample.name)
        last = self._totals.get(key)
        if last is None:
            # As if it had run at this rate since it started (at least over the sample's window).
            ran = at - sample.started if sample.started is not None else window
            total = sample.nanocores * max(ran, window, 0.0)
        elif at > last[0]:
            total = last[1] + sample.nanocores * (at - last[0])
        else:
            return int(last[1])  # the same sample again: the counter stands
        self._totals[key] = (at, total)
        return int(total)

    def advance_node(self, node: str, nanocores: int, at: float, start: int) -> int:
        """The node's counter: from `start` (its pods' sum) at first, then integrated."""
        last = self._nodes.get(node)
        if last is None:
            total = float(start)
        elif at > last[0]:
            total = last[1] + nanocores * (at - last[0])
        else:
            return int(last[1])
        self._nodes[node] = (at, total)
        return int(total)

    def keep_only(self, member_uids: set[str]) -> None:
        """Forget the counters of member pods no longer sampled."""
        for key in [k for k in self._totals if k[0] not in member_uids]:
            del self._totals[key]

    def __len__(self) -> int:
        return len(self._totals)


def _cpu(at: str, nanocores: int, total: int) -> dict[str, Any]:
    return {"time": at, "usageNanoCores": nanocores, "usageCoreNanoSeconds": total}


def _memory(at: str, working_set: int) -> dict[str, Any]:
    return {"time": at, "workingSetBytes": working_set, "usageBytes": working_set}


def summary(node_name: str, samples: list[PodSample], counters: CpuCounters, node_started: float) -> dict[str, Any]:
    """The node's Summary: each sampled pod, its containers, and the node as their sum."""
    pods: list[dict[str, Any]] = []
    node_cpu = node_total = node_memory = 0
    latest = node_started
    for sample in sorted(samples, key=lambda s: (s.namespace, s.name)):
        at = rfc3339(sample.at)
        latest = max(latest, sample.at)
        containers = []
        pod_cpu = pod_total = pod_memory = 0
        for c in sample.containers:
            total = counters.advance(sample.member_uid, c, sample.at, sample.window)
            entry: dict[str, Any] = {"name": c.name, "cpu": _cpu(at, c.nanocores, total)}
            entry["memory"] = _memory(at, c.working_set)
            if c.started is not None:
                entry["startTime"] = rfc3339(c.started)
            containers.append(entry)
            pod_cpu, pod_total, pod_memory = pod_cpu + c.nanocores, pod_total + total, pod_memory + c.working_set
        pod: dict[str, Any] = {
            "podRef": {"name": sample.name, "namespace": sample.namespace, "uid": sample.uid},
            "containers": containers,
            "cpu": _cpu(at, pod_cpu, pod_total),
            "memory": _memory(at, pod_memory),
        }
        if sample.started is not None:
            pod["startTime"] = rfc3339(sample.started)
        pods.append(pod)
        node_cpu, node_total, node_memory = node_cpu + pod_cpu, node_total + pod_total, node_memory + pod_memory
    counters.keep_only({s.member_uid for s in samples})
    stamp = rfc3339(latest)
    node = {
        "nodeName": node_name,
        "startTime": rfc3339(node_started),
        "cpu": _cpu(stamp, node_cpu, counters.advance_node(node_name, node_cpu, latest, node_total)),
        "memory": _memory(stamp, node_memory),
    }
    return {"node": node, "pods": pods}
