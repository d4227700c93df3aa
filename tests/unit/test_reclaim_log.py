"""The reclaim log (federation.view.reclaims): bounded by count and age, sorted, and read back
from its dump."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation.view.reclaims import ReclaimLog


def _entry(at: float, **more: Any) -> dict[str, Any]:
    base = {
        "at": at,
        "member": "member-1",
        "node": "m1-n0",
        "pod": "ns/p",
        "job": "ns/pod/p",
        "band": "worker-elastic",
        "cause": "planner",
        "reason": "Reclaimed",
        "noticed_at": at - 30,
        "deadline": at,
        "acknowledged": False,
    }
    return base | more


def test_a_reclaim_keeps_its_fields_and_how_long_its_notice_ran() -> None:
    log = ReclaimLog()
    kept = log.record(_entry(1000.0, noticed_at=970.0, acknowledged=True))
    said = kept.as_json()
    assert said["notice_seconds"] == 30.0 and said["acknowledged"] is True
    assert said["member"] == "member-1" and said["cause"] == "planner" and said["node"] == "m1-n0"
    bare = log.record({"at": 1001, "member": "member-2", "cause": "NodeLost", "noticed_at": None})
    assert bare.notice_seconds is None and bare.pod == "" and bare.acknowledged is False


def test_since_and_member_select_and_the_summary_counts() -> None:
    log = ReclaimLog()
    for i in range(6):
        log.record(_entry(100.0 + i, member=f"member-{i % 2}", noticed_at=None if i == 5 else 90.0))
    assert [r.at for r in log.since(103.0)] == [103.0, 104.0, 105.0]
    assert [r.at for r in log.since(0, member="member-1")] == [101.0, 103.0, 105.0]
    served = log.served(3.0, "member-1", now=106.0)
    assert [r["at"] for r in served["reclaims"]] == [103.0, 105.0] and served["summary"]["count"] == 2
    summary = log.summary(log.since(0))
    assert summary == {
        "count": 6,
        "by_member": {"member-0": 3, "member-1": 3},
        "by_cause": {"planner": 6},
        "with_notice": 5,
        "acknowledged": 0,
    }


def test_the_log_is_bounded_by_count_and_by_age() -> None:
    log = ReclaimLog(keep=3, span=100.0)
    for at in (1.0, 2.0, 3.0, 4.0):
        log.record(_entry(at))
    assert [r.at for r in log.since(0)] == [2.0, 3.0, 4.0]
    log.record(_entry(150.0))  # 2.0, 3.0 and 4.0 are over 100 s older than it
    assert [r.at for r in log.since(0)] == [150.0]


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=40))
def test_entries_out_of_order_stay_sorted_and_within_bounds(times: list[float]) -> None:
    log = ReclaimLog(keep=10, span=5e5)
    for at in times:
        log.record(_entry(at))
    kept = [r.at for r in log.since(0)]
    assert kept == sorted(kept) and len(kept) <= 10
    if kept:
        assert kept[-1] - kept[0] <= 5e5


def test_a_dump_reads_back_and_bad_entries_are_skipped() -> None:
    log = ReclaimLog()
    for at in (10.0, 20.0):
        log.record(_entry(at))
    again = ReclaimLog()
    again.load([*log.dump(), {"at": "yesterday"}, "not a mapping"])  # type: ignore[list-item]
    assert [r.as_json() for r in again.since(0)] == [r.as_json() for r in log.since(0)]


def test_a_log_that_keeps_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="keeps at least one"):
        ReclaimLog(keep=0)
