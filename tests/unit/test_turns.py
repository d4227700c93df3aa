"""Turns at the shared lab (e2e.turns): sharing holders overlap, a lone holder waits for them
and then runs alone, and sharing holders that arrive while it waits go after it.

Threads stand in for xdist workers: each opens the lock files anew, and `flock` locks belong to
the open file, so two threads contend exactly as two processes do."""

from __future__ import annotations

import threading
from pathlib import Path

from e2e import turns

WAIT = 10.0  # seconds any step may take before the test fails rather than hangs


class Holder(threading.Thread):
    """Takes a turn, says so, and keeps it until released."""

    def __init__(self, directory: Path, *, alone: bool, log: list[str], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.directory, self.alone, self.log = directory, alone, log
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        with turns.turn(self.directory, alone=self.alone):
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
