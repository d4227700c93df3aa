"""A keyed work queue: one key is processed at a time, different keys in parallel, with retries.

Semantics follow client-go's workqueue: a key added while waiting is queued once; a key added
while being processed is processed again after `done`; delayed adds (`add_after`) keep the
earliest deadline. Workers are a fixed pool that call `get` / `done`, so there is no task per
event however many events arrive. A key made ready wakes one idle worker, and one timer stands
for all delayed keys: with 64 workers, waking them all on each key (an Event and a timeout
each) took a fifth of the provider's CPU in a paced run, idle workers racing for one key.

A key added `urgent` goes ahead of the others: a pod whose member reports it running needs one
status write, and when slow member apiservers hold every worker on creates and deletes for
seconds, it would otherwise wait behind all of them (10,000 pods under churn: queue waits of
2.5-10 s at the p99 while a relay without a queue reported within the apiservers' time).
Going first is not enough when every worker is held by such a call: a worker that calls
`get(urgent_only=True)` serves the urgent lane alone, so a few of them are always free for it.
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
    def __init__(
        self,
        *,
        backoff: ExponentialBackoff | None = None,
        clock: Callable[[], float] | None = None,
        observe_wait: Callable[[float, bool], None] | None = None,
    ) -> None:
        self._queue: deque[str] = deque()
        self._urgent: deque[str] = deque()  # goes first
        self._queued: set[str] = set()  # keys in a lane; an entry for another is stale
        self._pressing: set[str] = set()  # keys whose next run is urgent
        self._since: dict[str, float] = {}  # key -> when it joined the queue, while observed
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: list[tuple[float, int, str]] = []  # (deadline, seq, key)
        self._deadlines: dict[str, float] = {}
        self._seq = 0
        self._loop = asyncio.get_running_loop()
        self._getters: deque[asyncio.Future[None]] = deque()  # idle workers, first come first woken
        self._urgent_getters: deque[asyncio.Future[None]] = deque()  # idle workers of the urgent lane only
        self._timer: asyncio.TimerHandle | None = None  # for the earliest delayed key
        self._timer_at: float | None = None  # its deadline, on `clock`
        self._shutdown = False
        self._clock = clock or self._loop.time
        self.backoff = backoff or ExponentialBackoff()
        #: Called with the seconds each key waited in the queue before a worker took it, and
        #: whether it was urgent: the part of a sync's latency that is the workers' fault.
        self._observe_wait = observe_wait

    def __len__(self) -> int:
        """Keys ready to be processed (not counting delayed ones)."""
        return len(self._queued)

    @property
    def delayed(self) -> int:
        return len(self._deadlines)

    def due(self, key: str) -> bool:
        """A run of `key` is already ahead that will see the present: queued, or delayed and
        not being processed now (a run under way may have read the state before a change)."""
        return key not in self._processing and (key in self._dirty or key in self._deadlines)

    def _ready(self, key: str) -> None:
        """`key` joins the queue: one idle worker, if any, is woken for it. A woken worker
        always looks at the queue again before it waits, so no wake-up is lost when another
        worker takes the key first."""
        self._queued.add(key)
        urgent = key in self._pressing
        (self._urgent if urgent else self._queue).append(key)
        if self._observe_wait is not None:
            self._since[key] = self._clock()
        self._wake_one(urgent=urgent)

    def _wake_one(self, *, urgent: bool) -> bool:
        """Wake one idle worker that may take such a key (for an urgent one, its own lane's
        workers first, so the others stay free for the plain lane); whether there was one."""
        for getters in (self._urgent_getters, self._getters) if urgent else (self._getters,):
            while getters:
                getter = getters.popleft()
                if not getter.done():
                    getter.set_result(None)
                    return True
        return False

    def add(self, key: str, *, urgent: bool = False) -> None:
        if self._shutdown:
            return
        if urgent and key not in self._pressing:
            self._pressing.add(key)
            if key in self._queued:
                self._urgent.append(key)  # ahead now; its plain entry is stale
                self._wake_one(urgent=True)
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready(key)

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
        if self._timer_at is None or deadline < self._timer_at:
            self._arm(deadline)

    def add_rate_limited(self, key: str) -> float:
        """Retry `key` after its next backoff delay; returns the delay."""
        delay = self.backoff.next_delay(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: its backoff starts over."""
        self.backoff.forget(key)

    def _arm(self, deadline: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, deadline
        if deadline is not None and not self._shutdown:
            self._timer = self._loop.call_later(max(0.0, deadline - self._clock()), self._promote_due)

    def _promote_due(self) -> None:
        """Move due delayed keys to the queue, and set the timer for the next one."""
        now = self._clock()
        while self._waiting:
            deadline, _, key = self._waiting[0]
            if self._deadlines.get(key) != deadline:
                heapq.heappop(self._waiting)  # superseded by an earlier deadline
                continue
            if deadline > now:
                if self._timer_at != deadline or self._timer is None:
                    self._arm(deadline)
                return
            heapq.heappop(self._waiting)
            del self._deadlines[key]
            self.add(key)
        self._arm(None)

    async def get(self, *, urgent_only: bool = False) -> str:
        """The next key to process (of the urgent lane only, if asked); the caller must call
        `done(key)` afterwards."""
        while True:
            if self._shutdown:
                raise ShutDown
            if self._waiting and self._waiting[0][0] <= self._clock():
                self._promote_due()  # due, and its timer not run yet
            found = self._next(urgent_only)
            if found is not None:
                key, urgent = found
                self._dirty.discard(key)
                self._processing.add(key)
                if self._observe_wait is not None:
                    self._observe_wait(self._clock() - self._since.pop(key), urgent)
                return key
            getter = self._loop.create_future()
            (self._urgent_getters if urgent_only else self._getters).append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                # Woken for a key, then cancelled: another worker takes it, one that takes
                # any key if there is one idle.
                woken = getter.done() and not getter.cancelled() and self._queued
                if woken and not self._wake_one(urgent=False) and self._urgent:
                    self._wake_one(urgent=True)
                raise

    def _next(self, urgent_only: bool) -> tuple[str, bool] | None:
        """The first queued key and whether it is urgent, urgent ones first; stale entries are
        dropped on the way."""
        lanes = ((self._urgent, True),) if urgent_only else ((self._urgent, True), (self._queue, False))
        for lane, urgent in lanes:
            while lane:
                key = lane.popleft()
                if key in self._queued and (key in self._pressing) is urgent:
                    self._queued.discard(key)
                    self._pressing.discard(key)
                    return key, urgent
        return None

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._ready(key)

    def shut_down(self) -> None:
        self._shutdown = True
        self._arm(None)
        for getters in (self._getters, self._urgent_getters):
            while getters:
                getter = getters.popleft()
                if not getter.done():
                    getter.set_result(None)
