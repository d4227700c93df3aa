"""What people read of the provider on its plain port, as one mixin of FederationProvider: the
dashboard page, the capacity history, the tide ahead and the reclaims kept, with the file that
keeps them across restarts. The view's own state only; what it shows of the rest (members, jobs,
reclaims under way) the provider hands in.
"""

from __future__ import annotations

import time
from typing import Any

from federation.view import page
from federation.view.reclaims import ReclaimLog
from federation.view.store import ViewStore
from federation.view.tide import Tide


class Readings:
    tide: Tide
    reclaim_log: ReclaimLog
    store: ViewStore

    def _init_readings(self, tiers: list[tuple[float, int]], *, max_series: int, file: str, save: float) -> None:
        self.tide = Tide.with_tiers(tiers, max_series=max_series)
        self.reclaim_log = ReclaimLog()
        self.store = ViewStore(file, self.tide.history, self.reclaim_log, interval=save)

    def dashboard_page(self) -> bytes:
        return page.dashboard()

    def history(
        self, since_seconds: float, member: str | None, resource: str | None, points: int | None = None
    ) -> dict[str, Any]:
        """The capacity history (federation.view.tide), served at /history."""
        return self.tide.query(since_seconds=since_seconds, member=member, resource=resource, max_points=points)

    def forecast(self, hours: float) -> dict[str, Any]:
        """The tide ahead per member (federation.view.forecast), served at /forecast."""
        return self.tide.forecast(hours=hours)

    def reclaims(self, since_seconds: float, member: str | None) -> dict[str, Any]:
        """The pods given back (federation.view.reclaims), served at /reclaims."""
        return self.reclaim_log.served(since_seconds, member, now=time.time())
