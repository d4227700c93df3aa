"""The CPU floor of a Python provider: what dispatching a pod costs a process that does only the
API work every provider must do for it, with the provider's own client (vkprovider.kube).

Per pod the floor process decodes the front-end watch event that brings the pod bound to its
node, creates a copy in a member (round robin, no translation beyond name and namespace), decodes
the member's watch events until the copy runs, and writes its status once to the front end
(decoding the answer and the echo of its own write). No placement, capacity, status mapping,
pinning, reflection or logging: what is left is the cost of the HTTPS requests and the JSON
this Python and this client pay per pod. Its CPU per pod is measured from outside, as the
provider's is (bench.endtoend), in the same run and on the same lab, so the provider's figure
can be read against it: what the provider adds is its own logic.

Run as `python -m bench.cpufloor serve ...` by `floor_cpu` (bench.endtoend, phase endtoend).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.endtoend import Cpu, Phases, create_all, members, pod
from e2e import audit
from e2e import lab as lab_mod
from e2e.state import LabState
from vkprovider.kube import AlreadyExists, ApiError, Gone, KubeClient, ensure_namespace, load_kubeconfig

ORIGIN = "bench.vkprovider.io/origin"
USER = "vkprovider-floor"


@dataclass(frozen=True)
class Relay:
    """A running floor process: the front-end node and namespace it serves."""

    node: str
    namespace: str
    proc: asyncio.subprocess.Process


KEPT = ("name", "image", "resources")  # of a container: not its mounts of front-end volumes


async def _watch(client: KubeClient, path: str, params: dict[str, str], handle: Any) -> None:
    while True:
        listed = await client.list(path, params=params)
        for obj in listed["items"]:
            handle("ADDED", obj)
        rv = listed["metadata"]["resourceVersion"]
        try:
            while True:
                async for event in client.watch(path, resource_version=rv, params=params):
                    obj = event["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] != "BOOKMARK":
                        handle(event["type"], obj)
        except Gone:
            continue


async def serve(front_config: Path, member_configs: list[Path], node: str, namespace: str, count: int) -> None:
    gate = asyncio.Semaphore(50)
    tasks: set[asyncio.Task[None]] = set()
    sent: set[str] = set()
    reported: set[str] = set()
    done = asyncio.Event()
    async with KubeClient(load_kubeconfig(front_config), connection_limit=100) as front:
        clients = [KubeClient(load_kubeconfig(path), connection_limit=100) for path in member_configs]
        for client in clients:
            await client.__aenter__()
            await ensure_namespace(client, namespace)
        spread = itertools.cycle(clients)

        async def create(client: KubeClient, front_pod: dict[str, Any]) -> None:
            name = front_pod["metadata"]["name"]
            body = {
                "metadata": {"name": name, "labels": {ORIGIN: "true"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{k: c[k] for k in KEPT if k in c} for c in front_pod["spec"]["containers"]],
                },
            }
            async with gate:
                try:
                    await client.create(f"/api/v1/namespaces/{namespace}/pods", body)
                except AlreadyExists:
                    pass

        async def report(member_pod: dict[str, Any]) -> None:
            status = member_pod["status"]
            carried = ("phase", "conditions", "containerStatuses", "podIP")
            patch = {"status": {k: status[k] for k in carried if k in status}}
            async with gate:
                await front.patch(
                    f"/api/v1/namespaces/{namespace}/pods/{member_pod['metadata']['name']}/status",
                    patch,
                    patch_type="merge",
                )
            if len(reported) >= count:
                done.set()

        def finished(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                print(f"cpufloor: {task.exception()}", file=sys.stderr, flush=True)
                os._exit(1)  # the parent sees the exit, not a wait that never ends

        def spawn(coro: Any) -> None:
            task = asyncio.get_running_loop().create_task(coro, name="cpufloor/write")
            tasks.add(task)
            task.add_done_callback(finished)

        def on_front(kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if kind != "DELETED" and name not in sent:
                sent.add(name)
                spawn(create(next(spread), obj))

        def on_member(kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if (obj.get("status") or {}).get("phase") == "Running" and name not in reported:
                reported.add(name)
                spawn(report(obj))

        path = f"/api/v1/namespaces/{namespace}/pods"
        watches = [
            asyncio.create_task(
                _watch(front, path, {"fieldSelector": f"spec.nodeName={node}"}, on_front),
                name="cpufloor/front",
            ),
            *(
                asyncio.create_task(
                    _watch(c, path, {"labelSelector": f"{ORIGIN}=true"}, on_member),
                    name="cpufloor/member",
                )
                for c in clients
            ),
        ]
        print("ready", flush=True)
        try:
            await done.wait()
            await asyncio.gather(*tasks)
            await asyncio.sleep(3600)  # until the parent has read the CPU and stops it
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            for client in clients:
                await client.__aexit__(None, None, None)


@asynccontextmanager
async def relay(lab: LabState, front: KubeClient, *, count: int = 10**9) -> AsyncIterator[Relay]:
    """The floor process serving a fresh node and namespace for the block (its pods, front end
    and members, deleted after): it reports Running until `count` pods have run."""
    node = f"vk-floor-{uuid.uuid4().hex[:5]}"
    ns = f"floor-{uuid.uuid4().hex[:5]}"
    names = members(lab)
    await ensure_namespace(front, ns)
    # A node object, so the front end's pod GC does not take its pods for orphans.
    await front.create("/api/v1/nodes", {"metadata": {"name": node}})

    # audited as the provider is, so its calls can be timed from the apiservers' record too
    def config(cluster: str) -> str:
        return str(audit.user_kubeconfig(lab, cluster, USER, groups=("system:masters",)))

    argv = ["serve", "--front", config("offline"), "--node", node, "--namespace", ns, "--count", str(count)]
    argv += itertools.chain.from_iterable(("--member", config(m)) for m in names)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.cpufloor", *argv, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )  # its own CPU share, as the provider's (bench.common.Provider)
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 60)
        await asyncio.sleep(1)
        yield Relay(node=node, namespace=ns, proc=proc)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        # Best effort: a collection delete of the churned pods timed out on a saturated lab
        # (2026-12-02) and took the run's figures with it; the bench's lab goes with the run.
        with suppress(ApiError):
            await front.delete(f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
        with suppress(ApiError):
            await front.delete(f"/api/v1/namespaces/{ns}")
        with suppress(ApiError):
            await front.delete(f"/api/v1/nodes/{node}")
        for name in names:
            async with KubeClient(load_kubeconfig(lab.kubeconfig(name))) as member:
                with suppress(ApiError):
                    await member.delete(f"/api/v1/namespaces/{ns}")


async def floor_cpu(state: Path, count: int) -> dict[str, Any]:
    """`count` plain pods bound to a node in the front end until the floor process has reported
    them Running there: its CPU per pod, measured as the provider's is."""
    lab = lab_mod.load_running(state)
    async with (
        KubeClient(load_kubeconfig(lab.kubeconfig("offline")), connection_limit=200) as front,
        relay(lab, front, count=count) as floor,
        Phases(front, floor.namespace) as phases,
    ):
        cpu = Cpu(floor.proc.pid)
        before, started = cpu.seconds(), time.monotonic()
        await create_all(front, floor.namespace, [pod(f"p{i:05d}", floor.node) for i in range(count)])
        running = asyncio.create_task(phases.wait("Running", count), name="cpufloor/running")
        exited = asyncio.create_task(floor.proc.wait(), name="cpufloor/exited")
        await asyncio.wait([running, exited], return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            running.cancel()
            raise RuntimeError(f"the floor process exited ({floor.proc.returncode}) before all pods ran")
        exited.cancel()
        last = running.result()
        await asyncio.sleep(2.0)  # as for the provider: the writes' echoes arrive
        used = cpu.seconds() - before
    return {"pods": count, "all_running_s": round(last - started, 1), "cpu_ms_per_pod": round(used / count * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve")
    run.add_argument("--front", type=Path, required=True)
    run.add_argument("--member", type=Path, action="append", required=True)
    run.add_argument("--node", required=True)
    run.add_argument("--namespace", required=True)
    run.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.front, args.member, args.node, args.namespace, args.count))


if __name__ == "__main__":
    main()
