"""Benchmark: time to bring up the lab (1 offline + 3 members x 20 nodes) with a warm binary
cache, and the lab's total memory once ready (RSS and PSS summed over its processes).

Targets (issue 2): under 40 s and under 4 GiB. Run: `.venv/bin/python -m bench.lab_up`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import psutil

from e2e import binaries
from e2e import lab as lab_mod
from e2e.state import LabState


def lab_memory(lab: LabState) -> dict[str, int]:
    rss = pss = 0
    for proc in lab.all_processes():
        if not proc.pid:
            continue
        try:
            info = psutil.Process(proc.pid).memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"rss_bytes": rss, "pss_bytes": pss}


async def run(members: int, nodes: int, settle: float) -> dict[str, object]:
    started = time.monotonic()
    binaries.ensure_all()
    cache_check = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="vkprovider-bench-lab-") as tmp:
        t0 = time.monotonic()
        lab = await lab_mod.up(Path(tmp), lab_mod.LabSpec(members=members, nodes_per_member=nodes))
        up_seconds = time.monotonic() - t0
        try:
            memory_ready = lab_memory(lab)
            await asyncio.sleep(settle)  # memory after start-up transients settle
            memory_settled = lab_memory(lab)
        finally:
            t1 = time.monotonic()
            lab_mod.teardown(lab)
            down_seconds = time.monotonic() - t1
    return {
        "clusters": f"1+{members}",
        "nodes_per_member": nodes,
        "binary_cache_check_s": round(cache_check, 2),
        "up_s": round(up_seconds, 2),
        "down_s": round(down_seconds, 2),
        "memory_at_ready": memory_ready,
        "memory_after_settle": memory_settled,
        "settle_s": settle,
        "targets": {"up_s": 40, "memory_bytes": 4 * 2**30},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--nodes-per-member", type=int, default=20)
    parser.add_argument("--settle", type=float, default=20.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.members, args.nodes_per_member, args.settle))
    gib = 2**30
    mem = result["memory_after_settle"]
    assert isinstance(mem, dict)
    print(json.dumps(result, indent=2))
    print(
        f"lab up {result['up_s']}s (target < 40 s); memory RSS {mem['rss_bytes'] / gib:.2f} GiB, "
        f"PSS {mem['pss_bytes'] / gib:.2f} GiB (target < 4 GiB)"
    )


if __name__ == "__main__":
    main()
