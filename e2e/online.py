"""Online load for member clusters: high-priority Deployments whose CPU requests take a chosen
share of a member's allocatable CPU, so its spare capacity rises and falls like tidal traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vkprovider.kube import AlreadyExists, KubeClient, NotFound, load_kubeconfig

NAMESPACE = "online"
PRIORITY_CLASS = "online-high"
#: The same priority, for online services that wait for room rather than preempt.
PATIENT_CLASS = "online-patient"
MEMORY_PER_CORE_GI = 2


class LoadError(ValueError):
    """The requested load cannot be expressed or applied."""


@dataclass(frozen=True)
class LoadResult:
    name: str
    replicas: int
    pod_cpu: float
    allocatable_cpu: float
    running: int | None

    def describe(self) -> str:
        share = self.replicas * self.pod_cpu / self.allocatable_cpu if self.allocatable_cpu else 0.0
        text = (
            f"online/{self.name}: {self.replicas} replicas x {self.pod_cpu:g} CPU = "
            f"{share:.0%} of {self.allocatable_cpu:g} allocatable CPU"
        )
        return text + (f", {self.running} running" if self.running is not None else "")


def parse_share(text: str) -> float:
    """'60%' or '0.6' -> 0.6; refuses anything outside 0..100%."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError as exc:
        raise LoadError(f"cannot read {text!r} as a share of CPU (use 60% or 0.6)") from exc
    if not 0.0 <= value <= 1.0:
        raise LoadError(f"a share of CPU must be between 0% and 100%, not {text}")
    return value


def cpu_cores(quantity: str) -> float:
    """Kubernetes CPU quantity -> cores ('95', '95500m', '0.5')."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def replicas_for(*, share: float, allocatable_cpu: float, pod_cpu: float) -> int:
    """Pure: replicas whose requests come nearest to `share` of the allocatable CPU."""
    if pod_cpu <= 0:
        raise LoadError("the CPU of one online replica must be positive")
    return max(0, math.floor(share * allocatable_cpu / pod_cpu + 0.5))


def schedulable_cpu(nodes: list[dict[str, Any]]) -> float:
    total = 0.0
    for node in nodes:
        if node.get("spec", {}).get("unschedulable"):
            continue
        conditions = node.get("status", {}).get("conditions", [])
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            continue
        total += cpu_cores(node.get("status", {}).get("allocatable", {}).get("cpu", "0"))
    return total


def deployment(name: str, replicas: int, pod_cpu: float, *, preempting: bool = True) -> dict[str, Any]:
    cpu = f"{int(pod_cpu * 1000)}m"
    memory = f"{int(pod_cpu * MEMORY_PER_CORE_GI * 1024)}Mi"
    labels = {"app": f"online-{name}", "vkprovider.io/lab-load": "online"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": PRIORITY_CLASS if preempting else PATIENT_CLASS,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.example/online/web:1",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}},
                        }
                    ],
                },
            },
        },
    }


async def set_load(
    kubeconfig: Path,
    *,
    cpu_share: float,
    pod_cpu: float = 4.0,
    name: str = "web",
    wait: bool = False,
    timeout: float = 120.0,
    preempting: bool = True,
    replicas: int | None = None,
) -> LoadResult:
    """Create or scale the online Deployment `name` to `cpu_share` of the member's CPU (or to
    `replicas`). Its pods preempt lower priorities when they find no room, unless `preempting`
    is off: then they wait (preemptionPolicy Never), as some online services choose."""
    async with KubeClient(load_kubeconfig(kubeconfig), user_agent="vkprovider-lab-online") as client:
        nodes = (await client.list("/api/v1/nodes"))["items"]
        allocatable = schedulable_cpu(nodes)
        if replicas is None:
            replicas = replicas_for(share=cpu_share, allocatable_cpu=allocatable, pod_cpu=pod_cpu)
        with contextlib.suppress(AlreadyExists):
            await client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        if not preempting:
            patient = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": PATIENT_CLASS},
                "value": 1000000,
                "preemptionPolicy": "Never",
                "description": "Online services of the lab that wait for room instead of preempting.",
            }
            with contextlib.suppress(AlreadyExists):
                await client.create("/apis/scheduling.k8s.io/v1/priorityclasses", patient)
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        body = deployment(name, replicas, pod_cpu, preempting=preempting)
        try:
            await client.patch(
                f"{path}/{name}",
                {"spec": {"replicas": replicas, "template": body["spec"]["template"]}},
                patch_type="strategic",
            )
        except NotFound:
            await client.create(path, body)
        running = await _wait_running(client, name, replicas, timeout) if wait else None
        return LoadResult(name, replicas, pod_cpu, allocatable, running)


async def _wait_running(client: KubeClient, name: str, replicas: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    selector = f"app=online-{name}"
    while True:
        pods = (await client.list(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": selector}))["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        running = sum(1 for p in live if p.get("status", {}).get("phase") == "Running")
        # Settled: the replicas run and the ones scaled away are gone (terminating pods still
        # hold their nodes).
        if running == replicas and len(pods) == replicas:
            return running
        if time.monotonic() > deadline:
            raise LoadError(f"online/{name}: {running} of {replicas} replicas running after {timeout:.0f}s")
        await asyncio.sleep(0.25)
