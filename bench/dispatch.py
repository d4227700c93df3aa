"""Benchmark: dispatch throughput and added latency, side by side with a ceiling in one run.

Ceiling: the same client creates the same pods straight in the member's apiserver. Ours: pods
are created already bound to the virtual node in the front end (so the front-end scheduler is
not measured) and the provider dispatches them to the member; a watch on the member times when
each arrives. Each phase has a namespace of its own; the floors make theirs in the member before
the clock starts, and for the provider one first pod does the same (the member namespace and
its service account readied), reported apart as `first_pod_ms`. Phases (--phases):
  - burst: the ceiling, then N plain pods through the provider: pods/s and ratio to the ceiling;
  - floor: the least any dispatcher must do per pod (front-end create, member create, one status
    write), done by this client with no provider, as a burst and (with paced) at each rate: what
    this machine allows a provider that costs nothing;
  - paced: N pods offered at each of --rates pods/s: added latency (bound in the front end ->
    created in the member) p50/p90/p99, and the watch hop (bound -> seen by a watch of the front
    end); with floor, the same pods dispatched by this client with no provider, twice: "watched"
    (each created in the member when the front end's watch brings it, as any kubelet must learn
    of its pods: the floor the targets are read against) and "direct" (as soon as the front-end
    create is answered, a hop no kubelet can skip: kept to compare with earlier runs);
  - gang: a 512-pod gang, from its last pod bound to all created in the member, and to all
    bound there by the member's scheduler;
  - compare: --repeats rounds, each a burst and the floor's burst, then at each rate paced pods
    through the provider and by both floors: the medians of the rounds' ratios (issue 14: burst
    at least 95 % of the floor; added p99 within 1.5 x the watched floor's);
  - endtoend: N plain pods on a provider's pooled node over all the lab's members, from bound
    to Running reported at the front end (bench.endtoend): the provider's CPU per pod and the
    API calls per pod by verb, front end and members, from the apiservers' audit logs; then the
    same pods through bench.cpufloor (only the API work, no provider logic): its CPU per pod and
    the provider's ratio to it; --repeats rounds, in alternating order, and their medians;
  - relayfloor: with member-1 as the only member, on the same lab one after the other (never two
    at once), each started and warmed up with --relay-warm-up pods before the window, then
    --relay-pods pods bound to its node until Running at the front end: the CPU per pod of the
    provider, of the lean relay floor (bench.relayfloor: aiohttp and orjson, none of our code),
    each with every loop of --relay-loops, and of the client floor (bench.cpufloor, our client,
    asyncio's loop); the provider's ratio to each floor; --repeats rounds, order reversed every
    other round, and their medians (issue 39: the provider at most 1.3 x the lean floor); all
    their API calls per pod from the audit logs; with --profile-relay, each relay py-spied in
    its window.
Every phase reports each lab process's CPU in cores (1.0 = one core of the machine's two).
Targets (issue 5): at least 70 % of the ceiling's throughput; added p99 under 250 ms at 100/s.
Run: `.venv/bin/python -m bench.dispatch [--state DIR] [--pods 1000] [--rates 20,50,100]
[--workers N] [--phases burst,floor,paced,gang] [--profile FILE]`; the relay floor alone:
`--phases relayfloor --repeats 3 --relay-loops asyncio,uvloop --state DIR [--profile-relay FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp

from bench import cpufloor, endtoend
from bench.common import CpuMeter, NamespaceWatch, Profile, Provider, lab_pids, on_lab, per_pod
from e2e import audit
from e2e import lab as lab_mod
from e2e.state import LabState
from federation.config import MemberConfig
from federation.dispatch import forge
from vkprovider.kube import ApiError, KubeClient, NotFound, ensure_namespace, load_kubeconfig
from vkprovider.settings import PodSettings

MEMBER = "member-1"
FLOOR_NODE = "vk-floor-nowhere"  # the floor's pods are bound to a node no provider serves
PREFIX = MemberConfig.model_fields["namespace_prefix"].default  # the bench's member uses the default


def _pod(name: str, *, node: str | None, group: str | None = None, cpu: str = "100m") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "bench/app:1", "resources": {"requests": {"cpu": cpu}}}],
    }
    if node:
        spec["nodeName"] = node
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": name}, "spec": spec}


class Arrivals(NamespaceWatch):
    """Times at which pods appear (ADDED) and get bound (nodeName set) in one namespace."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        super().__init__(client, namespace)
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}

    def observed(self, obj: dict[str, Any]) -> None:
        name, now = obj["metadata"].get("name"), time.monotonic()
        self.added.setdefault(name, now)
        if obj.get("spec", {}).get("nodeName"):
            self.bound.setdefault(name, now)

    async def wait(self, count: int, *, bound: bool = False, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        source = self.bound if bound else self.added
        while len(source) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(source)} of {count} pods after {timeout}s")
            await asyncio.sleep(0.02)
        return max(source.values())


class Relay(NamespaceWatch):
    """When each pod is first seen by a watch of the front end; with `relay`, the watched floor:
    each pod handed on to the member as it is seen (its tasks awaited by `drain`)."""

    def __init__(
        self, client: KubeClient, namespace: str, relay: Callable[[str, str], Coroutine[Any, Any, None]] | None
    ) -> None:
        super().__init__(client, namespace)
        self.relay = relay
        self.seen: dict[str, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def observed(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name in self.seen:
            return
        self.seen[name] = time.monotonic()
        if self.relay is not None:
            coro = self.relay(self.namespace, name)
            self.tasks.append(asyncio.get_running_loop().create_task(coro, name=f"bench-relay/{name}"))

    async def drain(self) -> None:
        await asyncio.gather(*self.tasks)


def _quantiles(prefix: str, values: list[float]) -> dict[str, float]:
    """p50, p90 and p99 of sorted seconds, in ms."""
    at = {"p50": statistics.median(values), **{f"p{q}": values[int(len(values) * q / 100) - 1] for q in (90, 99)}}
    return {f"{prefix}_{q}": round(v * 1000, 1) for q, v in at.items()}


async def _burst(client: KubeClient, namespace: str, bodies: list[dict[str, Any]]) -> dict[str, float]:
    created: dict[str, float] = {}
    limit = asyncio.Semaphore(100)

    async def one(body: dict[str, Any]) -> None:
        async with limit:
            await client.create(f"/api/v1/namespaces/{namespace}/pods", body)
            created[body["metadata"]["name"]] = time.monotonic()

    await asyncio.gather(*(one(b) for b in bodies))
    return created


async def _provider_ready(session: aiohttp.ClientSession, port: int) -> bool:
    async with session.get(f"http://127.0.0.1:{port}/capacity") as resp:
        view = await resp.json()
    return bool(view.get("members", {}).get(MEMBER, {}).get("free"))


class Bench:
    """One provider on the front end with one member; each phase in its own namespace."""

    def __init__(self, front: KubeClient, member: KubeClient, provider: Provider, meter: CpuMeter, node: str) -> None:
        self.front, self.member, self.provider, self.meter, self.node = front, member, provider, meter, node
        self.profile: Path | None = None

    async def _clean(self, client: KubeClient, ns: str) -> None:
        """Delete a phase's namespace and wait until its pods are gone everywhere, so the
        next phase does not share the machine with this one's deletions."""
        await client.delete(f"/api/v1/namespaces/{ns}")
        for _ in range(600):
            try:
                await client.get(f"/api/v1/namespaces/{ns}")
            except NotFound:
                break
            await asyncio.sleep(0.2)
        member_ns = ns if client is self.member else forge.member_namespace(ns, PREFIX)
        for _ in range(600):
            if not (await self.member.list(f"/api/v1/namespaces/{member_ns}/pods"))["items"]:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)

    async def ceiling(self, count: int) -> dict[str, Any]:
        """The same client creating the same pods straight in the member."""
        ns = f"ceil-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(self.member, ns)
        async with Arrivals(self.member, ns) as arrivals:
            self.meter.start()
            started = time.monotonic()
            await _burst(self.member, ns, [_pod(f"p{i:05d}", node=None) for i in range(count)])
            last = await arrivals.wait(count)
            cores = self.meter.stop()
        await self._clean(self.member, ns)
        return {"pods_per_s": round(count / (last - started), 1), "cores": cores}

    async def burst(self, count: int) -> dict[str, Any]:
        """Bound in the front end, dispatched by the provider, as fast as the client can create."""
        ns = f"burst-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(self.front, ns)
        async with Arrivals(self.member, ns) as arrivals:
            first = await self._first_pod(ns, arrivals)
            before = await self.provider.counters()
            with Profile(self.provider.pid, self.profile):
                self.meter.start()
                started = time.monotonic()
                await _burst(self.front, ns, [_pod(f"p{i:05d}", node=self.node) for i in range(count)])
                last = await arrivals.wait(count + 1)
                cores = self.meter.stop()
        await asyncio.sleep(2)  # status writes that follow the last create
        after = await self.provider.counters()
        await self._clean(self.front, ns)
        return {
            "pods_per_s": round(count / (last - started), 1),
            "cores": cores,
            "per_pod": per_pod(before, after, count),
            "first_pod_ms": first,
        }

    async def _first_pod(self, ns: str, arrivals: Arrivals) -> float:
        """One pod through the provider before the clock starts, so the timed pods find their
        member namespace ready (created, its service account made by the member's controller),
        as the floors' member namespace is made before theirs; how long it took, in ms (what
        the first pod of a new namespace waits)."""
        started = time.monotonic()
        await self.front.create(f"/api/v1/namespaces/{ns}/pods", _pod("first", node=self.node))
        await arrivals.wait(1)
        return round((arrivals.added["first"] - started) * 1000, 1)

    async def _by_hand(self, ns: str, name: str, created: dict[str, float]) -> None:
        """One pod the way the direct floor dispatches it: created bound in the front end (to a
        node no provider serves), then at once in the member, then its status written back once."""
        await self.front.create(f"/api/v1/namespaces/{ns}/pods", _pod(name, node=FLOOR_NODE))
        created[name] = time.monotonic()
        await self._relay(ns, name)

    async def _relay(self, ns: str, name: str) -> None:
        await self.member.create(f"/api/v1/namespaces/{ns}/pods", _pod(name, node=None))
        status = {"status": {"phase": "Running", "hostIP": "127.0.0.1", "podIP": "10.0.0.1"}}
        await self.front.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", status)

    async def _clean_floor(self, ns: str) -> None:
        await self._clean(self.member, ns)
        await self.front.delete(f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": 0})
        await self._clean(self.front, ns)

    async def floor(self, count: int) -> dict[str, Any]:
        """The least any dispatcher must do per pod (`_by_hand`), done by this client with no
        provider: what the burst could reach on this machine if the provider cost nothing."""
        ns = f"floor-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(self.front, ns)
        await ensure_namespace(self.member, ns)
        limit = asyncio.Semaphore(100)
        created: dict[str, float] = {}

        async def one(i: int) -> None:
            async with limit:
                await self._by_hand(ns, f"p{i:05d}", created)

        async with Arrivals(self.member, ns) as arrivals:
            self.meter.start()
            started = time.monotonic()
            await asyncio.gather(*(one(i) for i in range(count)))
            last = await arrivals.wait(count)
            cores = self.meter.stop()
        await self._clean_floor(ns)
        return {"pods_per_s": round(count / (last - started), 1), "cores": cores}

    async def paced(self, count: int, rate: float, *, floor: str = "") -> dict[str, Any]:
        """Offered at `rate` pods/s: added latency per pod, bound in the front end (the create
        answered) -> in the member. `floor` dispatches them with no provider: "direct" creates
        each in the member as soon as its front-end create is answered, "watched" when a watch of
        the front end brings it, as any kubelet learns of a pod bound to its node. Beside it, the
        watch hop: from the front-end create answered to the pod seen by a watch of the front end."""
        ns = f"paced-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(self.front, ns)
        if floor:
            await ensure_namespace(self.member, ns)
        created: dict[str, float] = {}
        front = Relay(self.front, ns, self._relay if floor == "watched" else None)
        async with Arrivals(self.member, ns) as arrivals, front:
            first = None if floor else await self._first_pod(ns, arrivals)
            tasks = []
            self.meter.start()
            t0 = time.monotonic()
            for i in range(count):
                await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                body = _pod(f"p{i:05d}", node=FLOOR_NODE if floor else self.node)

                async def one(body: dict[str, Any] = body) -> None:
                    name = body["metadata"]["name"]
                    if floor == "direct":
                        await self._by_hand(ns, name, created)
                        return
                    await self.front.create(f"/api/v1/namespaces/{ns}/pods", body)
                    created[name] = time.monotonic()

                tasks.append(asyncio.create_task(one(), name=f"bench-create/{i}"))
            await asyncio.gather(*tasks)
            await arrivals.wait(count + (0 if floor else 1))
            await front.drain()
            cores = self.meter.stop()
        latencies = sorted(arrivals.added[n] - created[n] for n in created)
        hops = sorted(front.seen[n] - created[n] for n in created)
        await (self._clean_floor(ns) if floor else self._clean(self.front, ns))
        added, hop = _quantiles("added_ms", latencies), _quantiles("hop_ms", hops)
        return {"offered_per_s": rate, **added, **hop, "cores": cores, **({} if floor else {"first_pod_ms": first})}

    async def gang(self, size: int) -> dict[str, Any]:
        """From the gang's last pod bound in the front end to all created, and all bound, in the member."""
        ns = f"gang-{uuid.uuid4().hex[:5]}"
        await ensure_namespace(self.front, ns)
        group = {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "big"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": size}}},
        }
        await self.front.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", group)
        before = await self.provider.counters()
        async with Arrivals(self.member, ns) as arrivals:
            self.meter.start()
            created = await _burst(
                self.front, ns, [_pod(f"g{i:04d}", node=self.node, group="big", cpu="1") for i in range(size)]
            )
            last_bound = max(created.values())
            all_created = await arrivals.wait(size)
            all_bound = await arrivals.wait(size, bound=True)
            cores = self.meter.stop()
        await asyncio.sleep(2)  # status writes that follow
        after = await self.provider.counters()
        await self._clean(self.front, ns)
        return {
            "pods": size,
            "created_in_member_s": round(all_created - last_bound, 2),
            "bound_in_member_s": round(all_bound - last_bound, 2),
            "cores": cores,
            "per_pod": per_pod(before, after, size),
        }


async def run(state: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    front_kc, member_kc = state / "kubeconfig" / "offline.yaml", state / "kubeconfig" / f"{MEMBER}.yaml"
    node = f"vk-bench-{uuid.uuid4().hex[:5]}"
    config = {
        "kube": {"kubeconfig": str(front_kc)},
        "node": {"name": node, "provider_id": "federation"},
        "log": {"format": "json", "level": "warning"},
        "pods": {"workers": args.workers},
        "provider": {
            "type": "federation",
            "federation": {"members": [{"name": MEMBER, "kubeconfig": str(member_kc)}]},
        },
    }
    result: dict[str, Any] = {"pods": args.pods, "member": MEMBER, "workers": args.workers}
    async with (
        Provider(config, workdir, ready=_provider_ready) as provider,
        KubeClient(load_kubeconfig(front_kc), connection_limit=200) as front,
        KubeClient(load_kubeconfig(member_kc), connection_limit=200) as member,
    ):
        meter = CpuMeter({"bench": os.getpid(), "provider": provider.pid, **lab_pids(state, ["offline", MEMBER])})
        bench = Bench(front, member, provider, meter, node)
        bench.profile = args.profile
        phases = args.phases.split(",")
        if "burst" in phases:
            result["ceiling"] = await bench.ceiling(args.pods)
            result["burst"] = await bench.burst(args.pods)
            result["burst"]["ratio_to_ceiling"] = round(
                result["burst"]["pods_per_s"] / result["ceiling"]["pods_per_s"], 2
            )
        if "floor" in phases:
            result["floor"] = await bench.floor(args.pods)
            if "ceiling" in result:
                result["floor"]["ratio_to_ceiling"] = round(
                    result["floor"]["pods_per_s"] / result["ceiling"]["pods_per_s"], 2
                )
        if "paced" in phases:
            result["paced"] = [await bench.paced(args.pods, float(rate)) for rate in args.rates.split(",")]
        if "floor" in phases and "paced" in phases:
            result["floor_paced"] = [
                await bench.paced(args.pods, float(rate), floor=floor)
                for rate in args.rates.split(",")
                for floor in ("watched", "direct")
            ]
        if "gang" in phases:
            result["gang"] = await bench.gang(512)
        if "compare" in phases:
            result["compare"] = await _compare(bench, args)
    if "endtoend" in phases:
        result.update(await _end_to_end(state, workdir, args))
    if "relayfloor" in phases:
        result["relay_floor"] = await _relay_floor(state, workdir, args)
    result["targets"] = {
        "burst.ratio_to_ceiling": 0.7,
        "paced[100/s].added_ms_p99": 250,
        "relay_floor.median.provider_to_lean_floor": 1.3,
    }
    return result


async def _end_to_end(state: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--repeats rounds of the provider end to end and the same pods through bench.cpufloor
    (only the API work), in alternating order so that a lab slowing down over the run weighs on
    both alike. One round's CPU varies by a third on this machine (the lab's background work),
    so the ratio the target is read against is the median of the rounds'."""
    rounds, providers = [], []
    for i in range(args.repeats):
        (workdir / f"e2e-{i}").mkdir()
        ours = functools.partial(
            endtoend.dispatched, state, workdir / f"e2e-{i}", args.pods, profile=args.profile_e2e if i == 0 else None
        )
        if i % 2 == 0:
            provider = await ours()
            floor = await cpufloor.floor_cpu(state, args.pods)
        else:
            floor = await cpufloor.floor_cpu(state, args.pods)
            provider = await ours()
        providers.append(provider)
        rounds.append(
            {
                "provider_cpu_ms_per_pod": provider["provider_cpu_ms_per_pod"],
                "provider_idle_cores": provider["provider_idle_cores"],
                "floor_cpu_ms_per_pod": floor["cpu_ms_per_pod"],
                "provider_to_cpu_floor": round(provider["provider_cpu_ms_per_pod"] / floor["cpu_ms_per_pod"], 2),
            }
        )
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"end_to_end": providers[0], "end_to_end_rounds": rounds, "end_to_end_median": medians}


async def _running(phases: endtoend.Phases, count: int, alive: Callable[[], bool], *, timeout: float = 600) -> float:
    """When the `count`th pod of the namespace was seen Running; an error if the relay exits."""
    deadline = time.monotonic() + timeout
    while phases.count("Running") < count:
        if not alive():
            raise RuntimeError("the relay under measure exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{phases.count('Running')} of {count} pods Running after {timeout}s")
        await asyncio.sleep(0.05)
    return max(t for _, t in phases.times("Running"))


async def _relayed(
    lab: LabState,
    front: KubeClient,
    ns: str,
    node: str,
    pid: int,
    alive: Callable[[], bool],
    args: argparse.Namespace,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Pods bound to `node` until the front end shows them Running: first --relay-warm-up, then
    (after 5 s of idle rate) --relay-pods in the window; the CPU per pod of process `pid` over
    the window (its marginal cost, started and warmed up), read from outside as the provider's
    is (bench.endtoend), and the relay's writes per pod from the apiservers' audit logs."""
    warm, count = args.relay_warm_up, args.relay_pods
    cpu, window = endtoend.Cpu(pid), endtoend.AuditWindow(lab)
    async with endtoend.Phases(front, ns) as phases:
        await endtoend.create_all(front, ns, [endtoend.pod(f"w{i:05d}", node) for i in range(warm)])
        await _running(phases, warm, alive)
        await asyncio.sleep(2.0)
        idle = await cpu.idle_cores(5.0)
        window.start()
        before, started = cpu.seconds(), time.monotonic()
        with Profile(pid, profile):
            await endtoend.create_all(front, ns, [endtoend.pod(f"p{i:05d}", node) for i in range(count)])
            last = await _running(phases, warm + count, alive)
            await asyncio.sleep(2.0)  # as for the provider end to end: the writes' echoes arrive
            used, wall = cpu.seconds() - before, time.monotonic() - started
        window.stop()
    calls = window.per_pod(count)
    return {
        "cpu_ms_per_pod": round(used / count * 1000, 2),
        "cpu_ms_per_pod_less_idle": round((used - idle * wall) / count * 1000, 2),
        "idle_cores": round(idle, 4),
        "all_running_s": round(last - started, 1),
        "writes_per_pod": calls["writes"],
        "calls_per_pod": {"front_end": calls["front_end"], "members": calls["members"]},
    }


@asynccontextmanager
async def _floor_process(argv: list[str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m argv...` in a session of its own (its own CPU share, as the provider's), once
    it prints `ready`."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", *argv, stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True
        )
    try:
        assert proc.stdout is not None
        if (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() != b"ready":
            raise RuntimeError(f"{argv[0]} did not start; see {log}")
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def _relay_run(
    lab: LabState, front: KubeClient, workdir: Path, kind: str, loop: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One relay of `kind` (provider, lean floor, client floor) on a fresh node and namespace,
    member-1 its only member, audited as bench.endtoend's provider is."""
    node, ns = f"vk-relay-{uuid.uuid4().hex[:5]}", f"relay-{uuid.uuid4().hex[:5]}"
    profile = args.profile_relay and args.profile_relay.with_suffix(f".{workdir.name}.txt")
    await ensure_namespace(front, ns)
    if kind == "provider":
        config = endtoend.provider_config(lab, node)
        federation = config["provider"]["federation"]
        federation["members"] = [m for m in federation["members"] if m["name"] == MEMBER]
        config["runtime"] = {"event_loop": loop}
        async with Provider(config, workdir, ready=_provider_ready) as provider:
            assert provider.proc is not None
            proc = provider.proc
            try:
                return await _relayed(lab, front, ns, node, proc.pid, lambda: proc.poll() is None, args, profile)
            finally:
                await endtoend.clean(lab, front, ns)

    def config_of(cluster: str) -> str:
        return str(audit.user_kubeconfig(lab, cluster, endtoend.USER, groups=("system:masters",)))

    ends = ["--front", config_of("offline"), "--member", config_of(MEMBER), "--node", node]
    if kind == "lean floor":
        argv = ["bench.relayfloor", *ends, "--loop", loop]
    else:
        argv = [
            "bench.cpufloor",
            "serve",
            *ends,
            "--namespace",
            ns,
            "--count",
            str(args.relay_warm_up + args.relay_pods),
        ]
    # A node object, so the front end's pod GC does not take its pods for orphans (bench.cpufloor).
    await front.create("/api/v1/nodes", {"metadata": {"name": node}})
    async with KubeClient(load_kubeconfig(lab.kubeconfig(MEMBER))) as member:
        await ensure_namespace(member, ns)  # before the window, as the floors' namespaces always are
        try:
            async with _floor_process(argv, workdir / "relay.log") as floor:
                return await _relayed(lab, front, ns, node, floor.pid, lambda: floor.returncode is None, args, profile)
        finally:
            for client, path in ((front, f"/api/v1/namespaces/{ns}"), (member, f"/api/v1/namespaces/{ns}")):
                with suppress(ApiError):
                    await client.delete(f"{path}/pods", params={"gracePeriodSeconds": "0"})
                with suppress(ApiError):
                    await client.delete(path)
            with suppress(ApiError):
                await front.delete(f"/api/v1/nodes/{node}")
            for _ in range(600):  # gone, so the next relay does not share the machine with its deletion
                try:
                    await member.get(f"/api/v1/namespaces/{ns}")
                except NotFound:
                    break
                await asyncio.sleep(0.5)


async def _relay_floor(state: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--repeats rounds, each the provider and the lean floor with every loop of --relay-loops,
    then the client floor, one after the other on the same lab, the order reversed every other
    round: each one's CPU per pod, the provider's ratios to the floors, and their medians."""
    lab = lab_mod.load_running(state)
    loops = args.relay_loops.split(",")
    runs = [*((kind, loop) for loop in loops for kind in ("provider", "lean floor")), ("client floor", "asyncio")]
    rounds: list[dict[str, Any]] = []
    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline")), connection_limit=200) as front:
        for i in range(args.repeats):
            one: dict[str, Any] = {}
            for kind, loop in runs if i % 2 == 0 else runs[::-1]:
                name = kind.replace(" ", "_") + ("" if kind == "client floor" else f"_{loop}")
                (workdir / f"relay-{i}-{name}").mkdir()
                one[name] = await _relay_run(lab, front, workdir / f"relay-{i}-{name}", kind, loop, args)
                print(f"relayfloor round {i + 1}: {name} {one[name]}", file=sys.stderr, flush=True)
            for loop in loops:
                ms = one[f"provider_{loop}"]["cpu_ms_per_pod"]
                one[f"provider_{loop}_to_lean_floor"] = round(ms / one[f"lean_floor_{loop}"]["cpu_ms_per_pod"], 2)
                one[f"provider_{loop}_to_client_floor"] = round(ms / one["client_floor"]["cpu_ms_per_pod"], 2)
            rounds.append(one)
    median = {
        key: statistics.median(r[key]["cpu_ms_per_pod"] if isinstance(r[key], dict) else r[key] for r in rounds)
        for key in rounds[0]
    }
    return {
        "member": MEMBER,
        "warm_up": args.relay_warm_up,
        "pods": args.relay_pods,
        "client_floor_loop": "asyncio",
        "rounds": rounds,
        "median": median,
    }


def _lab_ms_per_pod(run: dict[str, Any]) -> float:
    lab = float(
        sum(
            v
            for k, v in run["cores"].items()
            if k not in ("bench", "provider", "total") and not k.startswith("machine")
        )
    )
    return round(lab / float(run["pods_per_s"]) * 1000, 2)


async def _compare(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """The provider against the floor in alternating rounds (burst, floor, paced at each rate
    through the provider and by hand): on this machine one run of each differs from the next by
    more than the margins the targets ask about, so each round's ratio is taken between runs
    minutes apart at most, and the median of the rounds is reported."""
    rates = [float(r) for r in args.rates.split(",")]
    rounds: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        burst, floor = await bench.burst(args.pods), await bench.floor(args.pods)
        one: dict[str, Any] = {
            "burst_per_s": burst["pods_per_s"],
            "floor_per_s": floor["pods_per_s"],
            "burst_to_floor": round(burst["pods_per_s"] / floor["pods_per_s"], 2),
            "first_pod_ms": burst["first_pod_ms"],
            # What each pod cost the lab (etcd, the apiservers, schedulers, kwok), so whether a
            # slower burst was the provider leaving the lab less, or asking more of it per pod.
            "lab_cpu_ms_per_pod": {"burst": _lab_ms_per_pod(burst), "floor": _lab_ms_per_pod(floor)},
        }
        for rate in rates:
            ours = await bench.paced(args.pods, rate)
            watched = await bench.paced(args.pods, rate, floor="watched")
            direct = await bench.paced(args.pods, rate, floor="direct")
            one[f"paced_{rate:g}"] = {
                # p50 and p90 beside p99: whether the provider adds a constant (a watch hop) or a tail
                **{k: v for k, v in ours.items() if k.startswith(("added_", "hop_", "first_"))},
                **{f"floor_{k}": v for k, v in watched.items() if k.startswith(("added_", "hop_"))},
                **{f"direct_floor_{k}": v for k, v in direct.items() if k.startswith("added_")},
                "p99_to_floor": round(ours["added_ms_p99"] / watched["added_ms_p99"], 2),
                "p99_to_direct_floor": round(ours["added_ms_p99"] / direct["added_ms_p99"], 2),
            }
        rounds.append(one)
    medians = {"burst_to_floor": statistics.median(r["burst_to_floor"] for r in rounds)}
    for rate in rates:
        name = f"paced_{rate:g}"
        for ratio in ("p99_to_floor", "p99_to_direct_floor"):
            medians[f"{name}.{ratio}"] = statistics.median(r[name][ratio] for r in rounds)
    return {"rounds": rounds, "median": medians, "targets": {"burst_to_floor": 0.95, "p99_to_floor": 1.5}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=PodSettings().workers, help="the provider's pod workers")
    parser.add_argument("--rates", default="20,50,100", help="offered pods/s for the paced phase")
    parser.add_argument(
        "--phases",
        default="burst,floor,paced,gang,endtoend",
        help="comma-separated: burst, floor, paced, gang, endtoend, compare (--repeats rounds of burst, floor "
        "and paced at --rates, through the provider and by hand, alternating), relayfloor (not by default)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the compare, endtoend and relayfloor phases")
    parser.add_argument("--relay-pods", type=int, default=600, help="pods in the relayfloor phase's window")
    parser.add_argument("--relay-warm-up", type=int, default=200, help="pods before the relayfloor phase's window")
    parser.add_argument(
        "--relay-loops",
        default="asyncio",
        help="comma-separated event loops of the provider and lean floor: asyncio (the default), uvloop",
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the provider in the burst, to FILE")
    parser.add_argument(
        "--profile-relay",
        type=Path,
        default=None,
        help="py-spy each relay in its relayfloor window, to FILE.ROUND-KIND.txt",
    )
    parser.add_argument("--profile-e2e", type=Path, default=None, help="py-spy the end-to-end phase, to FILE")
    parser.add_argument("--state", type=Path, default=None, help="use a running lab instead of starting one")
    args = parser.parse_args()
    spec = lab_mod.LabSpec(members=3, nodes_per_member=20)
    print(json.dumps(asyncio.run(on_lab(args.state, spec, lambda state, workdir: run(state, workdir, args))), indent=2))


if __name__ == "__main__":
    main()
