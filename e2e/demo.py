"""`make demo`: the product on the lab.

vkprovider runs with the federation provider in pooled mode over the three members: one virtual
node in the offline cluster shows what the members can lend. Then come a PS-worker gang (2 PS +
4 V100 workers, same network pod), an elastic ring-allreduce job (minimum 4 of 8 workers) and
plain pods. Each job is pinned to one member; the status tables show capacity, jobs and pins.
A hybrid job follows: its launcher and two workers routed to the offline cluster's own nodes,
six elastic workers to the virtual node (the provider's routing webhook, by band). Then online
load returns and capacity is given back.
Everything keeps running afterwards (`make down` stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import binaries, online, stacks, state, status
from e2e import lab as lab_mod
from e2e.components import SCRAPED_LABEL
from vkprovider import status as vk_status
from vkprovider.kube import AlreadyExists, ApiError, KubeClient, ensure_namespace, load_kubeconfig

NODE = "vk-pool"
PORT = 10250
HEALTH = 10255
NS = "demo"
V100 = "Tesla-V100-SXM2-32GB"
TOLERATE = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]


def _pid_file(state_dir: Path) -> Path:
    return state_dir / "vkprovider.pid"


def stop_runtime(state_dir: Path) -> None:
    pid_file = _pid_file(state_dir)
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
    pid_file.unlink(missing_ok=True)


def _kubectl(lab: state.LabState, *args: str) -> str:
    kubectl = binaries.ensure_all()["kubectl"]
    cmd = [str(kubectl), "--kubeconfig", str(lab.kubeconfig("offline")), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout


def _pod(name: str, *, priority_class: str, requests: dict[str, str], **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"type": "virtual-kubelet"},
        "tolerations": TOLERATE,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/trainer:1",
                "resources": {"requests": requests, "limits": {k: v for k, v in requests.items() if "/" in k}},
            }
        ],
    }
    spec.update(extra.pop("spec", {}))
    # What KWOK reports the member pod uses (e2e/kwok/metrics.yaml): 70 % of its CPU request and
    # 300Mi, read back by `kubectl top` on the front end.
    cpu = requests.get("cpu", "1")
    millicores = int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)
    usage = {"kwok.x-k8s.io/usage-cpu": f"{millicores * 7 // 10}m", "kwok.x-k8s.io/usage-memory": "300Mi"}
    return {"metadata": {"name": name, "annotations": usage, **extra}, "spec": spec}


def _group(name: str, min_count: int, annotations: dict[str, str]) -> dict[str, Any]:
    # A native gang's pods share its priority (the scheduler refuses mixed ones), so roles are
    # told by the vkprovider.io/role label rather than by priority bands here.
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}, "priorityClassName": "train-worker-min"},
    }


async def _submit_jobs(client: KubeClient) -> None:
    await ensure_namespace(client, NS)
    for name, value in (("train-worker-min", 1500), ("train-worker-max", 500)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        with contextlib.suppress(AlreadyExists):
            await client.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    groups = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NS}/podgroups"
    pods = f"/api/v1/namespaces/{NS}/pods"
    objects: list[tuple[str, dict[str, Any]]] = [
        # PS-worker: 2 parameter servers and 4 V100 workers, all in one network pod.
        (groups, _group("ps-worker", 6, {"vkprovider.io/same-network-pod": "true", "vkprovider.io/gpu-model": V100})),
        *(
            (
                pods,
                _pod(
                    f"ps-{i}",
                    priority_class="train-worker-min",
                    requests={"cpu": "8", "memory": "32Gi"},
                    labels={"vkprovider.io/role": "ps"},
                    spec={"schedulingGroup": {"podGroupName": "ps-worker"}},
                ),
            )
            for i in range(2)
        ),
        *(
            (
                pods,
                _pod(
                    f"worker-{i}",
                    priority_class="train-worker-min",
                    requests={"cpu": "8", "nvidia.com/gpu": "1"},
                    spec={"schedulingGroup": {"podGroupName": "ps-worker"}},
                ),
            )
            for i in range(4)
        ),
        # Elastic ring-allreduce: at least 4 workers, up to 8.
        (groups, _group("ring", 4, {})),
        *(
            (
                pods,
                _pod(
                    f"ring-{i}",
                    priority_class="train-worker-min",
                    requests={"cpu": "16", "memory": "64Gi"},
                    labels={"vkprovider.io/role": "worker-min" if i < 4 else "worker-max"},
                    spec={"schedulingGroup": {"podGroupName": "ring"}},
                ),
            )
            for i in range(8)
        ),
        # Plain batch pods.
        *((pods, _pod(f"etl-{i}", priority_class="train-worker-max", requests={"cpu": "2"})) for i in range(3)),
    ]
    for path, body in objects:
        with contextlib.suppress(AlreadyExists):
            await client.create(path, body)


async def demo(state_dir: Path, with_stacks: tuple[str, ...] = ()) -> None:
    state_dir = state_dir.resolve()
    existing = state.load(state_dir) if (state_dir / "state.json").exists() else None
    if existing and lab_mod.is_running(existing):
        lab = existing
        print(f"reusing the lab running in {state_dir}")
        if with_stacks:
            await lab_mod.add_stacks(state_dir, with_stacks)
    else:
        print("starting the lab: offline (3 native nodes) + 3 members x 20 simulated nodes (cpu, gpu-v100, gpu-t4)")
        spec = lab_mod.LabSpec(members=3, nodes_per_member=20, offline_nodes=3, stacks=with_stacks)
        lab = await lab_mod.up(state_dir, spec)
    print(await status.table(lab))
    await online.set_load(lab.kubeconfig("member-1"), cpu_share=0.3, wait=True, name="web")
    print("\nonline load in member-1: 30 % of its CPU")

    stop_runtime(state_dir)
    config = yaml.safe_load(lab_mod.provider_config(lab, "federation", node=NODE, port=PORT))
    config["http"]["health_port"] = HEALTH
    # The front end's metrics-server scrapes the nodes labelled so (e2e.components).
    config["node"]["labels"] = {SCRAPED_LABEL: "true"}
    config["log"] = {"format": "json"}
    # A short checkpoint notice, so the demo's reclaim step is over in seconds.
    for member in config["provider"]["federation"]["members"]:
        member["reclaim"] = {"notice_seconds": RECLAIM_NOTICE}
    config["provider"]["federation"]["routing"] = {"enabled": True, "port": ROUTING, "bind": "127.0.0.1"}
    config_path = state_dir / "vkprovider.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = open(state_dir / "logs" / "vkprovider.log", "ab")  # noqa: SIM115 - handed to the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "vkprovider.cli", "run", "--config", str(config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _pid_file(state_dir).write_text(str(proc.pid))
    print(f"vkprovider started with the federation provider (pid {proc.pid}, log {state_dir}/logs/vkprovider.log)")

    url = f"http://127.0.0.1:{HEALTH}"
    for _ in range(300):
        try:
            view = vk_status.fetch(url)
            if len(view.get("members", {})) == 3 and all("lent" in m for m in view["members"].values()):
                break
        except OSError:
            pass
        await asyncio.sleep(0.2)
    print("\n$ vkprovider status   # what the members can lend")
    print(vk_status.render(vk_status.fetch(url)))

    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        await _submit_jobs(client)
        for _ in range(150):
            items = (await client.list(f"/api/v1/namespaces/{NS}/pods"))["items"]
            if sum(1 for p in items if p["status"].get("phase") == "Running") >= 17:
                break
            await asyncio.sleep(0.2)
    # The members' inventories see the pods a moment after the front end shows them Running.
    for _ in range(75):
        if _used_cpu(vk_status.fetch(url)) >= DEMO_CPU:
            break
        await asyncio.sleep(0.2)
    print(f"\n$ kubectl -n {NS} get pods -o wide   # all bound to the one virtual node")
    print(_kubectl(lab, "-n", NS, "get", "pods", "-o", "wide"))
    print("$ vkprovider status   # capacity now, and where each job was pinned")
    print(vk_status.render(vk_status.fetch(url)))
    print()
    print(await status.table(lab))
    await _hybrid_step(lab)
    await _reclaim_step(lab, url)
    await _top_step(lab)
    print(f"\nall of it keeps running; kubeconfigs in {state_dir}/kubeconfig/, stop it with `make down`")


RECLAIM_NOTICE = 10
ROUTING = 9443
HYBRID_NS = "hybrid"


async def _hybrid_step(lab: state.LabState) -> None:
    """A hybrid job in a namespace routed `hybrid`: its pods say nothing about nodes; the floor
    (launcher, 2 workers) lands on native nodes, the 6 elastic workers on the virtual node."""
    print(f"\nnamespace {HYBRID_NS} labelled vkprovider.io/routing=hybrid; a job of 1 launcher, 2 workers (its")
    print("minimum of 3) and 6 elastic workers, with no node selectors or tolerations of its own")
    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        await ensure_namespace(client, HYBRID_NS)
        await client.patch(
            f"/api/v1/namespaces/{HYBRID_NS}", {"metadata": {"labels": {"vkprovider.io/routing": "hybrid"}}}
        )
        for _ in range(100):  # the provider registers its webhook as it starts
            with contextlib.suppress(ApiError):
                await client.get(
                    f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vkprovider-routing-{NODE}"
                )
                break
            await asyncio.sleep(0.2)
        group = {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "tide"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
        }
        with contextlib.suppress(AlreadyExists):
            await client.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{HYBRID_NS}/podgroups", group)
        roles = {"launcher": "ps", "worker-0": "worker-min", "worker-1": "worker-min"}
        roles |= {f"elastic-{i}": "worker-max" for i in range(6)}
        for name, role in roles.items():
            body = {
                "metadata": {"name": name, "labels": {"vkprovider.io/role": role}},
                "spec": {
                    "schedulingGroup": {"podGroupName": "tide"},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {"name": "main", "image": "registry.example/tide:1", "resources": {"requests": {"cpu": "4"}}}
                    ],
                },
            }
            with contextlib.suppress(AlreadyExists):
                await client.create(f"/api/v1/namespaces/{HYBRID_NS}/pods", body)
        for _ in range(150):
            items = (await client.list(f"/api/v1/namespaces/{HYBRID_NS}/pods"))["items"]
            if sum(1 for p in items if p["status"].get("phase") == "Running") >= len(roles):
                break
            await asyncio.sleep(0.2)
    print(f"$ kubectl -n {HYBRID_NS} get pods   # the floor on native nodes, the elastic part lent")
    print(
        _kubectl(
            lab,
            "-n",
            HYBRID_NS,
            "get",
            "pods",
            "-o",
            "custom-columns=NAME:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,"
            "MEMBER:.metadata.annotations.vkprovider\\.io/member,ROUTED:.metadata.annotations.vkprovider\\.io/routed",
        )
    )


async def _reclaim_step(lab: state.LabState, url: str) -> None:
    """Online load grows to 85 % of the CPU of the member that runs the ring job, into the
    reserve it lends from: the planner gives capacity back, worker-max pods first, each with a
    checkpoint notice."""
    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        ring = await client.get(f"/api/v1/namespaces/{NS}/pods/ring-0")
    member = (ring["metadata"].get("annotations") or {}).get("vkprovider.io/member") or "member-1"
    print(f"\nonline load in {member} (where the ring job runs) grows to 85 % of its CPU, into its reserve")
    await online.set_load(lab.kubeconfig(member), cpu_share=0.85, wait=True, name="web")
    view: dict[str, Any] = {}
    for _ in range(100):
        view = vk_status.fetch(url)
        if view.get("reclaims") and all(v.get("reclaimAt") for vs in view["reclaims"].values() for v in vs):
            break
        await asyncio.sleep(0.2)
    print(f"$ vkprovider status   # the planner's victims, each noticed {RECLAIM_NOTICE}s ahead")
    print(vk_status.render(view))
    victims = {v["pod"].split("/", 1)[1] for vs in view.get("reclaims", {}).values() for v in vs}
    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        for _ in range(200):
            items = (await client.list(f"/api/v1/namespaces/{NS}/pods"))["items"]
            ended = {p["metadata"]["name"] for p in items if p["status"].get("phase") == "Failed"}
            if victims <= ended:
                break
            await asyncio.sleep(0.2)
    print(f"\n$ kubectl -n {NS} get pods   # the victims ended Failed, reason Reclaimed; the rest runs on")
    print(
        _kubectl(
            lab,
            "-n",
            NS,
            "get",
            "pods",
            "-o",
            "custom-columns=NAME:.metadata.name,PHASE:.status.phase,"
            "REASON:.status.reason,RECLAIM-AT:.metadata.annotations.vkprovider\\.io/reclaim-at",
        )
    )
    # Kept once the member's watch sees each victim gone (GET /reclaims on the plain port).
    kept: dict[str, Any] = {}
    for _ in range(100):
        kept = _reclaims(url, "1h")
        if victims <= {r["pod"].split("/", 1)[1] for r in kept.get("reclaims", [])}:
            break
        await asyncio.sleep(0.2)
    print("\n$ vkprovider status --reclaims 1h   # kept: each pod given back, with its cause and notice")
    print(vk_status.render_reclaims(kept, "1h"))
    print(f"  (also GET {url}/reclaims?since=1h, and the dashboard's Reclaimed table at {url}/)")


def _reclaims(url: str, since: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/reclaims?since={since}", timeout=5.0) as resp:
        return dict(json.load(resp))


async def _top_step(lab: state.LabState) -> None:
    """`kubectl top` on the front end: each running pod's usage in its member (KWOK's simulated
    usage, through the member's metrics-server, the provider and the front end's metrics-server;
    two scrapes of each after the pods started, so up to a minute after they did)."""
    kubectl = [str(binaries.ensure_all()["kubectl"]), "--kubeconfig", str(lab.kubeconfig("offline"))]
    shown = ""
    for _ in range(45):
        done = subprocess.run([*kubectl, "-n", NS, "top", "pod"], capture_output=True, text=True, check=False)
        shown = done.stdout
        if done.returncode == 0 and len(shown.splitlines()) > 10:
            break
        await asyncio.sleep(2)
    print(f"\n$ kubectl -n {NS} top pod   # each pod's usage in its member, as the member's metrics-server has it")
    print(shown or "(no metrics yet: see the lab's logs/*metrics-server.log)")
    print(f"$ kubectl top node {NODE}")
    print(_kubectl(lab, "top", "node", NODE))


DEMO_CPU = 2 * 8 + 4 * 8 + 8 * 16 + 3 * 2  # the cores the demo's pods request


def _used_cpu(view: dict[str, Any]) -> float:
    """Cores our pods use in all members, as the resource view shows them."""
    total = 0.0
    for member in view.get("members", {}).values():
        value = str(member.get("used", {}).get("cpu", "0"))
        total += float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo")
    parser.add_argument("--state", type=Path, default=Path(".lab"))
    parser.add_argument("--stop", action="store_true", help="stop the demo's vkprovider and the lab")
    parser.add_argument(
        "--with", dest="stacks", default="", help="offline stacks in the front end (jobset,kueue,volcano)"
    )
    args = parser.parse_args()
    try:
        if args.stop:
            stop_runtime(args.state.resolve())
            if (args.state / "state.json").exists():
                stopped = lab_mod.down(args.state)
                print(f"stopped vkprovider and {len(stopped)} lab processes")
            return 0
        asyncio.run(demo(args.state, stacks.parse(args.stacks)))
    except (lab_mod.LabError, online.LoadError, stacks.StackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
