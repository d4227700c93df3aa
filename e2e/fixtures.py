"""The lab as a pytest fixture: started once per test session and shared by the end-to-end tests.

Set `VKPROVIDER_LAB_STATE=DIR` to run the tests against a lab already up in DIR (started with
`python -m e2e up --offline-nodes 4 --state DIR`); it is left running afterwards. Otherwise the
fixture starts 3 members x 20 nodes and 4 native offline nodes in a temporary directory and
stops it at the end of the session.

Under pytest-xdist (`-n 3` in `make test`) the workers share one lab: the first to need it starts it in the
run's base temporary directory, the others find it there, and the controller stops it when the
run ends. Each lab test then takes a turn (e2e.turns): tests marked `shares_lab` run beside
each other, every other lab test runs alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

from e2e import lab as lab_mod
from e2e import state as state_mod
from e2e import turns
from e2e.state import LabState
from vkprovider.kube import KubeClient, load_kubeconfig

MEMBERS = 3
NODES_PER_MEMBER = 20
OFFLINE_NODES = 4  # native nodes of the offline cluster, for hybrid jobs


@dataclass
class Lab:
    """A running lab as tests see it."""

    state: LabState

    @property
    def state_dir(self) -> Path:
        return self.state.root

    @property
    def members(self) -> list[str]:
        return [name for name, c in self.state.clusters.items() if c.role == "member"]

    def kubeconfig(self, cluster: str) -> Path:
        return self.state.kubeconfig(cluster)

    def client(self, cluster: str) -> KubeClient:
        """A new client for `cluster`; the caller closes it (use `async with`)."""
        return KubeClient(load_kubeconfig(self.kubeconfig(cluster)), user_agent="vkprovider-tests")


#: Set in pytest-xdist's workers (gw0, gw1, ...): the lab is shared between them.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
SPEC = lab_mod.LabSpec(members=MEMBERS, nodes_per_member=NODES_PER_MEMBER, offline_nodes=OFFLINE_NODES)


def _run_root(factory: pytest.TempPathFactory) -> Path:
    """The run's base temporary directory, the same for the controller and every worker
    (xdist gives each worker a directory inside it)."""
    base = factory.getbasetemp()
    return base.parent if WORKER else base


async def _shared_lab(root: Path) -> LabState:
    """The run's lab in `root/lab`, started by whichever worker asks first."""
    state_dir = root / "lab"
    lock = turns.exclusive(root / "lab.start.lock")
    await asyncio.to_thread(lock.__enter__)  # in a thread: another worker may hold it through a start-up
    try:
        failed = root / "lab.failed"
        if failed.exists():
            pytest.fail(f"the shared lab failed to start in another worker: {failed.read_text()}")
        found = state_mod.load(state_dir) if state_dir.is_dir() else None
        if found is not None and found.ready and lab_mod.is_running(found):
            return found
        try:
            return await lab_mod.up(state_dir, SPEC)
        except BaseException as e:
            failed.write_text(f"{type(e).__name__}: {e}")
            raise
    finally:
        lock.__exit__(None, None, None)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    reuse = os.environ.get("VKPROVIDER_LAB_STATE")
    if reuse:
        state = lab_mod.load_running(Path(reuse))
        if not lab_mod.is_running(state):
            pytest.fail(f"VKPROVIDER_LAB_STATE={reuse} names a lab that is not running")
        yield Lab(state)
        return
    if WORKER:
        # Stopped by the controller (pytest_sessionfinish below), once every worker is done.
        yield Lab(await _shared_lab(_run_root(tmp_path_factory)))
        return
    state_dir = tmp_path_factory.mktemp("lab")
    state = await lab_mod.up(state_dir, SPEC)
    try:
        yield Lab(state)
    finally:
        # From disk: tests restart clusters through the CLI functions, which record new PIDs there.
        lab_mod.teardown(lab_mod.load_running(state.root))


def _uses_lab(item: pytest.Item) -> bool:
    """A test takes a turn at the lab when it uses the lab, or is an end-to-end test that runs
    alone (it may start labs of its own); a sharing one that never asks for the lab (a chart
    rendered, a built binary run) takes none and runs whenever a worker is free."""
    if "lab" in getattr(item, "fixturenames", ()):
        return True
    return item.get_closest_marker("e2e") is not None and item.get_closest_marker("shares_lab") is None


#: The clusters a test can take turns at: the front end and each member.
CLUSTERS = ("offline", *(f"member-{i}" for i in range(1, MEMBERS + 1)))
#: Tests alone on this member and sharing the rest run one after another in one worker, while
#: the other worker runs the tests that keep away from it (the reclaim scenes fill it).
CHAIN = "member-1"


def turn_of(item: pytest.Item) -> tuple[frozenset[str], frozenset[str]]:
    """The clusters a lab test takes alone and those it shares: `lab_turn(alone=..., shares=...)`
    names them; `shares_lab` shares every cluster; a test with neither takes every one alone."""
    mark = item.get_closest_marker("lab_turn")
    if mark is not None:
        alone, shares = frozenset(mark.kwargs.get("alone", ())), frozenset(mark.kwargs.get("shares", ()))
        unknown = (alone | shares) - set(CLUSTERS)
        if unknown or not (alone | shares):
            raise pytest.UsageError(f"{item.nodeid}: lab_turn names {sorted(unknown) or 'no cluster'}")
        return alone, shares
    if item.get_closest_marker("shares_lab"):
        return frozenset(), frozenset(CLUSTERS)
    return frozenset(CLUSTERS), frozenset()


@pytest.fixture(autouse=True)
def _lab_turn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A lab test's turn at the shared lab (e2e.turns), held from before its first fixture to
    after its last; only where several processes may share the lab: the workers of one run, or
    any pytest against a lab named by VKPROVIDER_LAB_STATE (another may run beside it)."""
    reuse = os.environ.get("VKPROVIDER_LAB_STATE")
    if not WORKER and not reuse:
        yield
        return
    where = Path(reuse) if reuse else _run_root(tmp_path_factory)
    asked = got = time.time()
    if not _uses_lab(request.node):
        yield
    else:
        alone, shares = turn_of(request.node)
        with turns.turn(where, alone=alone, shares=shares):
            got = time.time()
            yield
    # Where a run waits (a worker idle while another holds a turn it needs), for whoever
    # shortens the run: one line per test, in the lab's directory.
    line = {"test": request.node.nodeid, "worker": WORKER, "asked": asked, "got": got, "done": time.time()}
    with open(where / "turns.log", "a") as log:
        log.write(json.dumps(line) + "\n")


#: The files of the chain's tests. The xdist controller, which schedules, sees test ids and not
#: marks, so the chain is named by file here; every worker checks that these files hold exactly
#: the tests alone on CHAIN (pytest_collection_modifyitems).
CHAIN_FILES = ("tests/e2e/test_reclaim.py", "tests/e2e/test_reclaim_answers.py", "tests/e2e/test_reclaim_fit.py")


def _in_chain(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0] in CHAIN_FILES


#: Long tests that share every cluster, handed to a worker only once every test before them in
#: the run's order has ended (if another test is left to hand out instead). One started while a
#: test that runs alone is still queued on the other worker holds that test, and its worker, for
#: its whole length: the restart harness (about 126 s then, 90 s now) kept a worker idle that long so.
LATE_FILES = ("tests/e2e/test_restart_harness.py",)


def _late(scope: str) -> bool:
    return scope.split("::", 1)[0] in LATE_FILES


class ChainScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's load-scope scheduling where the chain's tests are one scope (one worker runs them
    back to back), every other test is a scope of its own, and the LATE_FILES' tests wait for
    every test before them. (xdist's own `loadgroup` reads marks by renaming test ids, which
    pytest 9 no longer lets it do.)"""

    _order: dict[str, int] | None = None

    def _split_scope(self, nodeid: str) -> str:
        return CHAIN if _in_chain(nodeid) else nodeid

    def _assign_work_unit(self, node: Any) -> None:
        first = next(iter(self.workqueue))
        if _late(first) and self._unfinished_before(first):
            sooner = next((scope for scope in self.workqueue if not _late(scope)), None)
            if sooner is not None:
                self.workqueue.move_to_end(sooner, last=False)
        super()._assign_work_unit(node)

    def _unfinished_before(self, late: str) -> bool:
        """Whether a scope ahead of `late` in the run's order has a test that has not ended."""
        if self._order is None:
            self._order = {}
            for nodeid in self.collection or ():
                self._order.setdefault(self._split_scope(nodeid), len(self._order))
        limit = self._order[late]
        return any(
            self._order.get(scope, limit) < limit and not all(unit.values())
            for work in self.assigned_work.values()
            for scope, unit in work.items()
        )


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope --no-loadscope-reorder` (the Makefile's) schedules the chain this way."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ChainScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, order the run so that turns waste little. First the chain: the tests alone
    on member-1 alone, one scope (ChainScheduling), so one worker runs them back to back from
    the start (the first of them starts the lab). The other worker meanwhile runs the tests
    that need no lab, then the lab tests that keep away from member-1 (those alone on a cluster
    first); then every other test that runs alone (the workers take turns), then the sharing
    ones (side by side), the LATE_FILES' once all before them have ended; in each, the tests
    marked `long` first. Sorting is stable and the same in every worker, as xdist requires."""
    if not WORKER:
        return

    def rank(item: pytest.Item) -> float:
        if not _uses_lab(item):
            return 1
        alone, shares = turn_of(item)
        if (alone == {CHAIN}) != _in_chain(item.nodeid):
            raise pytest.UsageError(f"{item.nodeid}: the chain's tests (alone on {CHAIN}) are those of {CHAIN_FILES}")
        if alone == {CHAIN}:
            return 0
        if CHAIN not in alone | shares:
            return 2 if alone else 2.5  # those alone first: a long sharer started first holds them
        return 4 if not alone else 3

    # Within a rank the long tests go first: one left for last would run while the other
    # worker has nothing to do.
    ranks = {id(item): (rank(item), item.get_closest_marker("long") is None) for item in items}
    items.sort(key=lambda item: ranks[id(item)])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the xdist controller: stop the lab the workers shared, if one was started."""
    if WORKER or not session.config.getoption("numprocesses", default=None):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    state_dir = factory.getbasetemp() / "lab"
    if (state_dir / state_mod.STATE_FILE).exists():
        lab_mod.teardown(lab_mod.load_running(state_dir))
