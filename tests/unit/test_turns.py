"""Turns at the shared lab (e2e.turns): sharing holders overlap, a lone holder waits for them
and then runs alone, and sharing holders that arrive while it waits go after it; turns at
different clusters do not wait for each other.

Threads stand in for xdist workers: each opens the lock files anew, and `flock` locks belong to
the open file, so two threads contend exactly as two processes do."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from e2e import turns

WAIT = 10.0  # seconds any step may take before the test fails rather than hangs


class Holder(threading.Thread):
    """Takes a turn, says so, and keeps it until released."""

    def __init__(
        self, directory: Path, *, alone: bool | list[str], log: list[str], name: str, shares: list[str] | None = None
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.directory, self.log = directory, log
        # alone=True/False: the whole lab (one cluster, "lab") alone or shared.
        if isinstance(alone, bool):
            self.alone, self.shares = (["lab"], []) if alone else ([], ["lab"])
        else:
            self.alone, self.shares = alone, shares or []
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        with turns.turn(self.directory, alone=self.alone, shares=self.shares):
            self.log.append(f"+{self.name}")
            self.holding.set()
            self.release.wait(WAIT)
            self.log.append(f"-{self.name}")


def test_sharing_holders_overlap_and_a_lone_one_runs_alone_before_later_sharers(tmp_path: Path) -> None:
    log: list[str] = []
    first = Holder(tmp_path, alone=False, log=log, name="s1")
    second = Holder(tmp_path, alone=False, log=log, name="s2")
    lone = Holder(tmp_path, alone=True, log=log, name="alone")
    late = Holder(tmp_path, alone=False, log=log, name="s3")
    first.start()
    second.start()
    assert first.holding.wait(WAIT) and second.holding.wait(WAIT), "two sharing holders at once"

    lone.start()
    assert not lone.holding.wait(0.3), "the lone holder started beside sharing ones"
    late.start()
    assert not late.holding.wait(0.3), "a sharer overtook the lone holder waiting at the turnstile"

    first.release.set()
    second.release.set()
    assert lone.holding.wait(WAIT)
    assert not late.holding.wait(0.3), "a sharer started beside the lone holder"
    lone.release.set()
    assert late.holding.wait(WAIT)
    late.release.set()
    for holder in (first, second, lone, late):
        holder.join(WAIT)
    assert log.index("+alone") > max(log.index("-s1"), log.index("-s2"))
    assert log.index("+s3") > log.index("-alone")


def test_a_lone_holder_waits_for_another_lone_holder(tmp_path: Path) -> None:
    log: list[str] = []
    one = Holder(tmp_path, alone=True, log=log, name="a")
    two = Holder(tmp_path, alone=True, log=log, name="b")
    one.start()
    assert one.holding.wait(WAIT)
    two.start()
    assert not two.holding.wait(0.3)
    one.release.set()
    assert two.holding.wait(WAIT)
    two.release.set()
    one.join(WAIT)
    two.join(WAIT)
    assert log == ["+a", "-a", "+b", "-b"]


def test_turns_at_different_clusters_overlap_and_a_shared_cluster_still_waits(tmp_path: Path) -> None:
    log: list[str] = []
    chain = Holder(tmp_path, alone=["member-1"], shares=["offline"], log=log, name="chain")
    away = Holder(tmp_path, alone=["member-3"], shares=["offline"], log=log, name="away")
    near = Holder(tmp_path, alone=[], shares=["offline", "member-1"], log=log, name="near")
    chain.start()
    assert chain.holding.wait(WAIT)
    away.start()
    assert away.holding.wait(WAIT), "a turn alone on member-3 waited for one alone on member-1"
    near.start()
    assert not near.holding.wait(0.3), "a turn sharing member-1 started beside one alone on it"
    chain.release.set()
    assert near.holding.wait(WAIT)
    away.release.set()
    near.release.set()
    for holder in (chain, away, near):
        holder.join(WAIT)


def test_a_turn_cannot_be_alone_on_and_share_one_cluster(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="member-1"), turns.turn(tmp_path, alone=["member-1"], shares=["member-1"]):
        pass
