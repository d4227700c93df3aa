"""Benchmark: a steady state of many pods (10,000 by default) on one provider's pooled node over
all the lab's members, what holding them costs, and how fast status comes back under churn.

Reports:
  - the provider's RSS before, with half and with all the pods: per mirrored pod from empty,
    and per pod added from half to all, the cost of one more pod held apart from what a burst
    costs once (target: under 8 KiB);
  - its CPU at rest with them (status resync, node heartbeats, capacity publishing; target:
    under 0.05 cores);
  - under a churn of --churn pods/s (one new pod created and one old deleted each 1/churn s):
    the status round trip, member pod Running -> front-end pod Running, p50/p99 (target: p99
    under 500 ms), both seen by this process's own watches; and the provider's cores meanwhile,
    with where its time went (its sync, queue-wait and event-loop-lag histograms). The churn
    lasts 120 s by default, as long as the provider's orphan interval: every churn includes
    one orphan check, a pass over all the pods held.
The lab must hold the pods: 110 per node, so at least 35 nodes per member for 10,000 over three;
without --state a lab of 3 members x 40 nodes is started.
Run: `.venv/bin/python -m bench.steady [--state DIR] [--pods 10000] [--churn 20] [--seconds 120]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench import endtoend
from bench.common import CpuMeter, bucket_quantile, lab_pids, on_lab
from e2e import audit
from e2e import lab as lab_mod
from e2e.state import LabState
from federation import forge
from vkprovider.kube import KubeClient, ensure_namespace, load_kubeconfig


def _origin(obj: dict[str, Any]) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(forge.ORIGIN_NAME, ""))


async def _churn(front: KubeClient, ns: str, node: str, *, rate: float, seconds: float, old: list[str]) -> list[str]:
    """Create one pod and delete one of `old` every 1/rate s; the new pods' names."""
    created: list[str] = []
    tasks: list[asyncio.Task[Any]] = []
    t0 = time.monotonic()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        name = f"c{i:05d}"
        created.append(name)
        tasks.append(
            asyncio.create_task(
                front.create(f"/api/v1/namespaces/{ns}/pods", endtoend.pod(name, node)), name=f"bench-churn/+{i}"
            )
        )
        if old:
            victim = old.pop(0)
            tasks.append(
                asyncio.create_task(
                    front.delete(f"/api/v1/namespaces/{ns}/pods/{victim}", params={"gracePeriodSeconds": "0"}),
                    name=f"bench-churn/-{i}",
                )
            )
    await asyncio.gather(*tasks)
    return created


async def _memtrace(pid: int) -> int:
    """Have the provider under bench.memtrace write its snapshot; the bytes it traces."""
    trace = Path(os.environ["BENCH_MEMTRACE"])
    trace.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    for _ in range(600):  # the snapshot takes a while under tracemalloc
        if trace.exists():
            break
        await asyncio.sleep(1)
    first = trace.read_text().partition("\n")[0]  # "total N bytes"
    trace.rename(trace.with_suffix(f".{time.time():.0f}"))
    return int(first.split()[1])


async def run(state: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    lab = lab_mod.load_running(state)
    node = f"vk-steady-{uuid.uuid4().hex[:5]}"
    ns = f"steady-{uuid.uuid4().hex[:5]}"
    member_ns = forge.member_namespace(ns, endtoend.PREFIX)
    result: dict[str, Any] = {"pods": args.pods, "members": len(endtoend.members(lab))}
    async with (
        endtoend.provider(lab, workdir, node) as proc,
        KubeClient(load_kubeconfig(lab.kubeconfig("offline")), connection_limit=200) as front,
    ):
        cpu = endtoend.Cpu(proc.pid)
        await asyncio.sleep(5)
        rss_empty = cpu.rss()
        traced_empty = await _memtrace(proc.pid) if os.environ.get("BENCH_MEMTRACE") else 0
        result["provider_idle_cores_empty"] = round(await cpu.idle_cores(args.idle_window), 4)
        await ensure_namespace(front, ns)
        members = {m: KubeClient(load_kubeconfig(lab.kubeconfig(m))) for m in endtoend.members(lab)}
        for client in members.values():
            await client.__aenter__()
        try:
            async with endtoend.Phases(front, ns) as phases:
                watches = [endtoend.Phases(c, member_ns, name_of=_origin) for c in members.values()]
                for watch in watches:
                    await watch.__aenter__()
                try:
                    # In two halves: RSS after the first half and after the second gives the cost
                    # of one more pod held, apart from what any burst costs once (connections
                    # opened, hot sets filled, allocator arenas), which (full - empty) / pods has.
                    names = [f"p{i:05d}" for i in range(args.pods)]
                    half = args.pods // 2
                    started, before, rss_half, ran = time.monotonic(), cpu.seconds(), 0, 0
                    for part in (names[:half], names[half:]):
                        await endtoend.create_all(front, ns, [endtoend.pod(n, node) for n in part], limit=50)
                        ran = await phases.settle("Running", ran + len(part))
                        if not rss_half:
                            await asyncio.sleep(args.settle)
                            rss_half = cpu.rss()
                    result["running"] = ran  # the rest wait in a member, their reason on the pod
                    result["all_running_s"] = round(time.monotonic() - started - args.settle, 1)
                    result["provider_cpu_ms_per_pod_to_running"] = round((cpu.seconds() - before) / args.pods * 1000, 2)
                    await asyncio.sleep(args.settle)
                    gc.collect()
                    rss_full = cpu.rss()
                    result["provider_rss_mib"] = {
                        "empty": round(rss_empty / 2**20, 1),
                        "half": round(rss_half / 2**20, 1),
                        "with_pods": round(rss_full / 2**20, 1),
                    }
                    result["provider_rss_kib_per_pod"] = round((rss_full - rss_empty) / args.pods / 1024, 1)
                    result["provider_rss_kib_per_added_pod"] = round(
                        (rss_full - rss_half) / (args.pods - half) / 1024, 1
                    )
                    result["provider_idle_cores"] = round(await cpu.idle_cores(args.idle_window), 4)
                    if os.environ.get("BENCH_MEMTRACE"):  # where the memory goes (bench.memtrace)
                        traced = await _memtrace(proc.pid)
                        result["traced_kib_per_pod"] = round((traced - traced_empty) / args.pods / 1024, 2)

                    meter = CpuMeter(
                        {"bench": os.getpid(), "provider": proc.pid, **lab_pids(state, list(lab.clusters))}
                    )
                    meter.start()
                    before, t0, seen = cpu.seconds(), time.monotonic(), await proc.histograms()
                    new = await _churn(front, ns, node, rate=args.churn, seconds=args.seconds, old=list(names))
                    await phases.settle("Running", ran + len(new), timeout=300)
                    result["churn_provider_cores"] = round((cpu.seconds() - before) / (time.monotonic() - t0), 3)
                    # Near 2 (this machine's cores), the machine was the limit: a slow trip may
                    # be the provider waiting for a core, not for its own work.
                    used = meter.stop()
                    apiservers = sum(v for k, v in used.items() if k.endswith("/kube-apiserver"))
                    named = ("total", "provider", "bench", "etcd")
                    result["churn_cores"] = {
                        **{k: used.get(k, 0.0) for k in named},
                        "apiservers": round(apiservers, 2),
                        "rest of the lab": round(
                            used["total"] - sum(used.get(k, 0.0) for k in named[1:]) - apiservers, 2
                        ),
                    }
                    front_running = dict(phases.times("Running"))
                    member_running: dict[str, float] = {}
                    for watch in watches:
                        member_running.update(watch.times("Running"))
                    trips = sorted(
                        (front_running[n] - member_running[n], member_running[n] - t0)
                        for n in new
                        if n in member_running
                    )
                    result["churn"] = {
                        "pods_per_s": args.churn,
                        "seconds": args.seconds,
                        "round_trip_ms_p50": round(statistics.median(t for t, _ in trips) * 1000, 1),
                        "round_trip_ms_p99": round(trips[max(0, int(len(trips) * 0.99) - 1)][0] * 1000, 1),
                        "measured": len(trips),
                        "started_at": round(t0, 3),  # time.monotonic, as bench.stalls's records
                        # When the slow trips' pods ran (seconds into the churn): bunched, they
                        # point to a stall; spread, to a queue.
                        "slow_at_s": [
                            round(at, 1) for trip, at in trips if trip > TARGETS["churn.round_trip_ms_p99"] / 1000
                        ],
                        "slow_split_ms": _split(lab, ns, new, member_running, front_running),
                        "provider": _inside(seen, await proc.histograms()),
                    }
                finally:
                    for watch in watches:
                        await watch.__aexit__(None, None, None)
        finally:
            for client in members.values():
                await client.__aexit__(None, None, None)
        result["targets"] = TARGETS
        print(json.dumps(result, indent=2), flush=True)  # before the clean-up, which can take minutes
        if proc.proc is not None and proc.proc.poll() is not None:  # its member pods would never go
            tail = (workdir / "vk.log").read_text(errors="replace")[-3000:]  # the directory goes
            raise RuntimeError(f"vkprovider exited ({proc.proc.returncode}); the end of its log:\n{tail}")
        await endtoend.clean(lab, front, ns, timeout=1800)
    return result


def _split(
    lab: LabState, ns: str, names: list[str], member: dict[str, float], front: dict[str, float]
) -> dict[str, Any]:
    """Where the slow round trips (over the target) lost their time, from the front end's audit
    log: member Running (this process's watch) -> the provider's status patch received by the
    apiserver (the provider's watch of the member, its queue and its sync) -> the patch answered
    (the apiserver) -> front-end Running seen by this process's watch. Medians and maxima, ms."""
    slow = {
        n
        for n in names
        if n in member and n in front and front[n] - member[n] > TARGETS["churn.round_trip_ms_p99"] / 1000
    }
    if not slow:
        return {}
    wall = time.time() - time.monotonic()  # audit stamps are wall-clock times; ours monotonic
    patch: dict[str, audit.AuditRecord] = {}
    for rec in audit.records(lab, "offline", users={endtoend.USER}):
        # the last status patch the front end answered before the pod was seen Running
        if (
            rec.name in slow
            and rec.namespace == ns
            and (rec.verb, rec.subresource) == ("patch", "status")
            and rec.completed - wall <= front[rec.name]
        ):
            patch[rec.name] = rec
    parts: dict[str, list[float]] = {"to_patch": [], "apiserver": [], "front_watch": []}
    for name, rec in patch.items():
        parts["to_patch"].append(rec.received - wall - member[name])
        parts["apiserver"].append(rec.completed - rec.received)
        parts["front_watch"].append(front[name] - (rec.completed - wall))
    out: dict[str, Any] = {"pods": len(slow), "patches_found": len(patch)}
    for part, values in parts.items():
        if values:
            out[part] = {"p50": round(statistics.median(values) * 1000, 1), "max": round(max(values) * 1000, 1)}
    return out


def _inside(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> dict[str, Any]:
    """Where the provider's time went meanwhile, from its own histograms: bucket bounds in ms of
    the p50/p99 (and the worst) of its syncs, its queue wait and its event loop's lag."""
    out: dict[str, Any] = {}
    for label, name in (
        ("sync", 'vkprovider_pod_sync_seconds{result="ok"}'),
        ("queue_wait", 'vkprovider_workqueue_wait_seconds{queue="pods"}'),
        ("loop_lag", "vkprovider_event_loop_lag_seconds{}"),
    ):
        for q in (0.5, 0.99, 1.0):
            bound = bucket_quantile(before.get(name, {}), after.get(name, {}), q)
            out[f"{label}_ms_{'max' if q == 1.0 else f'p{q * 100:.0f}'}_bucket"] = (
                None if bound is None else bound * 1000
            )
    return out


TARGETS = {"provider_rss_kib_per_pod": 8, "provider_idle_cores": 0.05, "churn.round_trip_ms_p99": 500}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=20.0, help="pods created (and deleted) per second")
    parser.add_argument(
        "--seconds", type=float, default=120.0, help="how long the churn lasts (the orphan interval: one check in it)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=40.0,
        help="seconds after all are Running before measuring (the heap trim runs every 30 s after activity)",
    )
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds over which idle CPU is read")
    parser.add_argument("--state", type=Path, default=None, help="use a running lab instead of starting one")
    args = parser.parse_args()
    spec = lab_mod.LabSpec(members=3, nodes_per_member=40)
    asyncio.run(on_lab(args.state, spec, lambda state, workdir: run(state, workdir, args)))


if __name__ == "__main__":
    main()
