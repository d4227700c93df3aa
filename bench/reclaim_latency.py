"""Benchmark: how long an online pod that will not preempt waits for the room reclaim makes, on
the lab, split into the notice our pod was given, its grace period, and our own overhead.

member-1 (20 nodes of 95 allocatable cores) runs ten 85-core pods of ours, one per node, and
online load fills its other ten nodes. Then, one at a time, an online pod of 90 cores with
preemptionPolicy Never is created: it fits nowhere until one of our pods goes. Per round, from
member-1's watch:
  - wait: the online pod created -> Running (what online feels);
  - notice: the victim's notice written -> its deadline (what our pod is given to checkpoint);
  - grace: the victim's deletion requested -> gone (its terminationGracePeriodSeconds, 1 s here);
  - overhead: wait - notice - grace (seeing the demand, planning, the two-round debounce, the
    deadline's rounding, the member scheduler placing the online pod, and the lab's kubelet).
Target (issue 8): overhead p99 under 1 s. Run: `.venv/bin/python -m bench.reclaim_latency`
[--state DIR to reuse a running lab] [--rounds 8] [--notice 5].
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import Provider, on_lab
from e2e import lab as lab_mod
from e2e import online
from vkprovider.kube import KubeClient, ensure_namespace, load_kubeconfig

NS = f"bench-reclaim-{int(time.time())}"
NODE = "vk-bench-reclaim"


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Timeline:
    """When member-1's pods changed, as its watch reported them (wall clock)."""

    def __init__(self) -> None:
        self.noticed: dict[str, tuple[float, float]] = {}  # our pod -> (seen noticed, deadline)
        self.deleting: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.running: dict[str, float] = {}

    def see(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.time()
        meta = pod["metadata"]
        name = meta["name"]
        stamp = (meta.get("annotations") or {}).get("vkprovider.io/reclaim-at")
        if stamp and name not in self.noticed:
            self.noticed[name] = (now, _stamp(stamp))
        if meta.get("deletionTimestamp") and name not in self.deleting:
            self.deleting[name] = now
        if kind == "DELETED":
            self.gone.setdefault(name, now)
        if pod.get("status", {}).get("phase") == "Running":
            self.running.setdefault(name, now)


async def _watch(kubeconfig: Path, timeline: Timeline) -> None:
    async with KubeClient(load_kubeconfig(kubeconfig)) as client:
        listed = await client.list("/api/v1/pods")
        rv = listed["metadata"]["resourceVersion"]
        while True:
            async for event in client.watch("/api/v1/pods", resource_version=rv):
                rv = event["object"].get("metadata", {}).get("resourceVersion", rv)
                if event["type"] != "BOOKMARK":
                    timeline.see(event["type"], event["object"])


def _pod(name: str, cpu: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"vkprovider.io/role": "worker-max"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": "registry.example/train:1", "resources": {"requests": {"cpu": str(cpu)}}}
            ],
        },
    }


async def run(state: Path, workdir: Path, *, rounds: int, notice: float) -> dict[str, Any]:
    lab = lab_mod.load_running(state)
    member_1 = lab.kubeconfig("member-1")
    config = {
        "kube": {"kubeconfig": str(lab.kubeconfig("offline"))},
        "node": {"name": NODE},
        "log": {"format": "json"},
        "provider": {
            "type": "federation",
            "federation": {
                "members": [{"name": "member-1", "kubeconfig": str(member_1), "reclaim": {"notice_seconds": notice}}],
                "publish_interval": 0.2,
            },
        },
    }
    for load in ("bench-patient", "bench-full"):  # left over by an interrupted run
        await online.set_load(member_1, cpu_share=0, replicas=0, name=load, wait=True)
    timeline = Timeline()
    watching = asyncio.create_task(_watch(member_1, timeline), name="bench/watch")
    samples: list[dict[str, float]] = []
    try:
        async with Provider(config, workdir), KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as front:
            await ensure_namespace(front, NS)
            for i in range(10):
                await front.create(f"/api/v1/namespaces/{NS}/pods", _pod(f"ours-{i}", 85))
            while sum(1 for n in timeline.running if n.startswith("ours-")) < 10:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            await online.set_load(member_1, cpu_share=0, pod_cpu=90, replicas=10, name="bench-full", wait=True)
            for r in range(rounds):
                began = time.time()
                await online.set_load(
                    member_1, cpu_share=0, pod_cpu=90, replicas=r + 1, name="bench-patient", preempting=False
                )
                deadline = time.monotonic() + notice + 60
                while time.monotonic() < deadline:
                    patients = [n for n in timeline.running if n.startswith("bench-patient")]
                    if len(patients) > r:
                        break
                    await asyncio.sleep(0.05)
                newest = max((timeline.running[n], n) for n in timeline.running if n.startswith("bench-patient"))
                victims = [v for v in timeline.deleting if v.startswith("ours-") and timeline.deleting[v] >= began]
                if not victims:
                    print(f"round {r}: the online pod found room without a reclaim; skipped", flush=True)
                    continue
                victim = max(victims, key=lambda v: timeline.deleting[v])
                seen, stamp = timeline.noticed[victim]
                wait = newest[0] - began
                given = stamp - seen
                grace = timeline.gone[victim] - timeline.deleting[victim]
                samples.append({"wait": wait, "notice": given, "grace": grace, "overhead": wait - given - grace})
                print(
                    f"round {r}: waited {wait:5.2f}s = notice {given:5.2f}s + grace {grace:4.2f}s + "
                    f"overhead {wait - given - grace:4.2f}s",
                    flush=True,
                )
            await front.delete(f"/api/v1/namespaces/{NS}")
    finally:
        for load in ("bench-patient", "bench-full"):
            await online.set_load(member_1, cpu_share=0, replicas=0, name=load, wait=True)
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    overhead = sorted(s["overhead"] for s in samples)
    return {
        "rounds": len(samples),
        "notice": notice,
        "overhead_p50": statistics.median(overhead),
        "overhead_max": overhead[-1],
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, default=None, help="a running lab to use")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--notice", type=float, default=5.0)
    args = parser.parse_args()
    spec = lab_mod.LabSpec(members=1, nodes_per_member=20)

    async def go(state: Path, workdir: Path) -> dict[str, Any]:
        return await run(state, workdir, rounds=args.rounds, notice=args.notice)

    result = asyncio.run(on_lab(args.state, spec, go))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
