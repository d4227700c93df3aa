"""`make demo`: the product on the lab.

Today the virtual kubelet runs with the in-memory provider on the lab's front-end cluster (the
federation provider that sends pods to members comes next): a virtual node registers, a
Deployment lands on it, its pods run and log through `kubectl`. Member-1's online load shows
the tide the federation provider will follow. Everything keeps running afterwards (`make down`
stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e import binaries, online, state, status
from e2e import lab as lab_mod
from vkprovider.kube import AlreadyExists, ApiError, KubeClient, load_kubeconfig

NODE = "vk-demo"
PORT = 10250


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


async def demo(state_dir: Path) -> None:
    state_dir = state_dir.resolve()
    existing = state.load(state_dir) if (state_dir / "state.json").exists() else None
    if existing and lab_mod.is_running(existing):
        lab = existing
        print(f"reusing the lab running in {state_dir}")
    else:
        print("starting the lab: offline + 3 members x 20 simulated nodes")
        lab = await lab_mod.up(state_dir, lab_mod.LabSpec(members=3, nodes_per_member=20))
    print(await status.table(lab))

    stop_runtime(state_dir)
    config = state_dir / "vkprovider.yaml"
    config.write_text(lab_mod.provider_config(lab, "memory", node=NODE, port=PORT))
    log = open(state_dir / "logs" / "vkprovider.log", "ab")  # noqa: SIM115 - handed to the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "vkprovider.cli", "run", "--config", str(config), "--set", "log.format=json"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _pid_file(state_dir).write_text(str(proc.pid))
    print(f"\nvkprovider started (pid {proc.pid}, log {state_dir}/logs/vkprovider.log)")

    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        for _ in range(100):
            try:
                node = await client.get(f"/api/v1/nodes/{NODE}")
                if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]):
                    break
            except ApiError:  # not registered yet
                pass
            await asyncio.sleep(0.2)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "batch-demo"},
            "spec": {
                "replicas": 10,
                "selector": {"matchLabels": {"app": "batch-demo"}},
                "template": {
                    "metadata": {"labels": {"app": "batch-demo"}},
                    "spec": {
                        "nodeSelector": {"type": "virtual-kubelet"},
                        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                        "containers": [{"name": "worker", "image": "example/trainer:1"}],
                    },
                },
            },
        }
        with contextlib.suppress(AlreadyExists):
            await client.create("/apis/apps/v1/namespaces/default/deployments", deployment)
        await asyncio.sleep(4)
    print("\n$ kubectl get nodes")
    print(_kubectl(lab, "get", "nodes", "-l", "type=virtual-kubelet", "-o", "wide"))
    print("$ kubectl get pods -o wide")
    print(_kubectl(lab, "get", "pods", "-l", "app=batch-demo", "-o", "wide"))
    pods = _kubectl(lab, "get", "pods", "-l", "app=batch-demo", "-o", "name").split()
    if pods:
        print(f"$ kubectl logs {pods[0]} --tail 3")
        print(_kubectl(lab, "logs", pods[0], "--tail", "3"))

    for share in (0.2, 0.6, 0.3):
        result = await online.set_load(lab.kubeconfig("member-1"), cpu_share=share, wait=True, name="web")
        print(f"online tide in member-1 -> {result.describe()}")
    print()
    print(await status.table(lab))
    print(f"\nall of it keeps running; kubeconfigs in {state_dir}/kubeconfig/, stop it with `make down`")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo")
    parser.add_argument("--state", type=Path, default=Path(".lab"))
    parser.add_argument("--stop", action="store_true", help="stop the demo's vkprovider and the lab")
    args = parser.parse_args()
    try:
        if args.stop:
            stop_runtime(args.state.resolve())
            if (args.state / "state.json").exists():
                stopped = lab_mod.down(args.state)
                print(f"stopped vkprovider and {len(stopped)} lab processes")
            return 0
        asyncio.run(demo(args.state))
    except (lab_mod.LabError, online.LoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
