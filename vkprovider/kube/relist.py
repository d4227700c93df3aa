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
