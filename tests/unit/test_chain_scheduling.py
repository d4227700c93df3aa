"""The run's scheduling (e2e.fixtures.ChainScheduling): the chain is one scope, and a late test
(the restart harness) is not handed out while a test before it has not ended, unless nothing
else is left. Pure logic on xdist's scheduler, with stand-ins for its worker controllers."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from e2e.fixtures import CHAIN, ChainScheduling

LATE = "tests/e2e/test_restart_harness.py::test_harness"


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(collection: list[str], workers: list[Worker]) -> ChainScheduling:
    sched: Any = ChainScheduling.__new__(ChainScheduling)
    sched.log = lambda *args: None
    sched.collection = collection
    sched.registered_collections = {w: collection for w in workers}
    sched.assigned_work = {w: {} for w in workers}
    sched.workqueue = OrderedDict()
    for nodeid in collection:
        sched.workqueue.setdefault(sched._split_scope(nodeid), {})[nodeid] = False
    return sched  # type: ignore[no-any-return]


def handed(sched: ChainScheduling, worker: Worker) -> str:
    sched._assign_work_unit(worker)
    scopes: list[str] = list(sched.assigned_work[worker])
    return scopes[-1]


def finish(sched: ChainScheduling, worker: Worker, scope: str) -> None:
    unit = sched.assigned_work[worker][scope]
    for nodeid in unit:
        unit[nodeid] = True


def test_the_chain_is_one_scope_and_every_other_test_its_own() -> None:
    tests = ["tests/e2e/test_reclaim.py::a", "tests/e2e/test_reclaim_fit.py::b", "tests/e2e/test_lab.py::c"]
    sched = scheduler(tests, [Worker("gw0")])
    assert list(sched.workqueue) == [CHAIN, "tests/e2e/test_lab.py::c"]


def test_a_late_test_waits_for_every_test_before_it_while_others_are_left() -> None:
    alone, after = "tests/e2e/test_outages.py::alone", "tests/e2e/test_tide.py::after"
    a, b = Worker("gw0"), Worker("gw1")
    sched = scheduler([alone, LATE, after], [a, b])
    assert handed(sched, a) == alone
    # The alone test has not ended: the late one is passed over for the test after it.
    assert handed(sched, b) == after
    assert list(sched.workqueue) == [LATE]
    # Nothing else is left: it goes, rather than leave a worker without work.
    assert handed(sched, b) == LATE


def test_a_late_test_goes_at_once_when_everything_before_it_has_ended() -> None:
    before, after = "tests/e2e/test_outages.py::before", "tests/e2e/test_tide.py::after"
    a, b = Worker("gw0"), Worker("gw1")
    sched = scheduler([before, LATE, after], [a, b])
    assert handed(sched, a) == before
    finish(sched, a, before)
    assert handed(sched, b) == LATE
    # A test handed out after it (behind it in the order) does not hold it back either.
    assert handed(sched, a) == after
