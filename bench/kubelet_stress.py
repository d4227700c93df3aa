"""Benchmark: the kubelet port under a hostile mix (issue 35). A well-behaved `kubectl exec -i
cat` through the real front-end apiserver measures its round trip (a line written, its echo
read) first alone, then while N hostile sessions reach the port directly as authorized tenants
(e2e.hostile: stream floods, PING floods, 64 MiB WebSocket messages, `cat` fed and never read,
a quarter each, from two identities). Reported: the well-behaved round trip p50/p99 alone, as
the storm begins (the sessions' first bursts) and as it goes on,
the provider's RSS (before, and its peak from /proc VmHWM) against its memory budget, the
provider's CPU (cores) in each phase, and which limits were hit how often.

The in-memory provider serves the exec (its built-in `cat`): the kubelet port's code is the same
for every provider, and no member's cost is mixed into the figures. Port-forward pair floods need
a provider that forwards ports; they are covered by tests/unit/test_kubelet_limits.py.
Run: `.venv/bin/python -m bench.kubelet_stress [--state DIR] [--sessions 200] [--rounds 200]
[--budget-mib 1024]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import CpuMeter, Provider, on_lab
from bench.streams import round_trips, summary
from e2e import binaries, hostile
from e2e import lab as lab_mod
from vkprovider.kube import KubeClient, load_kubeconfig

MIB = 1024 * 1024


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def _with_p99(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {**summary(samples), "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2)}


async def _limits_hit(provider: Provider) -> dict[str, float]:
    return (await provider.scrape()).by_label("vkprovider_kubelet_limits_hit_total", "limit")


async def _wait(probe: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await probe():
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


async def run(
    state: Path, workdir: Path, *, sessions: int, rounds: int, steady_rounds: int, budget_mib: int
) -> dict[str, Any]:
    lab = lab_mod.load_running(state)
    kubectl = str(binaries.ensure_all()["kubectl"])
    offline = lab.kubeconfig("offline")
    node = f"vk-bench-hostile-{uuid.uuid4().hex[:6]}"
    ns = f"bench-hostile-{uuid.uuid4().hex[:6]}"
    config: dict[str, Any] = {
        "kube": {"kubeconfig": str(offline)},
        "node": {"name": node},
        "provider": {"type": "memory", "memory": {"startup_delay": 0.1}},
        "http": {"memory_budget_bytes": budget_mib * MIB},
    }
    results: dict[str, Any] = {"sessions": sessions, "budget_mib": budget_mib}
    async with KubeClient(load_kubeconfig(offline)) as front, Provider(config, workdir) as provider:
        await front.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        try:
            pod = {
                "metadata": {"name": "bench"},
                "spec": {
                    "nodeName": node,
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "containers": [{"name": "main", "image": "registry.example/bench:1"}],
                },
            }
            await front.create(f"/api/v1/namespaces/{ns}/pods", pod)

            async def running() -> bool:
                got = await front.get(f"/api/v1/namespaces/{ns}/pods/bench")
                return bool(got.get("status", {}).get("phase") == "Running")

            await _wait(running, "the pod running")
            argv = [kubectl, "--kubeconfig", str(offline), "-n", ns, "exec", "bench"]
            port = provider.config["http"]["port"]
            targets = []
            for user in ("bench-hostile-a", "bench-hostile-b"):
                await hostile.grant_nodes_proxy(front, user)
                creds = hostile.with_cert(hostile.client_cert(lab.root, user, workdir))
                targets.append(hostile.Target(port, ns, "bench", "main", creds))

            meter = CpuMeter({"provider": provider.pid})
            meter.start()
            alone = await round_trips(argv, rounds)
            results["alone"] = {"round_trip_ms": _with_p99(alone), "cores": meter.stop()}

            rss_before = _status_bytes(provider.pid, "VmRSS")
            tally = hostile.Tally()
            tasks, _ = await hostile.mix(targets, per_kind=sessions // len(hostile.KINDS), tally=tally)
            try:
                await _wait(lambda: _answered(tally, sessions), "every hostile session answered")
                meter = CpuMeter({"provider": provider.pid})
                meter.start()
                storm = await round_trips(argv, rounds)
                results["hostile"] = {"round_trip_ms": _with_p99(storm), "cores": meter.stop()}
                # Then the storm as it goes on: the sessions' first bursts are spent.
                meter = CpuMeter({"provider": provider.pid})
                meter.start()
                steady = await round_trips(argv, steady_rounds)
                results["hostile_steady"] = {"round_trip_ms": _with_p99(steady), "cores": meter.stop()}
            finally:
                ended = await hostile.stop(tasks)
            results["hostile"]["sessions"] = {"admitted": tally.admitted, "refused": tally.refused}
            results["hostile"]["ended"] = {r: ended.count(r) for r in sorted(set(ended))}
            results["rss_mib"] = {
                "before": round(rss_before / MIB, 1),
                "peak": round(_status_bytes(provider.pid, "VmHWM") / MIB, 1),
            }
            results["limits_hit"] = await _limits_hit(provider)
        finally:
            await front.delete(f"/api/v1/namespaces/{ns}")
    alone_p99 = results["alone"]["round_trip_ms"]["p99"]
    results["p99_ratio"] = {
        phase: round(results[phase]["round_trip_ms"]["p99"] / alone_p99, 2) for phase in ("hostile", "hostile_steady")
    }
    return results


async def _answered(tally: hostile.Tally, sessions: int) -> bool:
    return tally.answered >= sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, default=None)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=200, help="round trips alone, and as the storm begins")
    parser.add_argument("--steady-rounds", type=int, default=20000, help="round trips as the storm goes on")
    parser.add_argument("--budget-mib", type=int, default=1024)
    args = parser.parse_args()

    async def go(state: Path, workdir: Path) -> dict[str, Any]:
        return await run(
            state,
            workdir,
            sessions=args.sessions,
            rounds=args.rounds,
            steady_rounds=args.steady_rounds,
            budget_mib=args.budget_mib,
        )

    result = asyncio.run(on_lab(args.state, lab_mod.LabSpec(members=1, nodes_per_member=2), go))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
