"""The workload answers its notice, end to end on the lab (issue 34): `checkpointed-at` releases
its pod at once, `checkpoint-extend` is granted up to the member's maximum and refused beyond,
a bad notice annotation is named in a Warning Event, and `kubectl logs` on a reclaimed pod
prints the last lines its member pod wrote."""

from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e import lab as lab_mod
from e2e.browser import Browser, wait_for
from e2e.fixtures import Lab
from tests.e2e.helpers import eventually
from tests.e2e.reclaim_scene import Scene, front_pod, start_scene, stop_scene
from tests.e2e.test_member_logs import append
from vkprovider.kube import KubeClient

# Each fills member-1 (online load, notices), and nothing else: the other worker runs beside
# them whatever keeps away from member-1 (e2e.fixtures).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(alone=["member-1"], shares=["offline"]),
]

NOTICE = 6.0
MAXIMUM = 12.0
#: Seconds of extension `ext` asks for: NOTICE + EXTEND fits the maximum (and stays apart from it).
EXTEND = 4
RECLAIM_AT = "vkprovider.io/reclaim-at"
NOTICED_AT = "vkprovider.io/reclaim-noticed-at"


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def _annotate(scene: Scene, name: str, annotations: dict[str, str]) -> None:
    await scene.offline.patch(f"/api/v1/namespaces/{scene.ns}/pods/{name}", {"metadata": {"annotations": annotations}})


async def _event(scene: Scene, reason: str, name: str) -> dict[str, Any] | None:
    found = [e for e in await scene.events(reason) if e["involvedObject"]["name"] == name]
    return found[0] if found else None


async def _log(scene: Scene, name: str) -> str:
    chunks = [
        c
        async for c in scene.offline.stream(
            f"/api/v1/namespaces/{scene.ns}/pods/{name}/log", params={"container": "main"}
        )
    ]
    return b"".join(chunks).decode()


async def test_a_workload_acknowledges_or_extends_its_notice_and_a_reclaimed_pod_keeps_its_log(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    scene = await start_scene(lab, offline, tmp_path, notice=NOTICE)
    try:
        await scene.spec({"reclaim": {"noticeSeconds": NOTICE, "maxNoticeSeconds": MAXIMUM}})
        leaving = {"ack": {}, "ext": {}, "far": {}, "bad": {"vkprovider.io/checkpoint-seconds": "nan"}}
        for name, annotations in leaving.items():
            body = front_pod(name, scene.proc.node, cpu=12, role="worker-max", annotations=annotations)
            await offline.create(f"/api/v1/namespaces/{scene.ns}/pods", body)
        await offline.create(
            f"/api/v1/namespaces/{scene.ns}/pods", front_pod("stays", scene.proc.node, cpu=12, role="worker-min")
        )
        names = {*leaving, "stays"}
        await eventually(lambda: scene.running(names), timeout=60, what="five pods running in member-1")
        marker = uuid.uuid4().hex[:8]
        append(lab_mod.kwok_log_file(lab.state_dir, "member-1"), [f"{marker} step {i}" for i in range(5)])

        await scene.spec({"capacity": {"cap": {"cpu": "12"}}})  # all but one pod's worth

        async def noticed() -> dict[str, dict[str, Any]] | None:
            front = await scene.front()
            got = {n: front[n] for n in leaving if RECLAIM_AT in (front[n]["metadata"].get("annotations") or {})}
            return got if len(got) == len(leaving) else None

        first = await eventually(noticed, timeout=30, what="the four worker-max pods noticed")
        assert RECLAIM_AT not in (await scene.front())["stays"]["metadata"].get("annotations", {})

        # A bad notice annotation: named in a Warning Event, the member's default applies.
        bad = await eventually(lambda: _event(scene, "InvalidNotice", "bad"), timeout=10, what="InvalidNotice")
        assert bad["type"] == "Warning" and "'nan'" in bad["message"] and f"{NOTICE:g}s" in bad["message"], bad
        bad_ann = first["bad"]["metadata"]["annotations"]
        assert _seconds(bad_ann[RECLAIM_AT]) - _seconds(bad_ann[NOTICED_AT]) == pytest.approx(NOTICE + 2, abs=0.01)

        # Extensions: 4 s more fits the 12 s maximum; 60 s more does not (extended to the maximum).
        await _annotate(scene, "ext", {"vkprovider.io/checkpoint-extend": str(EXTEND)})
        await _annotate(scene, "far", {"vkprovider.io/checkpoint-extend": "60"})
        extended = await eventually(lambda: _event(scene, "CheckpointExtended", "ext"), timeout=10, what="extended")
        refused = await eventually(
            lambda: _event(scene, "CheckpointExtensionRefused", "far"), timeout=10, what="refused"
        )
        assert extended["type"] == "Normal" and refused["type"] == "Warning"
        assert f"at most {MAXIMUM:g}s" in refused["message"], refused

        async def moved() -> dict[str, dict[str, Any]] | None:
            front = await scene.front()
            ok = all(
                front[n]["metadata"]["annotations"].get(RECLAIM_AT) != first[n]["metadata"]["annotations"][RECLAIM_AT]
                for n in ("ext", "far")
            )
            return front if ok else None

        now = await eventually(moved, timeout=10, what="the two deadlines moved")
        for name, period in (("ext", NOTICE + EXTEND), ("far", MAXIMUM)):
            ann = now[name]["metadata"]["annotations"]
            assert _seconds(ann[RECLAIM_AT]) - _seconds(ann[NOTICED_AT]) == pytest.approx(period + 2, abs=0.01)

        # Acknowledged: released within 2 s of the workload's word (member-1's audit record).
        said = time.time()
        stamp = datetime.datetime.fromtimestamp(said, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await _annotate(scene, "ack", {"vkprovider.io/checkpointed-at": stamp})

        async def deleted() -> float | None:
            return scene.member_deletes().get("ack")

        gone_at = await eventually(deleted, timeout=10, what="ack deleted in member-1")
        ack_deadline = _seconds(first["ack"]["metadata"]["annotations"][RECLAIM_AT])
        assert gone_at - said <= 2.0, f"released {gone_at - said:.2f}s after checkpointed-at"
        assert gone_at < ack_deadline, "released at its deadline, not when acknowledged"
        await eventually(lambda: _event(scene, "CheckpointAcknowledged", "ack"), timeout=10, what="acknowledged")

        # The reclaimed pod's log: its last lines, through the front end's `kubectl logs` path.
        async def ended() -> bool:
            return bool((await scene.front())["ack"]["status"].get("phase") == "Failed")

        await eventually(ended, timeout=30, what="ack Failed")
        text = await _log(scene, "ack")
        assert f"{marker} step 4" in text, text[-500:]

        # A real browser for the dashboard below, started while the extended notices run out.
        async with Browser(tmp_path / "chromium") as browser:
            # The extended pods go at their new deadlines, not before (member-1's audit record).
            async def all_gone() -> dict[str, float] | None:
                deletes = scene.member_deletes()
                return deletes if set(leaving) <= set(deletes) else None

            deletes = await eventually(all_gone, timeout=MAXIMUM + 30, what="every noticed pod deleted")
            for name in ("ext", "far"):
                assert deletes[name] >= _seconds(now[name]["metadata"]["annotations"][RECLAIM_AT]), name
            assert "stays" not in deletes

            # Kept (GET /reclaims on the plain port): each pod with its member, node, cause, its
            # notice as written on the pods, and whether the workload acknowledged it.
            kept = await eventually(lambda: _kept(scene, set(leaving)), timeout=30, what="the four reclaims kept")
            for name, entry in kept.items():
                ann = (now if name in ("ext", "far") else first)[name]["metadata"]["annotations"]
                reclaimed = (scene.member, "planner", "Reclaimed")
                assert (entry["member"], entry["cause"], entry["reason"]) == reclaimed, entry
                assert entry["node"] and entry["job"], entry
                assert entry["noticed_at"] == pytest.approx(_seconds(ann[NOTICED_AT]), abs=0.01), entry
                assert entry["deadline"] == pytest.approx(_seconds(ann[RECLAIM_AT]), abs=0.01), entry
                assert entry["at"] >= deletes[name] and entry["notice_seconds"] > 0, (entry, deletes[name])
                assert entry["acknowledged"] is (name == "ack"), entry

            # The dashboard's "Reclaimed" table shows them (the browser on the plain port).
            await browser.goto(f"http://127.0.0.1:{scene.proc.health_port}/")
            rows = await wait_for(browser, RECLAIMED.format(ns=scene.ns), timeout=30)
            shown = {row[3].partition("/")[2]: row for row in rows}
            assert set(shown) == set(leaving), rows
            for name, row in shown.items():
                entry = kept[name]
                _, member, node, _, job, band, cause, notice, acked = row
                assert (member, node, job, cause) == (scene.member, entry["node"], entry["job"], "planner"), row
                assert band == entry["band"] and acked == ("yes" if name == "ack" else "no"), row
                # How long its notice ran: from its annotation to its deletion in member-1 at least.
                ran = deletes[name] - _seconds(first[name]["metadata"]["annotations"][NOTICED_AT])
                assert notice.endswith(" s") and float(notice[:-2]) >= ran - 1, (row, ran)
            await browser.check_errors()
    finally:
        await stop_scene(scene)


#: The dashboard's reclaimed rows of one namespace's pods, once there are four.
RECLAIMED = (
    "(r => r.length === 4 && r)([...document.querySelectorAll('#reclaimed tbody tr')]"
    ".map(r => [...r.cells].map(c => c.textContent)).filter(c => c[3].startsWith('{ns}/')))"
)


async def _kept(scene: Scene, names: set[str]) -> dict[str, dict[str, Any]] | None:
    """The provider's reclaims of the last hour in the scene's namespace, by pod name, once
    all of `names` are there."""
    url = f"http://127.0.0.1:{scene.proc.health_port}/reclaims"
    async with aiohttp.ClientSession() as session, session.get(url, params={"since": "1h"}) as resp:
        resp.raise_for_status()
        body = await resp.json()
    found = {r["pod"].partition("/")[2]: r for r in body["reclaims"] if r["pod"].startswith(f"{scene.ns}/")}
    assert body["summary"]["count"] == len(body["reclaims"]), body["summary"]
    return found if set(found) == names else None
