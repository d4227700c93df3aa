"""The terms of a checkpoint notice (pure): how long it is, and how the workload answers it.

- The period: the pod's `vkprovider.io/checkpoint-seconds` (or its job's, carried onto the
  member pod at dispatch), else the member's default, capped by the member's maximum. A value
  that is not a finite, non-negative number of seconds ("-30", "nan", "30s") is not guessed
  at: the default applies and the problem is named (a Warning Event at the front end).
- An acknowledgement: the workload sets `vkprovider.io/checkpointed-at` (an RFC 3339 time, at
  or after the notice) on its front-end pod once its checkpoint is written; the pod is released
  at once instead of at its deadline.
- An extension: `vkprovider.io/checkpoint-extend` asks for that many seconds on top of the
  period. The whole notice may reach the member's maximum and no more: what fits is granted,
  what goes beyond is refused (the deadline moves to the maximum), both answered with Events.

Everything here is decided from annotations and the member's settings, so a restarted
provider answers the same way.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass

from federation import labels


def parse_time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_seconds(text: str) -> float | None:
    """A finite, non-negative number of seconds, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True, slots=True)
class Period:
    seconds: float
    problem: str | None = None  # why the pod's own value was not used


def period(annotations: Mapping[str, str], *, default: float, maximum: float) -> Period:
    """The notice period of a member pod (its annotations carry the pod's or job's request)."""
    wanted = annotations.get(labels.CHECKPOINT_SECONDS)
    if wanted is None or wanted == "":
        return Period(min(default, maximum))
    seconds = parse_seconds(wanted)
    if seconds is None:
        problem = (
            f"{labels.CHECKPOINT_SECONDS}={wanted!r} is not a non-negative number of seconds; "
            f"the member's default notice of {min(default, maximum):g}s applies"
        )
        return Period(min(default, maximum), problem)
    return Period(min(seconds, maximum))


@dataclass(frozen=True, slots=True)
class Extension:
    asked: float  # seconds of notice asked for in all (the period plus the extension)
    granted: float  # seconds of notice granted in all
    deadline: float

    @property
    def refused(self) -> bool:
        return self.asked > self.granted


def extension(
    front: Mapping[str, str], *, noticed_at: float, base: float, maximum: float, margin: float
) -> Extension | str | None:
    """The deadline a pod's extension request asks for (None: no request; a string: the request
    cannot be read, and why)."""
    text = front.get(labels.CHECKPOINT_EXTEND)
    if text is None or text == "":
        return None
    more = parse_seconds(text)
    if more is None:
        return f"{labels.CHECKPOINT_EXTEND}={text!r} is not a non-negative number of seconds; the deadline stays"
    asked = base + more
    granted = max(base, min(asked, maximum))
    return Extension(asked=asked, granted=granted, deadline=noticed_at + granted + margin)


def acknowledged(front: Mapping[str, str], *, noticed_at: float) -> bool | str:
    """Whether the workload says its checkpoint is written since the notice (True), has not
    (False), or wrote something unreadable (a string: why)."""
    text = front.get(labels.CHECKPOINTED_AT)
    if text is None or text == "":
        return False
    at = parse_time(text)
    if at is None:
        return f"{labels.CHECKPOINTED_AT}={text!r} is not an RFC 3339 time; the notice runs to its deadline"
    # Whole seconds are the usual precision (`date -u +%FT%TZ`): the notice's own second counts.
    return at >= math.floor(noticed_at)
