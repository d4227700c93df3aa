"""Benchmark: `kubectl exec` through the virtual node against the same `kubectl exec` straight
to the member pod, in the same run (issue 12). The virtual path is kubectl -> offline apiserver
-> our kubelet port (SPDY) -> the federation provider -> member apiserver (WebSocket) -> KWOK;
the direct one skips the offline apiserver and the provider.

  - round trip: one `exec -i ... cat` session, a line written and its echo read back, repeated;
  - session: `exec ... true`, start to exit (kubectl's own start-up included on both sides);
  - output: `exec ... head -c N /dev/zero` read to the end, in MB/s;
  - input: `exec -i ... sh -c 'head -c N >/dev/null; echo done'`, in MB/s.

Targets (issue 12): at least 50 % of the direct throughput, under 20 ms added round trip p50.
The provider's own cost is reported as CPU seconds per GiB carried (`CpuMeter`), which is what
carries over to a cluster where the apiservers are not on the same 2 cores.
Run: `.venv/bin/python -m bench.streams [--state DIR] [--rounds 200] [--mib 256]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import CpuMeter, Provider, lab_pids, on_lab
from e2e import binaries
from e2e import lab as lab_mod
from federation import labels
from vkprovider.kube import KubeClient, load_kubeconfig

MIB = 1024 * 1024


def _pod(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "bench"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "work", "image": "registry.example/work:1"}],
        },
    }


async def _wait(probe: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


async def round_trips(argv: list[str], rounds: int) -> list[float]:
    child = await asyncio.create_subprocess_exec(
        *argv, "-i", "--", "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    samples = []
    try:
        for i in range(rounds + 5):
            line = f"round {i}\n".encode()
            started = time.perf_counter()
            child.stdin.write(line)
            await child.stdin.drain()
            echoed = await asyncio.wait_for(child.stdout.readline(), timeout=30)
            if echoed != line:
                raise RuntimeError(f"echo {echoed!r} for {line!r}")
            if i >= 5:  # the first rounds warm the path up
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        child.kill()
        await child.communicate()
    return samples


async def _sessions(argv: list[str], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        child = await asyncio.create_subprocess_exec(*argv, "--", "true")
        if await child.wait() != 0:
            raise RuntimeError(f"{argv} -- true exited {child.returncode}")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _output(argv: list[str], size: int) -> float:
    child = await asyncio.create_subprocess_exec(
        *argv, "--", "head", "-c", str(size), "/dev/zero", stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    started, got = time.perf_counter(), 0
    while chunk := await child.stdout.read(1 << 20):
        got += len(chunk)
    await child.wait()
    if got != size:
        raise RuntimeError(f"read {got} of {size} bytes")
    return size / MIB / (time.perf_counter() - started)


async def _input(argv: list[str], size: int) -> float:
    # KWOK never closes a command's stdin: the command reads exactly `size` bytes, then answers.
    child = await asyncio.create_subprocess_exec(
        *argv, "-i", "--", "sh", "-c", f"head -c {size} >/dev/null; echo done",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    block = bytes(MIB)
    started = time.perf_counter()
    for _ in range(size // MIB):
        child.stdin.write(block)
        await child.stdin.drain()
    said = await asyncio.wait_for(child.stdout.readline(), timeout=120)
    elapsed = time.perf_counter() - started
    child.kill()
    await child.communicate()
    if said != b"done\n":
        raise RuntimeError(f"the command said {said!r}")
    return size / MIB / elapsed


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(len(ordered) * 0.9)], 2),
        "n": len(ordered),
    }


async def run(state: Path, workdir: Path, *, rounds: int, mib: int) -> dict[str, Any]:
    lab = lab_mod.load_running(state)
    kubectl = str(binaries.ensure_all()["kubectl"])
    offline, member_1 = lab.kubeconfig("offline"), lab.kubeconfig("member-1")
    node = f"vk-bench-streams-{uuid.uuid4().hex[:6]}"
    ns = f"bench-streams-{uuid.uuid4().hex[:6]}"
    config: dict[str, Any] = {
        "kube": {"kubeconfig": str(offline)},
        "node": {"name": node},
        "provider": {
            "type": "federation",
            "federation": {"members": [{"name": "member-1", "kubeconfig": str(member_1)}]},
        },
    }
    size = mib * MIB
    results: dict[str, Any] = {}
    async with (
        KubeClient(load_kubeconfig(offline)) as front,
        KubeClient(load_kubeconfig(member_1)) as member,
        Provider(config, workdir) as provider,
    ):
        await front.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        try:
            await _wait(lambda: _has_node(front, node), "the virtual node")
            await front.create(f"/api/v1/namespaces/{ns}/pods", _pod(node))

            async def running() -> bool:
                pod = await front.get(f"/api/v1/namespaces/{ns}/pods/bench")
                return bool(pod.get("status", {}).get("phase") == "Running")

            await _wait(running, "the pod running in member-1")
            listed = await member.get("/api/v1/pods")
            member_pod = next(
                p["metadata"]
                for p in listed["items"]
                if (p["metadata"].get("annotations") or {}).get(labels.ORIGIN_NAME) == "bench"
                and (p["metadata"].get("annotations") or {}).get(labels.ORIGIN_NAMESPACE) == ns
            )
            paths = {
                "virtual": [kubectl, "--kubeconfig", str(offline), "-n", ns, "exec", "bench"],
                "direct": [
                    kubectl, "--kubeconfig", str(member_1), "-n", member_pod["namespace"], "exec", member_pod["name"],
                ],
            }  # fmt: skip
            pids = {"provider": provider.pid, **lab_pids(state, ["offline", "member-1"])}
            for name, argv in paths.items():
                meter = CpuMeter(pids)
                meter.start()
                started = time.monotonic()
                out_rate = await _output(argv, size)
                in_rate = await _input(argv, size)
                cores = meter.stop()
                busy = time.monotonic() - started
                results[name] = {
                    "round_trip_ms": summary(await round_trips(argv, rounds)),
                    "session_ms": summary(await _sessions(argv, 10)),
                    "output_mb_s": round(out_rate, 1),
                    "input_mb_s": round(in_rate, 1),
                    "cores_during_throughput": cores,
                    "provider_cpu_s_per_gib": round(cores.get("provider", 0.0) * busy / (2 * size / (1 << 30)), 3),
                }
        finally:
            await front.delete(f"/api/v1/namespaces/{ns}")
    virtual, direct = results["virtual"], results["direct"]
    results["ratios"] = {
        "output_throughput": round(virtual["output_mb_s"] / direct["output_mb_s"], 2),
        "input_throughput": round(virtual["input_mb_s"] / direct["input_mb_s"], 2),
        "added_round_trip_p50_ms": round(virtual["round_trip_ms"]["p50"] - direct["round_trip_ms"]["p50"], 2),
        "added_session_p50_ms": round(virtual["session_ms"]["p50"] - direct["session_ms"]["p50"], 1),
    }
    return results


async def _has_node(client: KubeClient, name: str) -> bool:
    nodes = await client.get("/api/v1/nodes")
    return any(n["metadata"]["name"] == name for n in nodes["items"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()

    async def go(state: Path, workdir: Path) -> dict[str, Any]:
        return await run(state, workdir, rounds=args.rounds, mib=args.mib)

    result = asyncio.run(on_lab(args.state, lab_mod.LabSpec(members=1, nodes_per_member=20), go))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
