"""When a new pod's first status write is due: the settle rule of the pod controller.

A pod that starts quickly is reported once, as Running, not Pending then Running: its first
write waits while it is Pending, `status_settle` seconds, and in a burst (more new pods waiting
for their first write than there are workers) up to `status_settle_burst`, where each Pending
write would take the API's time from the creates behind it and most pods run before it is due.
Running or a failure is written at once: the controller asks again on every provider change,
but for one that says the pod is still Pending while a run is already due.
It also keeps when a change that wakes a sync was reported, for the status lag (the change to
its write). Pure bookkeeping on times; the controller owns the queue and the writes.
"""

from __future__ import annotations

import time

from vkprovider.objects import PodStatus
from vkprovider.settings import PodSettings


class Settling:
    def __init__(self, settings: PodSettings) -> None:
        self._settings = settings
        self._created: dict[str, float] = {}  # key -> loop time its pod was created in the provider
        self._reported: dict[str, float] = {}  # key -> when a change waking its sync was reported

    def created(self, key: str, now: float) -> None:
        if self._settings.status_settle > 0:  # 0: every first write at once
            self._created[key] = now

    def settling(self, key: str) -> bool:
        """The pod's first write has not been made yet."""
        return key in self._created

    def absorbs(self, key: str, phase: str | None, *, due: bool) -> bool:
        """A provider change saying the pod is `phase` needs no run of its own: it leaves the
        pod Pending before its first write, and a run that will see it is `due` anyway."""
        return phase == "Pending" and due and self.settling(key)

    def reported(self, key: str) -> None:
        """A provider change woke the key's sync: the first since its last sync began counts."""
        self._reported.setdefault(key, time.perf_counter())

    def reported_at(self, key: str) -> float | None:
        """When the change this sync answers was reported (None: not one); a change reported
        from now on counts for the next sync."""
        return self._reported.pop(key, None)

    def forget(self, key: str) -> None:
        self._created.pop(key, None)

    def wait(self, key: str, desired: PodStatus, now: float) -> float:
        """Seconds the pod's first write still waits (0: write now, and the pod is forgotten)."""
        created = self._created.get(key)
        if created is None:
            return 0.0
        if desired.get("phase", "Pending") == "Pending":
            settings = self._settings
            burst = len(self._created) > settings.workers
            until = created + max(settings.status_settle, settings.status_settle_burst if burst else 0.0)
            if until > now:
                return until - now
        del self._created[key]
        return 0.0
