"""Turns at one shared lab for tests run by several pytest-xdist workers.

The lab is a shared, stateful thing: a test that stops an apiserver, fills a member or counts
every pod in it cannot run beside another test. Most tests can (their own provider, virtual
node and namespace, a few small pods), and most of their time is spent waiting on controllers'
timers, so two of them at once halve that time without halving anyone's margin. The lock is a
reader/writer lock across processes (`flock`): a test that shares the lab takes it shared, any
other lab test takes it exclusive. A turnstile keeps a test that must run alone from waiting
for ever behind sharing tests that keep arriving: it holds the turnstile while it waits, and
sharing tests pass through the turnstile before they take their share.

Locks are files in the lab's directory, so whatever runs against that lab (workers of one run,
or a developer's second pytest against a lab named by VKPROVIDER_LAB_STATE) takes its turn.
`flock` locks go with the process, so a worker that dies releases its turn.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def turn(directory: Path, *, alone: bool) -> Iterator[None]:
    """Hold a turn at the lab whose lock files are in `directory`: alone (exclusive) or shared
    with other sharing holders."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "turnstile.lock", "a") as gate, open(directory / "turn.lock", "a") as lab:
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
