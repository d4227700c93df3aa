"""A fresh list taken into a store in pages: what every list-then-watch loop does after a start,
an expired watch or an apiserver restart.

A list of all pods comes back whole at once unless asked for in pages, and decoded whole it
costs several times its JSON: tens of thousands of pods (a member's online pods, a front end's
pods on our nodes) would be hundreds of megabytes for a moment, on every relist, and the
allocator keeps much of that high-water mark. Taken in pages (client-go's reflector does the
same), each item is put as its page arrives and the page let go before the next is fetched;
what the list no longer holds is dropped at the end. Until then the store holds the old state
updated by the pages so far, as it held the old state alone before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vkprovider.kube.client import PAGE_SIZE, KubeClient, Params


class Relist:
    """One relist into a store: `put` stores an item and returns its key; `finish` is told the
    keys seen, to drop the others."""

    def __init__(self, put: Callable[[dict[str, Any]], str], finish: Callable[[set[str]], None]) -> None:
        self._put, self._finish = put, finish
        self.seen: set[str] = set()

    def put(self, item: dict[str, Any]) -> None:
        self.seen.add(self._put(item))

    def page(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.put(item)

    def done(self) -> None:
        self._finish(self.seen)


class Whole:
    """A relist for a store that takes the whole list at once (a few hundred nodes, say)."""

    def __init__(self, replace: Callable[[list[dict[str, Any]]], None]) -> None:
        self._replace = replace
        self._items: list[dict[str, Any]] = []

    def page(self, items: list[dict[str, Any]]) -> None:
        self._items.extend(items)

    def done(self) -> None:
        self._replace(self._items)
        self._items = []


async def relist(
    client: KubeClient, path: str, into: Relist | Whole, *, params: Params | None = None, limit: int = PAGE_SIZE
) -> str:
    """List `path` in pages of `limit` into `into`; the list's resourceVersion, to watch from."""
    version = ""
    async for page in client.pages(path, params=params, limit=limit):
        into.page(page.pop("items", None) or [])  # the page's items are let go once put
        version = str((page.get("metadata") or {}).get("resourceVersion") or version)
    into.done()
    return version


class Expiries:
    """When a list-then-watch loop lists again after its watch expired (410 Gone).

    An expiry after a watch that delivered something is the normal end of a long watch: list
    again at once. One right after a list, before any event, means the apiserver cannot serve a
    watch from where a list ends (its watch window is shorter than a list takes: a small cache
    under churn, a compaction, a restarted apiserver behind a balancer): listing again at once
    would list in a tight loop, each list as costly as the first, so the wait doubles from
    `base` up to `cap` until a watch delivers again. `relists` counts the lists taken for
    expiries, for the loop's metrics and tests.
    """

    def __init__(self, *, base: float = 0.2, cap: float = 5.0) -> None:
        self.base, self.cap = base, cap
        self.relists = 0
        self._in_a_row = 0
        self._delivered = False

    def listed(self, version: str) -> str:
        """A list (ending at `version`, returned) begins a new watch: nothing delivered yet."""
        self._delivered = False
        return version

    def delivered(self, version: str) -> str:
        """The watch delivered an event or a bookmark (at `version`, returned): it works from
        where the list ended."""
        self._delivered = True
        self._in_a_row = 0
        return version

    def expired(self) -> float:
        """Seconds to wait before listing again after a 410."""
        self.relists += 1
        if self._delivered:
            self._in_a_row = 0
            return 0.0
        self._in_a_row += 1
        return float(min(self.cap, self.base * 2.0 ** (self._in_a_row - 1)))

    async def wait(self, log: Any, **context: object) -> None:
        """After a 410: say so and wait as `expired` says before listing again."""
        delay = self.expired()
        log.info("watch expired; listing again", retry_in=delay, **context)
        await asyncio.sleep(delay)
