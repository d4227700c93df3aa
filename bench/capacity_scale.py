"""Benchmark: member capacity at scale, 3 members x 2,000 nodes x 40,000 pods.

A generated inventory stands in for the apiservers at this size (the lab cannot run it): the
benchmark serialises node and pod lists to JSON as an apiserver would send them, then measures
  - cold: decode + ingest into the compact inventory + summarise, all three members;
  - one incremental update: decode one pod watch event + apply it, CPU time p50/p99;
  - one full summary, and one event plus the incremental summary a publish computes (as if
    every event were published on its own: the worst case);
  - memory per tracked pod (tracemalloc, records and their shared request shapes).
Targets (issue 4): cold < 10 s, update p99 < 5 ms CPU, < 1 KiB per tracked pod.
Run: `.venv/bin/python -m bench.capacity_scale`.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import tracemalloc
import uuid
from typing import Any

from federation.capacity.inventory import Inventory
from federation.capacity.summary import CapacityPolicy, Summarizer, summarize

PROFILES = [
    {"cpu": "95", "memory": "376Gi", "gpu": 0, "product": None},
    {"cpu": "79", "memory": "504Gi", "gpu": 8, "product": "Tesla-V100-SXM2-32GB"},
    {"cpu": "63", "memory": "248Gi", "gpu": 4, "product": "Tesla-T4"},
]
REQUESTS = [
    {"cpu": "500m", "memory": "1Gi"},
    {"cpu": "1", "memory": "2Gi"},
    {"cpu": "2", "memory": "4Gi"},
    {"cpu": "250m", "memory": "512Mi"},
]


def gen_node(member: int, i: int) -> dict[str, Any]:
    p = PROFILES[member % 3]
    alloc = {"cpu": p["cpu"], "memory": p["memory"], "pods": "110", "ephemeral-storage": "1000Gi"}
    labels = {
        "kubernetes.io/hostname": f"m{member}-n{i}",
        "topology.kubernetes.io/zone": f"z{i % 3}",
        "vkprovider.io/network-pod": f"np{i // 20}",
    }
    if p["gpu"]:
        alloc["nvidia.com/gpu"] = str(p["gpu"])
        labels["nvidia.com/gpu.product"] = str(p["product"])
    return {
        "metadata": {"name": f"m{member}-n{i}", "uid": str(uuid.uuid4()), "labels": labels, "resourceVersion": "1"},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }


def gen_pod(member: int, i: int, nodes: int, rng: random.Random) -> dict[str, Any]:
    requests = dict(REQUESTS[i % len(REQUESTS)])
    return {
        "metadata": {
            "name": f"web-{i}",
            "namespace": "online",
            "uid": str(uuid.uuid4()),
            "labels": {"app": f"svc-{i % 50}", "pod-template-hash": "abc123"},
            "resourceVersion": str(i),
            "ownerReferences": [{"kind": "ReplicaSet", "name": f"svc-{i % 50}-abc123", "uid": "x", "controller": True}],
        },
        "spec": {
            "nodeName": f"m{member}-n{rng.randrange(nodes)}",
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": requests, "limits": requests},
                },
                {"name": "sidecar", "image": "registry.example/proxy:1", "resources": {"requests": {"cpu": "50m"}}},
            ],
            "priorityClassName": "online-high",
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": "Running", "podIP": "10.1.2.3", "hostIP": "10.0.0.1"},
    }


def run(members: int, nodes: int, pods: int, updates: int) -> dict[str, Any]:
    rng = random.Random(4)
    node_lists = [json.dumps({"items": [gen_node(m, i) for i in range(nodes)]}).encode() for m in range(members)]
    pod_lists = [
        json.dumps({"items": [gen_pod(m, i, nodes, rng) for i in range(pods)]}).encode() for m in range(members)
    ]
    policy = CapacityPolicy()

    gc.collect()
    cold_started = time.perf_counter()
    cold_cpu = time.process_time()
    inventories = []
    for m in range(members):
        inv = Inventory()
        inv.replace_nodes(json.loads(node_lists[m])["items"])
        inv.replace_pods(json.loads(pod_lists[m])["items"])
        summarize(f"m{m}", inv, policy)
        inventories.append(inv)
    cold_wall = time.perf_counter() - cold_started
    cold_cpu = time.process_time() - cold_cpu

    # Incremental: a pod event as bytes off the watch, decoded and applied.
    events = []
    for i in range(updates):
        pod = gen_pod(0, i % pods, nodes, rng)
        pod["metadata"]["uid"] = f"upd-{i % 500}"
        events.append(json.dumps({"type": "MODIFIED", "object": pod}).encode())
    inv = inventories[0]
    costs = []
    for raw in events:
        t0 = time.process_time_ns()
        event = json.loads(raw)
        inv.upsert_pod(event["object"])
        costs.append((time.process_time_ns() - t0) / 1e6)
    costs.sort()
    summary_costs = []
    for _ in range(20):
        t0 = time.process_time_ns()
        summarize("m0", inv, policy)
        summary_costs.append((time.process_time_ns() - t0) / 1e6)
    summary_costs.sort()

    # Event plus the incremental summary the provider publishes (its Summarizer), per event:
    # the worst case, as if every event were published on its own.
    summarizer = Summarizer("m0")
    summarizer.summarize(inv, policy)
    published = []
    for raw in events[:1000]:
        t0 = time.process_time_ns()
        inv.upsert_pod(json.loads(raw)["object"])
        summarizer.summarize(inv, policy)
        published.append((time.process_time_ns() - t0) / 1e6)
    published.sort()

    # Memory per tracked pod: one member's pods ingested under tracemalloc.
    objs = json.loads(pod_lists[0])["items"]
    probe = Inventory()
    probe.replace_nodes(json.loads(node_lists[0])["items"])
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    probe.replace_pods(objs)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    per_pod = grown / len(probe.pods)

    return {
        "members": members,
        "nodes_per_member": nodes,
        "pods_per_member": pods,
        "cold_wall_s": round(cold_wall, 2),
        "cold_cpu_s": round(cold_cpu, 2),
        "update_cpu_ms_p50": round(statistics.median(costs), 4),
        "update_cpu_ms_p99": round(costs[int(len(costs) * 0.99) - 1], 4),
        "full_summary_cpu_ms_p50": round(statistics.median(summary_costs), 2),
        "update_and_incremental_summary_cpu_ms_p50": round(statistics.median(published), 3),
        "update_and_incremental_summary_cpu_ms_p99": round(published[int(len(published) * 0.99) - 1], 3),
        "bytes_per_tracked_pod": round(per_pod, 1),
        "targets": {"cold_s": 10, "update_p99_ms": 5, "bytes_per_pod": 1024},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--updates", type=int, default=5000)
    args = parser.parse_args()
    print(json.dumps(run(args.members, args.nodes, args.pods, args.updates), indent=2))


if __name__ == "__main__":
    main()
