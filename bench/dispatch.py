"""Benchmark: dispatch throughput and added latency, side by side with a ceiling in one run.

Ceiling: the same client creates the same pods straight in the member's apiserver. Ours: pods
are created already bound to the virtual node in the front end (so the front-end scheduler is
not measured) and the provider dispatches them to the member; a watch on the member times when
each arrives. Reported:
  - a burst of N plain pods: throughput (pods/s) and ratio to the ceiling's;
  - N pods offered at 100 pods/s: added latency (bound in the front end -> created in the
    member) p50/p99;
  - a 512-pod gang: from the last pod bound to all 512 created in the member, and to all bound
    there by the member's scheduler.
Targets (issue 5): at least 70 % of the ceiling's throughput; added p99 under 250 ms at 100/s.
Run: `.venv/bin/python -m bench.dispatch [--state DIR] [--pods 1000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e import lab as lab_mod
from vkprovider.kube import AlreadyExists, ApiError, KubeClient, load_kubeconfig

MEMBER = "member-1"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


async def _namespace(client: KubeClient, name: str) -> None:
    try:
        await client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    except AlreadyExists:
        pass
    for _ in range(200):
        try:
            await client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return
        except ApiError:
            await asyncio.sleep(0.05)


class Arrivals:
    """Times at which pods appear (ADDED) and get bound (nodeName set) in one namespace."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listed = await self.client.list(path)
        rv = listed["metadata"]["resourceVersion"]
        while True:
            async for event in self.client.watch(path, resource_version=rv):
                obj = event["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                name = obj["metadata"].get("name")
                now = time.monotonic()
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.added.setdefault(name, now)
                    if obj.get("spec", {}).get("nodeName"):
                        self.bound.setdefault(name, now)

    async def __aenter__(self) -> Arrivals:
        self.task = asyncio.create_task(self._run(), name=f"bench-arrivals/{self.namespace}")
        await asyncio.sleep(0.3)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def wait(self, count: int, *, bound: bool = False, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        source = self.bound if bound else self.added
        while len(source) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(source)} of {count} pods after {timeout}s")
            await asyncio.sleep(0.02)
        return max(source.values())


async def _burst(client: KubeClient, namespace: str, bodies: list[dict[str, Any]]) -> dict[str, float]:
    created: dict[str, float] = {}
    limit = asyncio.Semaphore(100)

    async def one(body: dict[str, Any]) -> None:
        async with limit:
            await client.create(f"/api/v1/namespaces/{namespace}/pods", body)
            created[body["metadata"]["name"]] = time.monotonic()

    await asyncio.gather(*(one(b) for b in bodies))
    return created


async def run(state: Path, count: int, workdir: Path) -> dict[str, Any]:
    front_kc, member_kc = state / "kubeconfig" / "offline.yaml", state / "kubeconfig" / f"{MEMBER}.yaml"
    node = f"vk-bench-{uuid.uuid4().hex[:5]}"
    health = _port()
    config = {
        "kube": {"kubeconfig": str(front_kc)},
        "node": {"name": node, "provider_id": "federation"},
        "http": {"port": _port(), "health_port": health, "bind": "127.0.0.1", "csr": False},
        "log": {"format": "json", "level": "warning"},
        "provider": {
            "type": "federation",
            "federation": {"members": [{"name": MEMBER, "kubeconfig": str(member_kc)}], "publish_interval": 0.2},
        },
    }
    (workdir / "vk.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vkprovider.cli", "run", "--config", str(workdir / "vk.yaml")],
        stdout=open(workdir / "vk.log", "wb"),  # noqa: SIM115 - the child's log
        stderr=subprocess.STDOUT,
    )
    result: dict[str, Any] = {"pods": count, "member": MEMBER}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{health}/capacity") as resp:
                        view = await resp.json()
                        if view.get("members", {}).get(MEMBER, {}).get("lendable"):
                            break
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.2)
        async with (
            KubeClient(load_kubeconfig(front_kc), connection_limit=200) as front,
            KubeClient(load_kubeconfig(member_kc), connection_limit=200) as member,
        ):
            # Ceiling: straight into the member.
            ns = f"ceil-{uuid.uuid4().hex[:5]}"
            await _namespace(member, ns)
            async with Arrivals(member, ns) as arrivals:
                started = time.monotonic()
                await _burst(member, ns, [_pod(f"p{i:05d}", node=None) for i in range(count)])
                last = await arrivals.wait(count)
            ceiling = count / (last - started)
            result["ceiling_pods_per_s"] = round(ceiling, 1)
            await member.delete(f"/api/v1/namespaces/{ns}")

            # Ours, burst: bound in the front end, dispatched by the provider.
            ns = f"burst-{uuid.uuid4().hex[:5]}"
            await _namespace(front, ns)
            async with Arrivals(member, ns) as arrivals:
                started = time.monotonic()
                await _burst(front, ns, [_pod(f"p{i:05d}", node=node) for i in range(count)])
                last = await arrivals.wait(count)
            ours = count / (last - started)
            result["dispatch_pods_per_s"] = round(ours, 1)
            result["ratio_to_ceiling"] = round(ours / ceiling, 2)
            await front.delete(f"/api/v1/namespaces/{ns}")

            # Ours, offered at 100 pods/s: added latency per pod.
            ns = f"paced-{uuid.uuid4().hex[:5]}"
            await _namespace(front, ns)
            created: dict[str, float] = {}
            async with Arrivals(member, ns) as arrivals:
                tasks = []
                t0 = time.monotonic()
                for i in range(count):
                    await asyncio.sleep(max(0.0, t0 + i / 100 - time.monotonic()))
                    body = _pod(f"p{i:05d}", node=node)

                    async def one(body: dict[str, Any] = body) -> None:
                        await front.create(f"/api/v1/namespaces/{ns}/pods", body)
                        created[body["metadata"]["name"]] = time.monotonic()

                    tasks.append(asyncio.create_task(one(), name=f"bench-create/{i}"))
                await asyncio.gather(*tasks)
                await arrivals.wait(count)
                latencies = sorted(arrivals.added[n] - created[n] for n in created)
            result["paced_100_per_s_added_ms_p50"] = round(statistics.median(latencies) * 1000, 1)
            result["paced_100_per_s_added_ms_p99"] = round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1)
            await front.delete(f"/api/v1/namespaces/{ns}")

            # A 512-pod gang.
            ns = f"gang-{uuid.uuid4().hex[:5]}"
            await _namespace(front, ns)
            group = {
                "apiVersion": "scheduling.k8s.io/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "big"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 512}}},
            }
            await front.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", group)
            async with Arrivals(member, ns) as arrivals:
                created = await _burst(
                    front, ns, [_pod(f"g{i:04d}", node=node, group="big", cpu="1") for i in range(512)]
                )
                last_bound = max(created.values())
                all_created = await arrivals.wait(512)
                all_bound = await arrivals.wait(512, bound=True)
            result["gang_512_created_s"] = round(all_created - last_bound, 2)
            result["gang_512_bound_in_member_s"] = round(all_bound - last_bound, 2)
            await front.delete(f"/api/v1/namespaces/{ns}")
        result["targets"] = {"ratio_to_ceiling": 0.7, "paced_added_ms_p99": 250}
        return result
    finally:
        proc.terminate()
        proc.wait(30)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vkprovider-bench-") as tmp:
        workdir = Path(tmp)
        if args.state:
            return await run(args.state, args.pods, workdir)
        lab = await lab_mod.up(workdir / "lab", lab_mod.LabSpec(members=1, nodes_per_member=20))
        try:
            return await run(lab.root, args.pods, workdir)
        finally:
            lab_mod.teardown(lab)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--state", type=Path, default=None, help="use a running lab instead of starting one")
    print(json.dumps(asyncio.run(main_async(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
