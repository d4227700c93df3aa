"""Pods held compactly: each as deflated JSON (vkprovider.podzip), decoded when read.

A decoded pod costs about five times its JSON in Python objects (12 KB against 2.4 KB for a
plain pod with its status), and a provider holds every pod bound to its nodes, each in more than
one place. The store keeps each pod packed (150-330 bytes for a plain pod), and the few fields
its owners scan over all pods (UID, node, phase, and one value of the owner's choosing, `index`)
in a slotted record, so such a scan decodes nothing. The pods read or written lately stay
decoded (a bounded number, `hot`): a burst's syncs read the pod its watch event has just put,
and pay no decode. A pod is packed when it leaves the hot set, not when put: a pod written
several times in a burst (bound, started, its status reported) is packed once.

A pod read from the store must be treated as read-only, as the objects of any informer cache:
a change made to it is kept only by chance.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar, cast

from vkprovider import podzip
from vkprovider.objects import Pod

_P = TypeVar("_P", bound=Pod | dict[str, Any])

#: Pods kept decoded: enough for the syncs in flight in a burst, a fixed cost however many pods.
HOT = 256
#: Pods a `walk` decodes between two turns of the event loop: a few ms of decoding at most.
TURN = 128


class Entry:
    """A pod's record. `raw` is its packed JSON, None while the pod is in its store's hot set
    and not packed yet (it is packed when it leaves)."""

    __slots__ = ("extra", "node", "phase", "raw", "uid")

    def __init__(self, raw: bytes | None, uid: str, node: str, phase: str, extra: Any) -> None:
        self.raw, self.uid, self.node, self.phase, self.extra = raw, uid, node, phase, extra


class PodStore(MutableMapping[str, _P], Generic[_P]):
    """Pods by key (front-end `namespace/name`, or whatever key the owner chooses)."""

    def __init__(self, *, hot: int = HOT, index: Callable[[_P], Any] | None = None) -> None:
        self._entries: dict[str, Entry] = {}
        self._index = index
        self._hot: OrderedDict[str, _P] = OrderedDict()
        self._hot_max = hot
        #: Told (key, record) when a pod leaves, or its key comes to hold another pod (UID):
        #: what lets a PodOverlay borrow from this store.
        self.forgetting: Callable[[str, Entry], None] | None = None

    def _remember(self, key: str, pod: _P) -> None:
        self._hot[key] = pod
        self._hot.move_to_end(key)
        if len(self._hot) > self._hot_max:
            gone = next(iter(self._hot))
            entry = self._entries.get(gone)
            if entry is not None:
                self._packed(gone, entry)
            del self._hot[gone]

    def _packed(self, key: str, entry: Entry) -> Entry:
        """`entry` with its bytes, for a pod about to leave the hot set or this store."""
        if entry.raw is None:
            entry.raw = podzip.pack(self._hot[key])
        return entry

    def __getitem__(self, key: str) -> _P:
        pod = self._hot.get(key)
        if pod is not None:
            self._hot.move_to_end(key)
            return pod
        raw = self._entries[key].raw
        assert raw is not None  # only a hot pod is unpacked
        pod = cast(_P, podzip.unpack(raw))
        self._remember(key, pod)
        return pod

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._entries else default

    def __setitem__(self, key: str, pod: _P) -> None:
        meta: Any = pod.get("metadata") or {}
        spec: Any = pod.get("spec") or {}
        status: Any = pod.get("status") or {}
        uid, node, phase = str(meta.get("uid") or ""), str(spec.get("nodeName") or ""), str(status.get("phase") or "")
        extra = self._index(pod) if self._index is not None else None
        old = self._entries.get(key)
        if old is not None and old.uid != uid and self.forgetting is not None:
            self.forgetting(key, self._packed(key, old))  # before the new pod takes its hot place
        self._entries[key] = Entry(None, uid, node, phase, extra)
        self._remember(key, pod)

    def __delitem__(self, key: str) -> None:
        if key not in self._entries:
            raise KeyError(key)
        self.discard(key)

    def discard(self, key: str) -> None:
        """Forget the pod if held (`pop` would decode it only to throw it away)."""
        entry = self._entries.get(key)
        if entry is not None and self.forgetting is not None:
            self.forgetting(key, self._packed(key, entry))
        self._entries.pop(key, None)
        self._hot.pop(key, None)

    def replace_if_still(self, key: str, version: str | None, pod: _P) -> None:
        """`pod` in place of the version `version` of it, if that is still the one held: nothing
        held, or a newer version (the watch's, while a write was answered), stays. A write with
        that version as its precondition makes anything held since at least as new as `pod`."""
        held = self.get(key)
        if held is not None and (held.get("metadata") or {}).get("resourceVersion") == version:
            self[key] = pod

    def holds(self, key: str, pod: _P) -> bool:
        """`pod` is the very object held for `key` (read or put lately): the same version."""
        return self._hot.get(key) is pod

    def adopt(self, key: str, entry: Entry) -> None:
        """Hold another store's record as is (its bytes are shared, not copied; packed)."""
        self._entries[key] = entry
        self._hot.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, key: str) -> Entry | None:
        """The pod's record (UID, node, phase, index), without decoding it."""
        return self._entries.get(key)

    def uid(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return entry.uid if entry is not None else None

    def node(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return entry.node if entry is not None else None

    def on_node(self, node: str) -> list[str]:
        return [k for k, e in self._entries.items() if e.node == node]

    def entries(self) -> list[tuple[str, Entry]]:
        return list(self._entries.items())

    async def walk(self, keys: list[str] | None = None, *, turn: int = TURN) -> AsyncIterator[tuple[str, _P]]:
        """As `scan`, for a caller on the event loop: the loop has a turn after every `turn`
        pods. A pod decodes in about 10 us on an idle core, yet one member's 3,300 pods in one
        go held the loop for 250-550 ms on a loaded one, and every status write behind them."""
        for i, item in enumerate(self.scan(keys), 1):
            yield item
            if i % turn == 0:
                await asyncio.sleep(0)

    def scan(self, keys: list[str] | None = None) -> Iterator[tuple[str, _P]]:
        """Every pod (or those of `keys` still held), decoded one at a time and not kept: a scan
        over thousands must not push the pods in use out of the hot set."""
        for key in list(self._entries) if keys is None else keys:
            pod = self._hot.get(key)
            if pod is None:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                assert entry.raw is not None  # only a hot pod is unpacked
                pod = cast(_P, podzip.unpack(entry.raw))
            yield key, pod


class PodOverlay(Generic[_P]):
    """Pods mostly read from another store, the runtime's cache of the API's pods, as a Go
    provider reads the pod lister virtual-kubelet hands it: a pod put here that the base holds
    (the very object it handed out) is borrowed, not copied. A borrowed pod reads as the base's
    latest version of it; when the base lets it go (deleted, or its name taken by a new pod),
    the overlay adopts the base's record, so what was put here stays readable until discarded.
    Without a base (`attach` not called) every pod is an own copy."""

    def __init__(self) -> None:
        self.own: PodStore[_P] = PodStore()
        self._base: PodStore[_P] | None = None
        self._borrowed: set[str] = set()

    def attach(self, base: PodStore[_P]) -> None:
        self._base = base
        base.forgetting = self._forgetting

    def _forgetting(self, key: str, entry: Entry) -> None:
        if key in self._borrowed:
            self._borrowed.discard(key)
            self.own.adopt(key, entry)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._borrowed and self._base is not None:
            return self._base.get(key, default)
        return self.own.get(key, default)

    def __getitem__(self, key: str) -> _P:
        if key in self._borrowed and self._base is not None:
            return self._base[key]
        return self.own[key]

    def __setitem__(self, key: str, pod: _P) -> None:
        if self._base is not None and self._base.holds(key, pod):
            self.own.discard(key)
            self._borrowed.add(key)
        else:
            self._borrowed.discard(key)
            self.own[key] = pod

    def discard(self, key: str) -> None:
        self._borrowed.discard(key)
        self.own.discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self._borrowed or key in self.own

    def borrowed(self) -> int:
        return len(self._borrowed)


class PodSubset(MutableMapping[str, _P], Generic[_P]):
    """Some of a shared store's pods (one job's), in the order they came: the pods live in the
    store, so all the subsets share its one hot set."""

    def __init__(self, store: PodStore[_P] | PodOverlay[_P]) -> None:
        self._store = store
        self._keys: dict[str, None] = {}

    def __getitem__(self, key: str) -> _P:
        if key not in self._keys:
            raise KeyError(key)
        return self._store[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._store.get(key, default) if key in self._keys else default

    def __setitem__(self, key: str, pod: _P) -> None:
        self._keys[key] = None
        self._store[key] = pod

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        self._store.discard(key)

    def discard(self, key: str) -> None:
        if self._keys.pop(key, 0) is None:
            self._store.discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
