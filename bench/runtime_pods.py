"""Benchmark: 1,000 pods through the runtime with the in-memory provider.

Pods are created already bound (spec.nodeName set), so the figure is the runtime's own:
from bound to Running in the API. Reports pods/s, bound-to-Running latency p50/p99, API
calls per pod (from the runtime's own counter) and the runtime process's memory.
Run: `.venv/bin/python -m bench.runtime_pods [--pods 1000] [--state DIR]`.
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
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml

from e2e import lab as lab_mod
from vkprovider.kube import KubeClient, load_kubeconfig


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _metrics(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vkprovider_api_calls_total"):
            verb = line.split('verb="')[1].split('"')[0]
            out[verb] = float(line.split()[-1])
    return out


async def run(state: Path, count: int, workdir: Path) -> dict[str, Any]:
    kubeconfig = state / "kubeconfig" / "offline.yaml"
    node = "vk-bench"
    health = _port()
    config = {
        "kube": {"kubeconfig": str(kubeconfig)},
        "node": {"name": node},
        "http": {"port": _port(), "health_port": health, "bind": "127.0.0.1", "csr": False},
        "log": {"format": "json", "level": "warning"},
        "provider": {"memory": {"startup_delay": 0.0}},
    }
    (workdir / "vk.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vkprovider.cli", "run", "--config", str(workdir / "vk.yaml")],
        stdout=open(workdir / "vk.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{health}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        async with KubeClient(load_kubeconfig(kubeconfig), connection_limit=200) as client:
            ns = f"bench-{int(time.time())}"
            await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
            for _ in range(100):
                try:
                    await client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            before = await _metrics(health)
            bound: dict[str, float] = {}
            running: dict[str, float] = {}
            listed = await client.list(f"/api/v1/namespaces/{ns}/pods")
            rv = listed["metadata"]["resourceVersion"]

            async def watch() -> None:
                async for event in client.watch(f"/api/v1/namespaces/{ns}/pods", resource_version=rv):
                    obj = event["object"]
                    if obj.get("status", {}).get("phase") == "Running":
                        running.setdefault(obj["metadata"]["name"], time.monotonic())
                        if len(running) == count:
                            return

            watcher = asyncio.create_task(watch(), name="bench-watch")
            limit = asyncio.Semaphore(100)

            async def create(i: int) -> None:
                name = f"p{i:05d}"
                body = {
                    "metadata": {"name": name},
                    "spec": {
                        "nodeName": node,
                        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                        "containers": [{"name": "c", "image": "bench/app:1"}],
                    },
                }
                async with limit:
                    await client.create(f"/api/v1/namespaces/{ns}/pods", body)
                    bound[name] = time.monotonic()

            started = time.monotonic()
            await asyncio.gather(*(create(i) for i in range(count)))
            created = time.monotonic()
            await asyncio.wait_for(watcher, timeout=300)
            finished = time.monotonic()
            after = await _metrics(health)
            rss = psutil.Process(proc.pid).memory_info().rss
            latencies = sorted(running[n] - bound[n] for n in bound)
            calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            total_calls = sum(v for k, v in calls.items() if k != "WATCH")
            await client.delete(f"/api/v1/namespaces/{ns}")
            return {
                "pods": count,
                "create_s": round(created - started, 2),
                "all_running_s": round(finished - started, 2),
                "pods_per_s": round(count / (finished - started), 1),
                "bound_to_running_p50_ms": round(statistics.median(latencies) * 1000, 1),
                "bound_to_running_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
                "api_calls_per_pod": round(total_calls / count, 2),
                "api_calls_by_verb": calls,
                "runtime_rss_mib": round(rss / 2**20, 1),
            }
    finally:
        proc.terminate()
        proc.wait(30)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vkprovider-bench-") as tmp:
        workdir = Path(tmp)
        if args.state:
            return await run(args.state, args.pods, workdir)
        lab = await lab_mod.up(workdir / "lab", lab_mod.LabSpec(members=0))
        try:
            return await run(lab.root, args.pods, workdir)
        finally:
            lab_mod.teardown(lab)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--state", type=Path, default=None, help="use a running lab instead of starting one")
    result = asyncio.run(main_async(parser.parse_args()))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
