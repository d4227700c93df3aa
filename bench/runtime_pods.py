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
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import Provider, on_lab
from e2e import lab as lab_mod
from vkprovider.kube import KubeClient, ensure_namespace, load_kubeconfig


async def run(state: Path, workdir: Path, count: int) -> dict[str, Any]:
    kubeconfig = state / "kubeconfig" / "offline.yaml"
    node = "vk-bench"
    config = {
        "kube": {"kubeconfig": str(kubeconfig)},
        "node": {"name": node},
        "log": {"format": "json", "level": "warning"},
        "provider": {"memory": {"startup_delay": 0.0}},
    }
    async with (
        Provider(config, workdir) as provider,
        KubeClient(load_kubeconfig(kubeconfig), connection_limit=200) as client,
    ):
        ns = f"bench-{int(time.time())}"
        await ensure_namespace(client, ns)
        before = await provider.counters()
        bound: dict[str, float] = {}
        running: dict[str, float] = {}
        listed = await client.list(f"/api/v1/namespaces/{ns}/pods")
        rv = listed["metadata"]["resourceVersion"]

        async def watch(rv: str = rv) -> None:
            while True:  # the apiserver may end a watch early; go on from the last version seen
                async for event in client.watch(f"/api/v1/namespaces/{ns}/pods", resource_version=rv):
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
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
        after = await provider.counters()
        rss = psutil.Process(provider.pid).memory_info().rss
        latencies = sorted(running[n] - bound[n] for n in bound)
        calls = {k[4:]: after[k] - before.get(k, 0) for k in after if k.startswith("api:")}
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--state", type=Path, default=None, help="use a running lab instead of starting one")
    args = parser.parse_args()
    spec = lab_mod.LabSpec(members=0)
    result = asyncio.run(on_lab(args.state, spec, lambda state, workdir: run(state, workdir, args.pods)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
