"""A keyed work queue: one key is processed at a time, different keys in parallel, with retries.

Semantics follow client-go's workqueue: a key added while waiting is queued once; a key added
while being processed is processed again after `done`; delayed adds (`add_after`) keep the
earliest deadline. Workers are a fixed pool that call `get` / `done`, so there is no task per
event however many events arrive.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable

from vkprovider.backoff import ExponentialBackoff


class ShutDown(Exception):
    """The queue was shut down; workers stop."""


class WorkQueue:
    def __init__(self, *, backoff: ExponentialBackoff | None = None, clock: Callable[[], float] | None = None) -> None:
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: list[tuple[float, int, str]] = []  # (deadline, seq, key)
        self._deadlines: dict[str, float] = {}
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._shutdown = False
        self._clock = clock or asyncio.get_running_loop().time
        self.backoff = backoff or ExponentialBackoff()

    def __len__(self) -> int:
        """Keys ready to be processed (not counting delayed ones)."""
        return len(self._queue)

    @property
    def delayed(self) -> int:
        return len(self._deadlines)

    def due(self, key: str) -> bool:
        """A run of `key` is already ahead that will see the present: queued, or delayed and
        not being processed now (a run under way may have read the state before a change)."""
        return key not in self._processing and (key in self._dirty or key in self._deadlines)

    def _wake(self) -> None:
        self._wakeup.set()

    def add(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wake()

    def add_after(self, key: str, delay: float) -> None:
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock() + delay
        if key in self._deadlines and self._deadlines[key] <= deadline:
            return
        self._deadlines[key] = deadline
        self._seq += 1
        heapq.heappush(self._waiting, (deadline, self._seq, key))
        self._wake()

    def add_rate_limited(self, key: str) -> float:
        """Retry `key` after its next backoff delay; returns the delay."""
        delay = self.backoff.next_delay(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: its backoff starts over."""
        self.backoff.forget(key)

    def _promote_due(self) -> float | None:
        """Move due delayed keys to the queue; the seconds until the next one, if any."""
        now = self._clock()
        while self._waiting:
            deadline, _, key = self._waiting[0]
            if self._deadlines.get(key) != deadline:
                heapq.heappop(self._waiting)  # superseded by an earlier deadline
                continue
            if deadline > now:
                return deadline - now
            heapq.heappop(self._waiting)
            del self._deadlines[key]
            if key not in self._dirty:
                self._dirty.add(key)
                if key not in self._processing:
                    self._queue.append(key)
        return None

    async def get(self) -> str:
        """The next key to process; the caller must call `done(key)` afterwards."""
        while True:
            if self._shutdown:
                raise ShutDown
            wait = self._promote_due()
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                return key
            # Nothing ready: sleep until an add or the next delayed key is due. No await
            # between the check above and clear(), so no wake-up can be lost.
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait)
            except TimeoutError:
                pass

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake()

    def shut_down(self) -> None:
        self._shutdown = True
        self._wake()
