"""`vkprovider check`: does the installed provider serve? Its virtual node(s) Ready, and a small
probe pod bound to each of them Running (or already Succeeded), then deleted and gone.

The chart's `helm test` runs it in the cluster (its own ServiceAccount: nodes get and list, pods
create, get and delete in its namespace); an operator can run it with `--kubeconfig`. It knows
the runtime's node contract only (the Ready condition, the node's taints), not what provider
serves the node, so it sits beside the CLI and talks to the API through `vkprovider.kube`.

The probe is bound by `nodeName`, so no scheduler is involved, and tolerates exactly the node's
taints. Its image defaults to the pause image every cluster has; its security context passes
the `restricted` Pod Security level, which a member may enforce. Exit status: 0 when every node
passed, 1 with one line per failure, 2 for bad arguments or no way to reach the API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from vkprovider.kube import ApiError, ClusterAccess, KubeClient, NotFound, load_kubeconfig
from vkprovider.kube.access import SERVICE_ACCOUNT_DIR, KubeconfigError, in_cluster

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
POLL = 1.0
LABEL = "app.kubernetes.io/name"
NAME = "vkprovider-check"
#: Label on the probe pod `vkprovider check` (helm test) binds to a node: that node's name.
CHECK_NODE = "vkprovider.io/check-node"


def add_arguments(sub: Any) -> None:
    check = sub.add_parser("check", help="check that the virtual node(s) are Ready and a probe pod runs on each")
    check.add_argument("--node", action="append", required=True, help="a virtual node's name (repeat for several)")
    check.add_argument("--namespace", help="where the probe pods go; default: this pod's namespace")
    check.add_argument("--timeout", type=float, default=120.0, help="seconds the whole check may take")
    check.add_argument("--image", default=PAUSE_IMAGE, help="image of the probe pods (pullable by the members)")
    check.add_argument("--kubeconfig", type=Path, help="front-end kubeconfig; unset: in-cluster")


def ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def probe_pod(node: dict[str, Any], *, image: str, suffix: str) -> dict[str, Any]:
    """A pod bound to `node` that does nothing, asks for little, tolerates the node's taints
    (their keys and effects, nothing else) and passes the restricted Pod Security level."""
    name = node["metadata"]["name"]
    tolerations = [
        {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}
        for taint in (node.get("spec") or {}).get("taints") or []
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{NAME}-{suffix}", "labels": {LABEL: NAME, CHECK_NODE: name}},
        "spec": {
            "nodeName": name,
            "tolerations": tolerations,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "16Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def describe(pod: dict[str, Any]) -> str:
    """What a pod's status says about why it is where it is: phase, reason, message and the
    conditions that are not True."""
    status = pod.get("status") or {}
    words = [status.get("phase") or "no phase"]
    words += [status[k] for k in ("reason", "message") if status.get(k)]
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            said = ": ".join(x for x in (condition.get("reason"), condition.get("message")) if x)
            words.append(f"{condition.get('type')}={condition.get('status')}" + (f" ({said})" if said else ""))
    for container in status.get("containerStatuses") or []:
        for state, detail in (container.get("state") or {}).items():
            if state != "running" and detail.get("reason"):
                words.append(f"container {container.get('name')} {state}: {detail['reason']}")
    return "; ".join(words)


class CheckFailed(Exception):
    """One node did not pass; the message says where it stopped."""


def _say(message: str) -> None:
    print(f"check: {message}", flush=True)


async def check_node(client: KubeClient, name: str, *, namespace: str, image: str, deadline: float) -> None:
    """The node Ready, then its probe pod Running or Succeeded, then deleted and gone."""
    started = time.monotonic()
    node: dict[str, Any] | None = None
    while node is None or not ready(node):
        if time.monotonic() > deadline:
            raise CheckFailed(f"node {name}: {'not Ready' if node else 'not registered'} in time")
        with contextlib.suppress(NotFound):
            node = await client.get(f"/api/v1/nodes/{name}")
        if node is None or not ready(node):
            await asyncio.sleep(POLL)
    _say(f"node {name}: Ready ({time.monotonic() - started:.1f}s)")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    pod = await client.create(pods, probe_pod(node, image=image, suffix=uuid.uuid4().hex[:6]))
    path = f"{pods}/{pod['metadata']['name']}"
    try:
        while (pod.get("status") or {}).get("phase") not in ("Running", "Succeeded"):
            if (pod.get("status") or {}).get("phase") == "Failed":
                raise CheckFailed(f"node {name}: probe pod {pod['metadata']['name']} failed: {describe(pod)}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"node {name}: probe pod {pod['metadata']['name']} not running: {describe(pod)}")
            await asyncio.sleep(POLL)
            pod = await client.get(path)
        phase, took = pod["status"]["phase"], time.monotonic() - started
        _say(f"node {name}: probe pod {pod['metadata']['name']} {phase} ({took:.1f}s)")
    finally:
        with contextlib.suppress(NotFound):
            await client.delete(path)
    while True:
        try:
            await client.get(path)
        except NotFound:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"node {name}: probe pod {pod['metadata']['name']} deleted but not gone in time")
        await asyncio.sleep(POLL)
    _say(f"node {name}: probe pod deleted and gone ({time.monotonic() - started:.1f}s)")


async def check(access: ClusterAccess, nodes: list[str], *, namespace: str, image: str, timeout: float) -> list[str]:
    """Every node checked at once; the failures, one line each."""
    deadline = time.monotonic() + timeout
    async with KubeClient(access, user_agent=NAME) as client:
        results = await asyncio.gather(
            *(check_node(client, n, namespace=namespace, image=image, deadline=deadline) for n in nodes),
            return_exceptions=True,
        )
        failures = []
        for name, result in zip(nodes, results, strict=True):
            if isinstance(result, CheckFailed):
                failures.append(str(result))
            elif isinstance(result, ApiError):
                failures.append(f"node {name}: the API refused the check: {result}")
            elif isinstance(result, BaseException):
                raise result
        if any(f.endswith("not registered in time") for f in failures):
            with contextlib.suppress(ApiError):
                found = await client.list("/api/v1/nodes", params={"labelSelector": "type=virtual-kubelet"})
                names = sorted(n["metadata"]["name"] for n in found["items"])
                failures.append(f"virtual nodes registered: {', '.join(names) or 'none'}")
    return failures


def main(args: argparse.Namespace) -> int:
    namespace = args.namespace
    if not namespace:
        with contextlib.suppress(OSError):
            namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    if not namespace:
        print("error: --namespace: not in a pod, say where the probe pods go", file=sys.stderr)
        return 2
    try:
        access = load_kubeconfig(args.kubeconfig) if args.kubeconfig else in_cluster()
    except (KubeconfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    failures = asyncio.run(check(access, args.node, namespace=namespace, image=args.image, timeout=args.timeout))
    took = time.monotonic() - started
    if failures:
        for failure in failures:
            _say(f"FAILED: {failure}")
        return 1
    _say(f"passed: {len(args.node)} node(s) Ready, a probe pod ran on each and was deleted ({took:.1f}s)")
    return 0
