"""Benchmark: the dashboard at the scale of issue 13 (3 members x 2,000 nodes, 500 jobs, a full
day of history at 10 s), in headless Chromium. The page's data does not grow with nodes (the
view and the history hold sums per member), so the synthetic provider here serves a view of 3
members and 500 jobs and 24 h of CPU history per member (3 x 3 x 8,640 points); the page is the
product's own. Reports the bytes of one refresh and how long the page takes to fetch and draw
it (timed inside the page), and the browser's JS heap. The page asks for at most 420 points a
series (its charts' width), which the provider thins to; the summary uses every point.
Run: `.venv/bin/python -m bench.dashboard_scale [--refreshes 10]`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from e2e.browser import Browser, wait_for
from federation.view.tide import thin

MEMBERS = 3
JOBS = 500
POINTS = 8640
#: One refresh of the page (its own function), timed inside the page.
TIMED_REFRESH = "(async () => { const t = performance.now(); await refresh(); return performance.now() - t; })()"


def view() -> dict[str, Any]:
    members = {
        f"member-{m}": {
            "reachable": True,
            "lent": {"cpu": "96000"},
            "used": {"cpu": "32000"},
            "free": {"cpu": "64000", "memory": str(2**40)},
            "online": {"cpu": "30000"},
            "nodes": {"total": 2000, "eligible": 2000},
            "gpusByModel": {"V100": 1000},
            "gpusTotalByModel": {"V100": 16000},
            "largest": {"cpu": {"cpu": "60"}},
            "networkPods": {f"np-{i}": {"cpu": "1000"} for i in range(40)},
            "numa": {"zones": 4000, "largestZone": {"cpu": "30"}},
        }
        for m in range(1, MEMBERS + 1)
    }
    jobs = {
        f"ns-{j % 20}/pg/job-{j}": {"member": f"member-{j % 3 + 1}", "pods": 8, "gangMin": 8, "state": "dispatched"}
        for j in range(JOBS)
    }
    return {"members": members, "virtualNodes": {}, "jobs": jobs, "reclaims": {}}


def history(now: float) -> dict[str, Any]:
    series = [
        {
            "member": f"member-{m}",
            "resource": "cpu",
            "kind": kind,
            "points": [[now - (POINTS - i) * 10, 1000 + (i % 360) + m] for i in range(POINTS)],
        }
        for m in range(1, MEMBERS + 1)
        for kind in ("lent", "used", "online")
    ]
    return {"now": now, "step": 10.0, "summary": [], "series": series}


async def run(refreshes: int) -> dict[str, Any]:
    page = importlib.resources.files("federation").joinpath("dashboard/index.html").read_bytes()
    body_view = json.dumps(view()).encode()
    full = history(time.time())
    thinned = {**full, "series": [{**x, "points": thin([tuple(p) for p in x["points"]], 420)} for x in full["series"]]}
    body_history = json.dumps(thinned).encode()  # what the product answers the page's ?points=420

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html")

    async def capacity(request: web.Request) -> web.Response:
        return web.Response(body=body_view, content_type="application/json")

    async def history_of(request: web.Request) -> web.Response:
        return web.Response(body=body_history, content_type="application/json")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/capacity", capacity)
    app.router.add_get("/history", history_of)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        with tempfile.TemporaryDirectory(prefix="vkprovider-dash-") as tmp:
            async with Browser(Path(tmp) / "chromium") as browser:
                await browser.goto(f"http://127.0.0.1:{port}/")
                await wait_for(browser, "document.querySelectorAll('#jobs tbody tr').length === 500")
                times = []
                for _ in range(refreshes):
                    took = await browser.eval(TIMED_REFRESH)
                    times.append(float(took))
                heap = await browser.eval("performance.memory ? performance.memory.usedJSHeapSize : null")
                rows = await browser.eval("document.querySelectorAll('#jobs tbody tr').length")
    finally:
        await runner.cleanup()
    times.sort()
    return {
        "members": MEMBERS,
        "nodes_per_member": 2000,
        "jobs": JOBS,
        "history_points": MEMBERS * 3 * POINTS,
        "bytes_per_refresh": len(body_view) + len(body_history),
        "refresh_ms": {"p50": round(times[len(times) // 2], 1), "max": round(times[-1], 1), "n": len(times)},
        "js_heap_bytes": heap,
        "job_rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--refreshes", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.refreshes)), indent=1))


if __name__ == "__main__":
    main()
