"""Room taken in a member that its capacity summary does not count yet (pure arithmetic).

The summary counts a pod once the inventory sees it on a node. Until then a pod sent to the
member, and for a moment a pod bound after the summary was computed, claim room the summary
still offers: without subtracting them a burst places pods on room earlier ones of the burst
already took (a 3,000-pod burst sent 69 pods beyond a member's pod slots).
"""

from __future__ import annotations

import time

from federation.capacity import quantities


class Reservations:
    def __init__(self) -> None:
        self._unbound: dict[str, dict[str, int]] = {}  # key -> requests, sent and not on a node
        self._unbound_total: dict[str, int] = {}
        self._bound_lately: dict[str, tuple[dict[str, int], float]] = {}  # key -> requests, when

    def __contains__(self, key: str) -> bool:
        return key in self._unbound

    def hold(self, key: str, requests: dict[str, int]) -> None:
        """A pod on its way to the member, or in it and not yet bound: its room is taken."""
        if key not in self._unbound:
            self._unbound[key] = requests
            self._unbound_total = quantities.add(self._unbound_total, requests)

    def release(self, key: str, *, bound: bool = False) -> None:
        """The pod is gone or ended; or, `bound`, on a node: counted by summaries from now on."""
        requests = self._unbound.pop(key, None)
        if requests is not None:
            self._unbound_total = quantities.add(self._unbound_total, requests, -1)
            if bound:
                self._bound_lately[key] = (requests, time.monotonic())
        elif not bound:
            self._bound_lately.pop(key, None)

    def uncounted(self, summary_at: float) -> dict[str, int]:
        """What a summary computed at `summary_at` (monotonic) does not count yet."""
        for key in [k for k, (_, at) in self._bound_lately.items() if at <= summary_at]:
            del self._bound_lately[key]
        total = self._unbound_total
        for requests, _ in self._bound_lately.values():
            total = quantities.add(total, requests)
        return total
