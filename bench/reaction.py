"""Benchmark: how fast the runtime and the federation provider react, on the lab. These are the
speed figures the end-to-end tests used to assert with stopwatches (they now assert order and
generous bounds only):
  - node ready: `vkprovider run` started -> its node Ready in the API (in-memory provider);
  - capacity follows load: member-1's online load raised from 20 % to 70 % and Running -> the
    pooled virtual node's allocatable CPU lower (federation provider over member-1).
Run: `.venv/bin/python -m bench.reaction [--state DIR] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import Provider, on_lab
from e2e import lab as lab_mod
from e2e import online
from vkprovider.kube import KubeClient, NotFound, load_kubeconfig


async def _node_ready(client: KubeClient, name: str) -> bool:
    try:
        node = await client.get(f"/api/v1/nodes/{name}")
    except NotFound:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


async def _cpu(client: KubeClient, name: str) -> str | None:
    try:
        node = await client.get(f"/api/v1/nodes/{name}")
    except NotFound:
        return None
    return str(node["status"].get("allocatable", {}).get("cpu"))


async def run(state: Path, workdir: Path, *, repeat: int) -> dict[str, Any]:
    lab = lab_mod.load_running(state)
    offline = lab.kubeconfig("offline")
    member_1 = lab.kubeconfig("member-1")
    ready: list[float] = []
    follow: list[float] = []
    async with KubeClient(load_kubeconfig(offline)) as client:
        for i in range(repeat):
            node = f"vk-bench-ready-{i}-{int(time.time())}"
            config: dict[str, Any] = {
                "kube": {"kubeconfig": str(offline)},
                "node": {"name": node},
                "provider": {"type": "memory"},
            }
            started = time.monotonic()
            async with Provider(config, workdir):
                while not await _node_ready(client, node):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                ready.append(time.monotonic() - started)
            await client.delete(f"/api/v1/nodes/{node}")

        node = f"vk-bench-follow-{int(time.time())}"
        config = {
            "kube": {"kubeconfig": str(offline)},
            "node": {"name": node},
            "provider": {
                "type": "federation",
                "federation": {"members": [{"name": "member-1", "kubeconfig": str(member_1)}], "publish_interval": 0.2},
            },
        }
        async with Provider(config, workdir):
            for _ in range(repeat):
                await online.set_load(member_1, cpu_share=0.2, wait=True, name="bench-tide")
                await asyncio.sleep(12)  # increases are damped (10 s hold): let the node settle
                before = await _cpu(client, node)
                await online.set_load(member_1, cpu_share=0.7, wait=True, name="bench-tide")
                raised = time.monotonic()
                while await _cpu(client, node) == before:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                follow.append(time.monotonic() - raised)
            await online.set_load(member_1, cpu_share=0, replicas=0, wait=True, name="bench-tide")
        await client.delete(f"/api/v1/nodes/{node}")
    return {
        "node_ready_seconds": {"p50": statistics.median(ready), "max": max(ready), "samples": ready},
        "capacity_follow_seconds": {"p50": statistics.median(follow), "max": max(follow), "samples": follow},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    async def go(state: Path, workdir: Path) -> dict[str, Any]:
        return await run(state, workdir, repeat=args.repeat)

    result = asyncio.run(on_lab(args.state, lab_mod.LabSpec(members=1, nodes_per_member=20), go))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
