"""Turns at one shared lab for tests run by several pytest-xdist workers.

The lab is a shared, stateful thing: a test that stops an apiserver, fills a member or counts
every pod in it cannot run beside another test. Most tests can (their own provider, virtual
node and namespace, a few small pods), and most of their time is spent waiting on controllers'
timers, so two of them at once halve that time without halving anyone's margin. The lock is a
reader/writer lock across processes (`flock`): a test that shares the lab takes it shared, any
other lab test takes it exclusive. A turnstile keeps a test that must run alone from waiting
for ever behind sharing tests that keep arriving: it holds the turnstile while it waits, and
sharing tests pass through the turnstile before they take their share.

The lock is per cluster (the front end and each member): a test that fills member-1 with
online load needs member-1 alone, but may run beside a test that uses only the front end and
member-3. A test names the clusters it takes alone and those it shares (e2e.fixtures reads them
from its marks); by default it takes every cluster alone.

Locks are files in the lab's directory, so whatever runs against that lab (workers of one run,
or a developer's second pytest against a lab named by VKPROVIDER_LAB_STATE) takes its turn.
`flock` locks go with the process, so a worker that dies releases its turn.
"""

from __future__ import annotations

import fcntl
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path


@contextmanager
def turn(directory: Path, *, alone: Collection[str], shares: Collection[str] = ()) -> Iterator[None]:
    """Hold a turn at the lab whose lock files are in `directory`: the clusters named in `alone`
    exclusively, those in `shares` shared with other sharing holders, the others not at all.

    Each cluster has its own lock and turnstile, taken in one order (sorted names), so two
    holders never wait on each other in a cycle."""
    directory.mkdir(parents=True, exist_ok=True)
    overlap = set(alone) & set(shares)
    if overlap:
        raise ValueError(f"a turn both alone on and sharing {sorted(overlap)}")
    with ExitStack() as held:
        for cluster in sorted({*alone, *shares}):
            held.enter_context(_cluster_turn(directory, cluster, alone=cluster in alone))
        yield


@contextmanager
def _cluster_turn(directory: Path, cluster: str, *, alone: bool) -> Iterator[None]:
    with (
        open(directory / f"{cluster}.turnstile.lock", "a") as gate,
        open(directory / f"{cluster}.turn.lock", "a") as lab,
    ):
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lab, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lab, fcntl.LOCK_UN)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on the file `path` (made if missing), as for starting the lab."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
