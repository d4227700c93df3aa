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
    under 500 ms), both seen by bench.observer, a process of its own; and the provider's cores meanwhile,
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
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench import cpufloor, endtoend, observer
from bench.common import CpuMeter, Profile, bucket_quantile, lab_pids, on_lab, weigh_cpu
from e2e import audit
from e2e import lab as lab_mod
from e2e.state import LabState
from federation import labels
from federation.dispatch import forge
from vkprovider.kube import KubeClient, ensure_namespace, load_kubeconfig

#: On the pods the churn creates (and, copied, on their member copies): what bench.observer watches.
CHURN = "bench.vkprovider.io/churn"


def _origin(obj: dict[str, Any]) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(labels.ORIGIN_NAME, ""))


async def _churn(
    front: KubeClient, ns: str, node: str, *, rate: float, seconds: float, old: list[str], prefix: str = "c"
) -> list[str]:
    """Create one pod and delete one of `old` (while any are left) every 1/rate s; the new
    pods' names."""
    created: list[str] = []
    t0 = time.monotonic()
    # A failed call cancels the others and ends the run with its error (a run beside a CI run
    # once printed 2,233 "Task exception was never retrieved" after one delete timed out).
    async with asyncio.TaskGroup() as group:
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            name = f"{prefix}{i:05d}"
            created.append(name)
            body = endtoend.pod(name, node)
            body["metadata"]["labels"] = {CHURN: "1"}
            group.create_task(front.create(f"/api/v1/namespaces/{ns}/pods", body), name=f"bench-churn/+{name}")
            if old:
                victim = old.pop(0)
                group.create_task(
                    front.delete(f"/api/v1/namespaces/{ns}/pods/{victim}", params={"gracePeriodSeconds": "0"}),
                    name=f"bench-churn/-{victim}",
                )
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
    result: dict[str, Any] = {"pods": args.pods, "members": len(endtoend.members(lab)), "cpu_nice": args.cpu_nice}
    async with (
        endtoend.provider(lab, workdir, node, pods=_pod_settings(args)) as proc,
        KubeClient(load_kubeconfig(lab.kubeconfig("offline")), connection_limit=200) as front,
    ):
        cpu = endtoend.Cpu(proc.pid)
        if args.cpu_nice:
            weigh_cpu(proc.pid, args.cpu_nice)
        await asyncio.sleep(5)
        rss_empty = cpu.rss()
        traced_empty = await _memtrace(proc.pid) if os.environ.get("BENCH_MEMTRACE") else 0
        result["provider_idle_cores_empty"] = round(await cpu.idle_cores(args.idle_window), 4)
        await ensure_namespace(front, ns)
        members = {m: KubeClient(load_kubeconfig(lab.kubeconfig(m))) for m in endtoend.members(lab)}
        async with contextlib.AsyncExitStack() as stack:
            for client in members.values():
                await stack.enter_async_context(client)
            phases = await stack.enter_async_context(endtoend.Phases(front, ns))
            watches = [
                await stack.enter_async_context(endtoend.Phases(c, member_ns, name_of=_origin))
                for c in members.values()
            ]
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
            result["provider_rss_kib_per_added_pod"] = round((rss_full - rss_half) / (args.pods - half) / 1024, 1)
            result["provider_idle_cores"] = round(await cpu.idle_cores(args.idle_window), 4)
            if os.environ.get("BENCH_MEMTRACE"):  # where the memory goes (bench.memtrace)
                traced = await _memtrace(proc.pid)
                result["traced_kib_per_pod"] = round((traced - traced_empty) / args.pods / 1024, 2)

            floor = await stack.enter_async_context(cpufloor.relay(lab, front))
            if args.cpu_nice:
                weigh_cpu(floor.proc.pid, args.cpu_nice)
            floor_watches = [
                await stack.enter_async_context(endtoend.Phases(c, floor.namespace)) for c in (front, *members.values())
            ]
            meter = CpuMeter(
                {
                    "bench": os.getpid(),
                    "provider": proc.pid,
                    "floor": floor.proc.pid,
                    **lab_pids(state, list(lab.clusters)),
                }
            )
            watcher = await stack.enter_async_context(observer.Observer(_streams(lab, ns, floor.namespace), workdir))
            meter.start()
            before, t0, seen = cpu.seconds(), time.monotonic(), await proc.histograms()
            with Profile(proc.pid, args.profile):
                new, floor_new = await asyncio.gather(
                    _churn(front, ns, node, rate=args.churn, seconds=args.seconds, old=list(names)),
                    _churn(
                        front, floor.namespace, floor.node, rate=args.floor, seconds=args.seconds, old=[], prefix="f"
                    ),
                )
            await phases.settle("Running", ran + len(new), timeout=300)
            await floor_watches[0].settle("Running", len(floor_new), timeout=300)
            result["churn_provider_cores"] = round((cpu.seconds() - before) / (time.monotonic() - t0), 3)
            # Near 2 (this machine's cores), the machine was the limit: a slow trip may
            # be the provider waiting for a core, not for its own work.
            used = meter.stop()
            apiservers = sum(v for k, v in used.items() if k.endswith("/kube-apiserver"))
            named = ("total", "provider", "floor", "bench", "etcd")
            result["churn_cores"] = {
                **{k: used.get(k, 0.0) for k in named},
                "apiservers": round(apiservers, 2),
                "rest of the lab": round(used["total"] - sum(used.get(k, 0.0) for k in named[1:]) - apiservers, 2),
                "machine idle": used.get("machine idle", 0.0),
                "machine steal": used.get("machine steal", 0.0),
            }
            # The round trips as this process's watches saw them, for comparison with the
            # observer's below (the difference is this process's own delay in reading).
            bench_seen = {
                "provider": _trip_summary(_trips(new, dict(phases.times("Running")), _running(watches), t0)),
                "floor": _trip_summary(_trips(floor_new, _running(floor_watches[:1]), _running(floor_watches[1:]), t0)),
            }
            observed = await watcher.stop()
            front_running, member_running = _observed(observed, "front"), _observed(observed, "member/")
            floor_front, floor_member = _observed(observed, "floor"), _observed(observed, "floor-member/")
            floor_trips = _trips(floor_new, floor_front, floor_member, t0)
            limit = TARGETS["churn.round_trip_ms_p99"] / 1000
            slow = {n for n in new if front_running.get(n, 0.0) - member_running.get(n, math.inf) > limit}
            # the front end's audit log, read once for the three splits
            front_audit = audit.records(lab, "offline", users={endtoend.USER, cpufloor.USER})
            result["churn"] = {
                "pods_per_s": args.churn,
                "seconds": args.seconds,
                **_trip_summary(_trips(new, front_running, member_running, t0)),
                "seen_by_this_process": bench_seen,
                "started_at": round(t0, 3),  # time.monotonic, as bench.stalls's records
                "split_ms": _split(front_audit, ns, set(new), member_running, front_running, endtoend.USER),
                "slow_split_ms": _split(front_audit, ns, slow, member_running, front_running, endtoend.USER),
                "slow_creates": _creates_late(lab, member_ns, slow, member_running, endtoend.USER),
                "provider": _inside(seen, await proc.histograms()),
                # The same round trip through the floor process (bench.cpufloor), fed
                # --floor pods/s at the same time: what any relay pays on this lab now.
                "floor": {
                    "pods_per_s": args.floor,
                    **_trip_summary(floor_trips),
                    "split_ms": _split(
                        front_audit, floor.namespace, set(floor_new), floor_member, floor_front, cpufloor.USER
                    ),
                },
            }
            if floor_trips:
                result["churn"]["p99_vs_floor"] = round(
                    result["churn"]["round_trip_ms_p99"] / max(result["churn"]["floor"]["round_trip_ms_p99"], 1.0),
                    2,
                )
        result["targets"] = TARGETS
        print(json.dumps(result, indent=2), flush=True)  # before the clean-up, which can take minutes
        if proc.proc is not None and proc.proc.poll() is not None:  # its member pods would never go
            tail = (workdir / "vk.log").read_text(errors="replace")[-3000:]  # the directory goes
            raise RuntimeError(f"vkprovider exited ({proc.proc.returncode}); the end of its log:\n{tail}")
        if args.state:  # a lab of its own is thrown away whole; a developer's lab is kept clean
            await endtoend.clean(lab, front, ns, timeout=1800)
    return result


def _pod_settings(args: argparse.Namespace) -> dict[str, int] | None:
    """The provider's `pods` settings the command line overrides (none: its defaults)."""
    settings = {"workers": args.workers, "status_workers": args.status_workers}
    return {k: v for k, v in settings.items() if v} or None


def _running(watches: list[endtoend.Phases]) -> dict[str, float]:
    out: dict[str, float] = {}
    for watch in watches:
        out.update(watch.times("Running"))
    return out


def _streams(lab: LabState, ns: str, floor_ns: str) -> list[observer.Stream]:
    """What bench.observer times: the churn's pods at the front end and in each member (by
    label: the namespaces hold 10,000 others), and the floor's (its namespace holds no others)."""
    front, selector = str(lab.kubeconfig("offline")), f"{CHURN}=1"
    member_ns = forge.member_namespace(ns, endtoend.PREFIX)
    streams = [observer.Stream(name="front", kubeconfig=front, namespace=ns, selector=selector, key="name")]
    streams.append(observer.Stream(name="floor", kubeconfig=front, namespace=floor_ns, selector="", key="name"))
    for m in endtoend.members(lab):
        config = str(lab.kubeconfig(m))
        streams += [
            observer.Stream(
                name=f"member/{m}", kubeconfig=config, namespace=member_ns, selector=selector, key=labels.ORIGIN_NAME
            ),
            observer.Stream(name=f"floor-member/{m}", kubeconfig=config, namespace=floor_ns, selector="", key="name"),
        ]
    return streams


def _observed(seen: dict[str, observer.Seen], prefix: str) -> dict[str, float]:
    """When each pod was first seen Running in the streams named `prefix` (or starting so)."""
    out: dict[str, float] = {}
    for stream, pods in seen.items():
        if stream == prefix or (prefix.endswith("/") and stream.startswith(prefix)):
            out.update({name: phases["Running"] for name, phases in pods.items() if "Running" in phases})
    return out


def _trips(names: list[str], front: dict[str, float], member: dict[str, float], t0: float) -> list[tuple[float, float]]:
    """(member Running -> front-end Running, when it ran in seconds into the churn), sorted."""
    return sorted((front[n] - member[n], member[n] - t0) for n in names if n in member and n in front)


def _p99(ordered: list[float]) -> float:
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def _trip_summary(trips: list[tuple[float, float]]) -> dict[str, Any]:
    if not trips:
        return {"measured": 0}
    return {
        "round_trip_ms_p50": round(statistics.median(t for t, _ in trips) * 1000, 1),
        "round_trip_ms_p99": round(_p99([t for t, _ in trips]) * 1000, 1),
        "round_trip_ms_max": round(trips[-1][0] * 1000, 1),
        "measured": len(trips),
        # When the slow trips' pods ran (seconds into the churn): bunched, they point to a
        # stall; spread, to a queue.
        "slow_at_s": [round(at, 1) for trip, at in trips if trip > TARGETS["churn.round_trip_ms_p99"] / 1000],
    }


def _split(
    records: list[audit.AuditRecord],
    ns: str,
    names: set[str],
    member: dict[str, float],
    front: dict[str, float],
    user: str,
) -> dict[str, Any]:
    """Where the round trips of `names` lost their time, from the front end's audit `records`
    of `user`: member Running seen -> the status patch received by the
    apiserver (the relay's watch of the member, its queue and its work) -> the patch answered (the apiserver) ->
    front-end Running seen. `member` and `front` are bench.observer's times. p50, p99 and max, ms."""
    names = {n for n in names if n in member and n in front}
    if not names:
        return {}
    wall = time.time() - time.monotonic()  # audit stamps are wall-clock times; ours monotonic
    patch: dict[str, audit.AuditRecord] = {}
    for rec in records:
        # the last status patch the front end answered before the pod was seen Running
        if (
            rec.user == user
            and rec.name in names
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
    out: dict[str, Any] = {"pods": len(names), "patches_found": len(patch)}
    for part, values in parts.items():
        if values:
            values.sort()
            out[part] = {
                "p50": round(statistics.median(values) * 1000, 1),
                "p99": round(_p99(values) * 1000, 1),
                "max": round(values[-1] * 1000, 1),
            }
    return out


def _creates_late(
    lab: LabState, member_ns: str, names: set[str], member: dict[str, float], user: str
) -> dict[str, Any]:
    """For the slow trips: how long after the member pod was seen Running (bench.observer)
    the provider's create of it was answered (the members' audit logs). Above zero, the pod ran
    while the create was still in flight, and its status waited for that sync."""
    wall = time.time() - time.monotonic()
    late = sorted(
        rec.completed - wall - member[rec.name]
        for cluster in lab.clusters
        if cluster != "offline"
        for rec in audit.records(lab, cluster, users={user})
        if rec.name in names and rec.namespace == member_ns and rec.verb == "create" and rec.name in member
    )
    if not late:
        return {}
    return {
        "creates_found": len(late),
        "answered_after_running": sum(1 for x in late if x > 0),
        "ms_p50": round(statistics.median(late) * 1000, 1),
        "ms_max": round(late[-1] * 1000, 1),
    }


def _inside(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> dict[str, Any]:
    """Where the provider's time went meanwhile, from its own histograms: bucket bounds in ms of
    the p50/p99 (and the worst) of its syncs, its queue wait and its event loop's lag."""
    out: dict[str, Any] = {}
    for label, name in (
        ("sync", 'vkprovider_pod_sync_seconds{result="ok"}'),
        ("queue_wait", 'vkprovider_workqueue_wait_seconds{lane="plain",queue="pods"}'),
        ("urgent_wait", 'vkprovider_workqueue_wait_seconds{lane="urgent",queue="pods"}'),
        ("loop_lag", "vkprovider_event_loop_lag_seconds{}"),
        ("status_lag", "vkprovider_status_lag_seconds{}"),
    ):
        if name not in after:  # a histogram renamed or gone must not read as "observed nothing"
            raise RuntimeError(f"the provider no longer exposes {name}")
        for q in (0.5, 0.99, 1.0):
            bound = bucket_quantile(before.get(name, {}), after[name], q)
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
    parser.add_argument("--workers", type=int, default=0, help="the provider's pods.workers (default: its own)")
    parser.add_argument(
        "--status-workers", type=int, default=0, help="the provider's pods.status_workers (default: its own)"
    )
    parser.add_argument(
        "--floor", type=float, default=4.0, help="pods/s fed to the floor process during the churn, for comparison"
    )
    parser.add_argument(
        "--cpu-nice",
        type=int,
        default=0,
        help="the CPU weight (autogroup nice, -20..19) of the provider's and the floor's sessions: a "
        "negative value stands for the cores a deployment reserves for them, which this machine's lab "
        "otherwise takes when it saturates both cores",
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the provider in the churn, to FILE")
    args = parser.parse_args()
    spec = lab_mod.LabSpec(members=3, nodes_per_member=40)
    asyncio.run(on_lab(args.state, spec, lambda state, workdir: run(state, workdir, args)))


if __name__ == "__main__":
    main()
