"""The view kept across restarts (federation.view.store): the history and the reclaims kept go to
one file and come back whole; a file that cannot be read leaves the view empty. Real files in a
temporary directory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from federation.view.history import History, Tier
from federation.view.reclaims import ReclaimLog
from federation.view.store import ViewStore
from federation.view.tide import Tide

TIERS = [Tier(10.0, 60), Tier(300.0, 48)]


def _store(path: Path | str) -> ViewStore:
    return ViewStore(str(path), History(TIERS), ReclaimLog(), interval=60.0)


def test_the_history_and_the_reclaims_come_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "view.json"
    first = _store(path)
    for i in range(30):
        first.history.record(1000.0 + i * 10, {("m1", "cpu", "lent"): float(i), ("m1", "cpu", "used"): 1.0})
    first.reclaims.record({"at": 1200.0, "member": "m1", "pod": "ns/p", "cause": "planner", "noticed_at": 1170.0})
    asyncio.run(first.save())
    again = _store(path)
    assert again.load()
    assert again.history.query(since=0, now=1300.0) == first.history.query(since=0, now=1300.0)
    assert [r.as_json() for r in again.reclaims.since(0)] == [r.as_json() for r in first.reclaims.since(0)]
    assert not list(path.parent.glob(".view.json.*"))  # the temporary file was renamed


def test_no_file_and_a_bad_file_start_empty_and_no_path_does_nothing(tmp_path: Path) -> None:
    assert not _store(tmp_path / "missing.json").load()
    bad = tmp_path / "bad.json"
    for text in ("not json", json.dumps({"version": 99}), json.dumps([1, 2])):
        bad.write_text(text)
        store = _store(bad)
        assert not store.load() and store.history.keys() == []
    memory_only = _store("")
    assert memory_only.path is None and not memory_only.load()
    asyncio.run(memory_only.save())  # nothing written, nothing raised


def test_the_tide_forecasts_what_each_member_lends_from_its_coarse_tier() -> None:
    now = [0.0]
    tide = Tide(history=History(TIERS), clock=lambda: now[0])
    for i in range(48 * 30):  # 4 hours at 10 s: the coarse tier's 48 slots of 5 minutes
        now[0] = 100_000.0 + i * 10
        tide.history.record(now[0], {("m1", "cpu", "lent"): 100.0, ("m1", "gpu/T4", "lent"): 8.0})
    tide.latest = {("m1", "cpu", "used"): 30.0}
    said = tide.forecast(hours=1)
    assert set(said["members"]["m1"]) == {"cpu", "gpu/T4"}  # type: ignore[index]
    cpu = said["members"]["m1"]["cpu"]  # type: ignore[index]
    assert said["step"] == 300.0 and len(cpu["points"]) == 12 and cpu["used"] == 30.0
    assert {v for _, v in cpu["points"]} == {100.0} and cpu["belowUsedAt"] is None
