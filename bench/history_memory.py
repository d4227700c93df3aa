"""Benchmark: the memory of the capacity history (federation.view.tide) at the scale of issue 13:
3 members x 2,000 nodes, each member with 4 GPU models. The history keeps sums per member and
resource, never per node, so nodes cost it nothing; what grows it is members x resources x
slots. The default tiers (24 h at 10 s, 14 days at 5 min) allocate their buffers whole when a
series first appears, so `--days` of observations at 10 s (2 by default) show the bound. Reports
the bytes tracemalloc sees held by the Tide and the cost of one observation (slowed by
tracemalloc itself).
Run: `.venv/bin/python -m bench.history_memory [--days 2]`.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from typing import Any

from federation.capacity import quantities
from federation.capacity.summary import MemberCapacity
from federation.view.tide import Tide

MODELS = ("A100", "H100", "V100", "T4")
NODES = 2000


def summaries(tick: int) -> list[MemberCapacity]:
    out = []
    for m in range(3):
        summary = MemberCapacity(name=f"member-{m + 1}", nodes_total=NODES, nodes_eligible=NODES)
        wave = (tick % 8640) / 8640  # a day's tide
        summary.lendable = {quantities.CPU: int(NODES * 64_000 * wave), quantities.MEMORY: NODES * 2**36}
        summary.ours_used = {quantities.CPU: int(NODES * 16_000 * wave)}
        summary.online_used = {quantities.CPU: int(NODES * 64_000 * (1 - wave))}
        for model in MODELS:
            summary.gpus_by_model[model] = int(NODES * 2 * wave)
            summary.ours_gpus_by_model[model] = int(NODES * wave)
        out.append(summary)
    return out


def run(days: float) -> dict[str, Any]:
    clock = [1_800_000_000.0]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tide = Tide(clock=lambda: clock[0])
    ticks = int(days * 86400 / 10)
    started = time.perf_counter()
    for tick in range(ticks):
        tide.observe(summaries(tick))
        clock[0] += 10.0
    elapsed = time.perf_counter() - started
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "members": 3,
        "nodes_per_member": NODES,
        "gpu_models_per_member": len(MODELS),
        "series": len(tide.history.keys()),
        "days_filled": days,
        "buffer_bytes": tide.history.nbytes(),
        "traced_bytes": held,
        "observe_us": round(elapsed / ticks * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(run(args.days), indent=1))


if __name__ == "__main__":
    main()
