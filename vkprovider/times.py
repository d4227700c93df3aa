"""Times as the Kubernetes API writes them (RFC 3339, UTC) and back, in seconds since the epoch
(pure): shared by the kubelet's stats text and the providers that build its Summary."""

from __future__ import annotations

import datetime


def epoch(ts: str | None) -> float | None:
    """An RFC 3339 time in seconds since the epoch; None for none or a malformed one."""
    if not ts:
        return None
    try:
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(seconds: float) -> str:
    """Seconds since the epoch as an RFC 3339 time in UTC, to the microsecond."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
