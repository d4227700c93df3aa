"""What the provider costs per pod, end to end: pods bound to its pooled virtual node over all the
lab's members, until the front end reports them Running.

The provider runs with audited identities (e2e.audit), so the calls it makes are counted by the
apiservers' own record, front end and members, by verb and resource, not by its own counters.
Its CPU is read from outside (psutil) between the first create and the last Running reported at
the front end plus a settle of the status writes that follow; its idle rate (capacity publishing,
heartbeats) is measured before, and reported both included and taken out.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import NamespaceWatch, Profile, Provider
from e2e import audit
from e2e import lab as lab_mod
from e2e.state import LabState
from federation.config import MemberConfig
from federation.dispatch import forge
from vkprovider.kube import KubeClient, NotFound, ServerError, Unreachable, ensure_namespace, load_kubeconfig

USER = "vkprovider-bench"
PREFIX = MemberConfig.model_fields["namespace_prefix"].default


def pod(name: str, node: str, *, cpu: str = "10m", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "bench/app:1", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def members(lab: LabState) -> list[str]:
    return sorted(name for name in lab.clusters if name != "offline")


def provider_config(lab: LabState, node: str, **federation: Any) -> dict[str, Any]:
    """A federation provider over every member of the lab, all its identities audited."""
    return {
        "kube": {"kubeconfig": str(audit.user_kubeconfig(lab, "offline", USER, groups=("system:masters",)))},
        "node": {"name": node, "provider_id": "federation"},
        "log": {"format": "json", "level": "warning"},
        "provider": {
            "type": "federation",
            "federation": {
                "members": [
                    {"name": m, "kubeconfig": str(audit.user_kubeconfig(lab, m, USER, groups=("system:masters",)))}
                    for m in members(lab)
                ],
                **federation,
            },
        },
    }


async def members_ready(session: aiohttp.ClientSession, port: int, count: int) -> bool:
    async with session.get(f"http://127.0.0.1:{port}/capacity") as resp:
        view = await resp.json()
    return sum(1 for m in view.get("members", {}).values() if m.get("free")) >= count


class AuditWindow:
    """The provider's calls to each cluster between `start` and `stop`, from the audit logs."""

    def __init__(self, lab: LabState) -> None:
        self.lab = lab
        self._since = 0.0
        self._until = 0.0

    def start(self) -> None:
        self._since = time.time()

    def stop(self) -> None:
        self._until = time.time()

    def calls(self, cluster: str) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for rec in audit.records(self.lab, cluster, users={USER}):
            if self._since <= rec.received <= self._until:
                what = rec.resource + (f"/{rec.subresource}" if rec.subresource else "")
                out[f"{rec.verb} {what}"] += 1
        return out

    def per_pod(self, pods: int) -> dict[str, dict[str, float]]:
        """Calls per pod by verb and resource: the front end, and all members together."""
        front = self.calls("offline")
        member: collections.Counter[str] = collections.Counter()
        for name in members(self.lab):
            member.update(self.calls(name))

        def ratio(counter: collections.Counter[str]) -> dict[str, float]:
            return {k: round(v / pods, 3) for k, v in sorted(counter.items())}

        def writes(counter: collections.Counter[str]) -> float:
            return round(sum(v for k, v in counter.items() if k.split()[0] in audit.WRITE_VERBS) / pods, 3)

        return {
            "front_end": ratio(front),
            "members": ratio(member),
            "writes": {"front_end": writes(front), "members": writes(member)},
        }


class Cpu:
    """One process's CPU seconds, read from outside."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)

    def seconds(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def system(self) -> float:
        return float(self.proc.cpu_times().system)

    async def idle_cores(self, seconds: float) -> float:
        before, started = self.seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        return (self.seconds() - before) / (time.monotonic() - started)

    def rss(self) -> int:
        return int(self.proc.memory_info().rss)

    def minor_faults(self) -> int:
        """Pages the process touched for the first time (fresh mappings, heap growth): each one
        a trap and a zeroed page, CPU that shows as system time."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[7])  # field 10, minflt


class Phases(NamespaceWatch):
    """Times each pod in a namespace was first seen in a phase, by a watch."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        name_of: Callable[[dict[str, Any]], str] | None = None,
        selector: str = "",
    ) -> None:
        super().__init__(client, namespace, selector=selector)
        self._name_of = name_of or (lambda obj: str(obj["metadata"]["name"]))
        self.seen: dict[str, dict[str, float]] = collections.defaultdict(dict)

    def count(self, phase: str) -> int:
        return sum(1 for phases in self.seen.values() if phase in phases)

    def times(self, phase: str) -> Iterator[tuple[str, float]]:
        for name, phases in self.seen.items():
            if phase in phases:
                yield name, phases[phase]

    def observed(self, obj: dict[str, Any]) -> None:
        phase = (obj.get("status") or {}).get("phase")
        if phase:
            self.seen[self._name_of(obj)].setdefault(phase, time.monotonic())

    async def settle(self, phase: str, count: int, *, quiet: float = 30.0, timeout: float = 3600) -> int:
        """Wait until `count` pods are in `phase`, or until no more reach it for `quiet` seconds
        (pods a member cannot place stay Pending, with its scheduler's reason): how many did."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while (now := self.count(phase)) < count and time.monotonic() < deadline:
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > quiet:
                break
            await asyncio.sleep(0.2)
        return self.count(phase)

    async def wait(self, phase: str, count: int, *, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while self.count(phase) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count(phase)} of {count} pods {phase} after {timeout}s")
            await asyncio.sleep(0.05)
        return max(t for _, t in self.times(phase))


async def create_all(client: KubeClient, namespace: str, bodies: list[dict[str, Any]], *, limit: int = 100) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(body: dict[str, Any]) -> None:
        async with gate:
            await client.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await asyncio.gather(*(one(b) for b in bodies))


async def clean(lab: LabState, front: KubeClient, namespace: str, *, timeout: float = 600) -> None:
    """Delete a namespace's pods and the namespace, and wait until no member holds their copies."""
    try:
        await front.delete(f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": "0"})
    except (ServerError, Unreachable):
        pass  # 10,000 pods take the apiserver longer than a request may last; it goes on deleting
    await front.delete(f"/api/v1/namespaces/{namespace}")
    member_ns = forge.member_namespace(namespace, PREFIX)
    deadline = time.monotonic() + timeout
    for name in members(lab):
        async with KubeClient(load_kubeconfig(lab.kubeconfig(name))) as member:
            while time.monotonic() < deadline:
                try:
                    if not (await member.list(f"/api/v1/namespaces/{member_ns}/pods"))["items"]:
                        break
                except NotFound:
                    break
                await asyncio.sleep(0.5)


@asynccontextmanager
async def provider(
    lab: LabState, workdir: Path, node: str, *, pods: dict[str, Any] | None = None, **federation: Any
) -> Any:
    """The provider on `node`, federation settings from `federation`, pod controller ones from `pods`."""
    config = provider_config(lab, node, **federation)
    if pods:
        config["pods"] = pods
    count = len(members(lab))

    async def ready(session: aiohttp.ClientSession, port: int) -> bool:
        return await members_ready(session, port, count)

    async with Provider(config, workdir, ready=ready) as proc:
        yield proc


async def dispatched(
    state: Path, workdir: Path, count: int, *, profile: Path | None = None, idle_window: float = 10.0
) -> dict[str, Any]:
    """`count` plain pods bound to the pooled node until the front end shows them Running."""
    lab = lab_mod.load_running(state)
    node = f"vk-e2e-{uuid.uuid4().hex[:5]}"
    async with (
        provider(lab, workdir, node) as proc,
        KubeClient(load_kubeconfig(lab.kubeconfig("offline")), connection_limit=200) as front,
    ):
        cpu = Cpu(proc.pid)
        await asyncio.sleep(3)  # the first publications and namespace checks after start
        idle = await cpu.idle_cores(idle_window)
        ns = f"e2e-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(front, ns)
        window = AuditWindow(lab)
        async with Phases(front, ns) as phases:
            with Profile(proc.pid, profile):
                window.start()
                before, started, system, faults = cpu.seconds(), time.monotonic(), cpu.system(), cpu.minor_faults()
                created = time.monotonic()
                await create_all(front, ns, [pod(f"p{i:05d}", node) for i in range(count)])
                created = time.monotonic() - created
                last = await phases.wait("Running", count)
                await asyncio.sleep(2.0)  # writes that follow the last Running (member annotation, conditions)
                used, wall, system = cpu.seconds() - before, time.monotonic() - started, cpu.system() - system
                faults = cpu.minor_faults() - faults
                window.stop()
        await clean(lab, front, ns)
    net = used - idle * wall
    return {
        "pods": count,
        "members": len(members(lab)),
        "created_s": round(created, 1),
        "all_running_s": round(last - started, 1),
        "provider_idle_cores": round(idle, 3),
        "provider_cpu_ms_per_pod": round(used / count * 1000, 2),
        "provider_cpu_ms_per_pod_less_idle": round(net / count * 1000, 2),
        "provider_system_share": round(system / used, 2),
        "provider_minor_faults_per_pod": round(faults / count, 1),
        "calls_per_pod": window.per_pod(count),
    }
