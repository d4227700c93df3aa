"""The dashboard in a real browser (issue 13): headless Chromium opens the federation provider's
page on the lab; the members, a job and the charts render with the lab's numbers (compared with
the members' own objects); member-1's online load rises and the page's free figure and lent
chart follow. Screenshots are saved as test artifacts ($VKPROVIDER_ARTIFACTS, by
default .artifacts/ in the repository)."""

from __future__ import annotations

import datetime
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e import online
from e2e.browser import Browser, wait_for
from e2e.fixtures import Lab
from federation import labels
from tests.e2e.helpers import eventually, make_namespace
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import expected_lendable, federation_vk
from tests.e2e.test_outages import plain_pod, start_provider
from tests.e2e.test_runtime import running
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

ARTIFACTS = Path(os.environ.get("VKPROVIDER_ARTIFACTS") or Path(__file__).parents[2] / ".artifacts")
ROWS = "[...document.querySelectorAll('#members tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
JOBS = "[...document.querySelectorAll('#jobs tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
LENT_LINES = "document.querySelectorAll('.chart polyline[data-kind=\"lent\"]')"
LAST_LENT = (
    'Number((document.querySelector(\'.chart[data-member="member-1"] polyline[data-kind="lent"]\')'
    " || {dataset: {}}).dataset.last)"
)
#: Member-1's chart's time axis: (time, label) of each tick.
TICKS = (
    "[...document.querySelectorAll('.chart[data-member=\"member-1\"] text.xtick')]"
    ".map(e => [Number(e.dataset.t), e.textContent])"
)
#: The newest value of a member's lent line, as a string ('' while the chart is not drawn).
LAST_OF = (
    "(e => e ? e.dataset.last : '')(document.querySelector("
    '\'.chart[data-member="{member}"] polyline[data-kind="lent"]\'))'
)
#: The members table's columns (federation/view/dashboard/index.html).
LENT, USED, FREE, GPUS = 3, 4, 5, 8


async def members_own_numbers(lab: Lab) -> dict[str, tuple[int, dict[str, int]]]:
    """Per member: how many nodes it has and its GPUs per model, from its own Node objects."""
    out = {}
    for member in lab.members:
        async with lab.client(member) as client:
            nodes = (await client.get("/api/v1/nodes"))["items"]
        gpus: dict[str, int] = {}
        for node in nodes:
            model = node["metadata"].get("labels", {}).get("nvidia.com/gpu.product")
            if model:
                gpus[model] = gpus.get(model, 0) + int(node["status"]["allocatable"].get("nvidia.com/gpu", 0))
        out[member] = (len(nodes), gpus)
    return out


async def member_of(lab: Lab, ns: str, name: str) -> str | None:
    for member in lab.members:
        async with lab.client(member) as client:
            for pod in (await client.get("/api/v1/pods"))["items"]:
                annotations = pod["metadata"].get("annotations") or {}
                if annotations.get(labels.ORIGIN_NAME) == name and annotations.get(labels.ORIGIN_NAMESPACE) == ns:
                    return member
    return None


async def test_the_dashboard_shows_members_jobs_and_charts_and_follows_online_load(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, lab.members)
    await start_provider(proc, 3)
    ns = await make_namespace(offline, f"dash-{uuid.uuid4().hex[:6]}")
    member_1 = lab.kubeconfig("member-1")
    shots = ARTIFACTS / "dashboard"
    try:
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("etl", proc.node))
        await eventually(lambda: running(offline, ns, 1), timeout=60, what="the pod running in a member")
        placed = await member_of(lab, ns, "etl")
        own = await members_own_numbers(lab)
        async with Browser(tmp_path / "chromium") as browser:
            await browser.goto(f"http://127.0.0.1:{proc.health_port}/")
            rows: list[list[str]] = await wait_for(browser, f"(r => r.length === 3 && r)({ROWS})")
            table = {row[0]: row for row in rows}
            for member, (nodes, gpus) in own.items():
                assert table[member][1] == "yes"
                assert table[member][2].endswith(f"/ {nodes}"), table[member]
                for model, total in gpus.items():
                    assert f"{model}: " in table[member][GPUS] and f"/ {total}" in table[member][GPUS], table[member]
                # One definition: lent = used + free, in every row.
                lent, used, free = (float(table[member][i]) for i in (LENT, USED, FREE))
                assert abs(lent - (used + free)) < 0.001, table[member]
            jobs: list[list[str]] = await wait_for(browser, f"(r => r.length && r)({JOBS})")
            assert [(j[1], j[2], j[4]) for j in jobs if j[0].startswith(f"{ns}/")] == [(placed, "1", "dispatched")]
            await wait_for(browser, "document.querySelectorAll('.chart polyline[data-kind=\"lent\"]').length === 3")
            await browser.screenshot(shots / "members-jobs-charts.png")

            before_cell = table["member-1"][FREE]
            before_chart = await wait_for(browser, LAST_LENT)
            await online.set_load(member_1, cpu_share=0.7, wait=True, name="dashboard")
            raised = time.monotonic()

            async def moved() -> Any:
                rows = await browser.eval(ROWS)
                cell = {row[0]: row for row in rows}["member-1"][FREE]
                chart = await browser.eval(LAST_LENT)
                # The figure a platform engineer would compute from member-1's own objects:
                # allocatable less every live pod's requests (ours too) and the reserve.
                async with lab.client("member-1") as member:
                    expected = (await expected_lendable(member))["cpu"] / 1000
                moved = abs(float(cell) - expected) < 0.001 and chart < before_chart
                return (cell, chart, expected) if moved else None

            cell, chart, expected = await eventually(
                moved, timeout=30, interval=0.25, what="the page showing member-1's free CPU as its objects say"
            )
            took = time.monotonic() - raised
            print(
                f"dashboard: free cpu {before_cell} -> {cell} ({expected} expected), chart {before_chart} -> "
                f"{chart} in {took:.1f}s"
            )
            await browser.screenshot(shots / "after-online-load.png")

            # The 14-day span: its charts, from the history's coarser tier, end where the page's
            # table is (the current value), one chart per member.
            await browser.eval("document.querySelector('button[data-since=\"14d\"]').click()")
            await wait_for(browser, "document.getElementById('charts').dataset.since === '14d'")
            assert await browser.eval("document.querySelectorAll('.chart polyline[data-kind=\"lent\"]').length") == 3
            long_last = await browser.eval(LAST_LENT)
            assert 0 < long_last <= before_chart, (long_last, before_chart)
            await browser.screenshot(shots / "fourteen-days.png")

            # Any span the history keeps (90 min): the time axis runs from the first point to the
            # last the provider serves (read here with a fetch of our own), labelled in UTC.
            query = "since=90m&member=member-1&resource=cpu&points=420"

            async def three_slots() -> bool:  # an axis over a few 10 s slots, not one
                history = await _history(proc, query)
                return len({p[0] for series in history["series"] for p in series["points"]}) >= 3

            await eventually(three_slots, timeout=60, what="three 10 s slots of member-1's history")
            await browser.eval("(r => { r.value = '90m'; r.onchange({target: r}); })(document.getElementById('range'))")
            await wait_for(browser, "document.getElementById('charts').dataset.since === '90m'")
            ticks = await browser.eval(TICKS)
            history = await _history(proc, query)
            times = sorted({p[0] for series in history["series"] for p in series["points"]})
            assert len(ticks) == 5 and ticks[0][0] == times[0] and times[-2] <= ticks[-1][0] <= times[-1], (
                ticks,
                times,
            )
            shape = "%H:%M:%S" if ticks[-1][0] - ticks[0][0] < 600 else "%H:%M"  # seconds under 10 minutes
            for t, label in ticks:
                assert label == datetime.datetime.fromtimestamp(t, datetime.UTC).strftime(shape), (t, label)
            # Values on hover: the pointer at the right edge shows the newest point of each line.
            last = await browser.eval(LAST_LENT)
            said = await _hover(browser, "member-1", right=True)
            assert said.startswith("member-1 cpu, ") and "UTC" in said, said
            shown = float(re.search(r"^lent ([0-9.]+) cores$", said, re.M).group(1))  # type: ignore[union-attr]
            assert abs(shown - last) <= 0.05 * max(1.0, last), (said, last)

            # A GPU model's chart: what a member with one model lends of it, as its own objects say
            # (our pod asks for no GPU: lent is what is free).
            gpu_member, model = next((m, next(iter(g))) for m, (_, g) in own.items() if len(g) == 1)
            await browser.eval(
                f"(s => {{ s.value = 'gpu/{model}'; s.onchange(); }})(document.getElementById('resource'))"
            )
            await wait_for(browser, f"document.getElementById('charts').dataset.resource === 'gpu/{model}'")
            async with lab.client(gpu_member) as gpu_client:
                expected_gpus = (await expected_lendable(gpu_client))["gpu"]
            lent_gpus = await wait_for(browser, LAST_OF.format(member=gpu_member))
            assert float(lent_gpus) == expected_gpus, (gpu_member, model, lent_gpus, expected_gpus)
            assert await browser.eval("document.querySelector('#charts .chart').dataset.resource") == f"gpu/{model}"
            await browser.screenshot(shots / "gpu-model.png")
            await browser.check_errors()
    finally:
        await online.set_load(member_1, cpu_share=0, wait=True, name="dashboard")
        await cleanup_and_stop(lab, offline, ns, proc)


@pytest.mark.shares_lab
async def test_a_page_that_throws_fails_the_browser_check(tmp_path: Path) -> None:
    """What the dashboard test relies on: an exception or a console error in the page is seen."""
    page = "data:text/html,<script>console.error('logged');setTimeout(() => { throw new Error('thrown') }, 0)</script>"
    async with Browser(tmp_path / "chromium") as browser:
        await browser.goto(page)
        await wait_for(browser, "new Promise(r => setTimeout(() => r(true), 50))")
        with pytest.raises(AssertionError, match="thrown") as failed:
            await browser.check_errors()
        assert "logged" in str(failed.value)


async def _history(proc: Any, query: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{proc.health_port}/history?{query}") as resp,
    ):
        resp.raise_for_status()
        body: dict[str, Any] = await resp.json()
        return body


async def _hover(browser: Browser, member: str, *, right: bool) -> str:
    """Move the pointer over a member's chart (its right edge, or its left) and read the tip."""
    box = await browser.eval(
        f"(r => [r.left, r.top, r.width, r.height])(document.querySelector("
        f"'.chart[data-member=\"{member}\"] svg').getBoundingClientRect())"
    )
    left, top, width, height = box
    x = left + width - 10 if right else left + 50
    await browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": top + height / 2})
    said: str = await wait_for(browser, "(t => !t.hidden && t.textContent)(document.getElementById('tip'))")
    return said
