"""The capacity history's ring buffers: means per slot, gaps, wrap-around, the tier a query
uses, the bound on series, and a dump that loads back the same."""

from __future__ import annotations

import json

import pytest

from federation.view.history import History, Tier

KEY = ("member-1", "cpu", "lent")


def test_a_slot_holds_the_mean_of_its_samples_and_gaps_stay_empty() -> None:
    history = History([Tier(10.0, 6)])
    history.record(100.0, {KEY: 4.0})
    history.record(105.0, {KEY: 8.0})
    history.record(131.0, {KEY: 1.0})  # 110 and 120 had no sample
    step, series = history.query(since=0.0, now=131.0)
    assert step == 10.0
    assert series[KEY] == [(100.0, 6.0), (130.0, 1.0)]


def test_old_slots_are_overwritten_when_the_ring_wraps() -> None:
    history = History([Tier(1.0, 5)])
    for t in range(12):
        history.record(float(t), {KEY: float(t)})
    _, series = history.query(since=0.0, now=11.0)
    assert series[KEY] == [(7.0, 7.0), (8.0, 8.0), (9.0, 9.0), (10.0, 10.0), (11.0, 11.0)]
    history.record(30.0, {KEY: 30.0})  # a gap longer than the ring: everything before is gone
    assert history.query(since=0.0, now=30.0)[1][KEY] == [(30.0, 30.0)]
    history.record(29.0, {KEY: 99.0})  # late samples are dropped
    assert history.query(since=0.0, now=30.0)[1][KEY] == [(30.0, 30.0)]


def test_a_query_uses_the_finest_tier_that_reaches_back() -> None:
    history = History([Tier(10.0, 8640), Tier(300.0, 4032)])
    for t in range(0, 3 * 86400, 60):
        history.record(float(t), {KEY: 1.0, ("member-2", "cpu", "used"): 2.0})
    now = 3 * 86400 - 60
    step, day = history.query(since=now - 86400 + 10, now=now, member="member-1")
    assert step == 10.0 and set(day) == {KEY} and len(day[KEY]) == 1440
    step, week = history.query(since=now - 7 * 86400, now=now)
    assert step == 300.0 and len(week[KEY]) == 3 * 86400 // 300


def test_series_are_bounded_and_memory_is_what_the_tiers_say() -> None:
    history = History([Tier(10.0, 8640), Tier(300.0, 4032)], max_series=36)
    history.record(0.0, {(f"m{i}", "cpu", "used"): 1.0 for i in range(40)})
    assert len(history.keys()) == 36 and history.dropped == 4
    assert history.nbytes() == 36 * (8640 + 4032) * 4  # 1.8 MB


def test_a_dump_loads_back_the_same_and_other_tiers_start_empty() -> None:
    history = History([Tier(10.0, 60)])
    for t in range(0, 300, 7):
        history.record(float(t), {KEY: float(t % 13)})
    restored = History([Tier(10.0, 60)])
    restored.load(json.loads(json.dumps(history.dump())))
    assert restored.query(since=0.0, now=300.0) == history.query(since=0.0, now=300.0)
    other = History([Tier(5.0, 60)])
    other.load(history.dump())
    assert other.keys() == []


def test_a_history_needs_a_tier() -> None:
    with pytest.raises(ValueError, match="at least one tier"):
        History([])
