"""The lab's status table: per cluster, its apiserver, nodes and pods."""

from __future__ import annotations

import asyncio

from e2e import procs
from e2e.state import ClusterState, LabState
from vkprovider.kube import ApiError, KubeClient, load_kubeconfig


async def _cluster_row(lab: LabState, cluster: ClusterState) -> list[str]:
    apiserver = cluster.processes.get("kube-apiserver")
    running = bool(apiserver and procs.alive(apiserver.pid, lab.marker))
    row = [cluster.name, cluster.role, cluster.profile or "-", cluster.server, "up" if running else "stopped"]
    if not running:
        return [*row, "-", "-", "-", "-", "-"]
    try:
        async with KubeClient(load_kubeconfig(lab.kubeconfig(cluster.name)), request_timeout=5) as client:
            node_list, pod_list = await asyncio.gather(client.list("/api/v1/nodes"), client.list("/api/v1/pods"))
    except ApiError as exc:
        return [*row, "?", "?", "?", "?", f"error: {exc.reason}"]
    nodes = node_list["items"]
    ready = sum(
        1
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    )
    pods = pod_list["items"]
    phases: dict[str, int] = {}
    for pod in pods:
        phase = pod.get("status", {}).get("phase", "Unknown")
        if pod["metadata"].get("deletionTimestamp"):
            phase = "Terminating"
        phases[phase] = phases.get(phase, 0) + 1
    return [
        *row,
        f"{ready}/{len(nodes)}",
        str(len(pods)),
        str(phases.get("Running", 0)),
        str(phases.get("Pending", 0)),
        str(phases.get("Terminating", 0)),
    ]


async def table(lab: LabState) -> str:
    header = [
        "CLUSTER",
        "ROLE",
        "PROFILE",
        "APISERVER",
        "STATE",
        "NODES READY",
        "PODS",
        "RUNNING",
        "PENDING",
        "TERMINATING",
    ]
    rows = await asyncio.gather(*(_cluster_row(lab, c) for c in lab.clusters.values()))
    return render([header, *rows])


def render(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)
