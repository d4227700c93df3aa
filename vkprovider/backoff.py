"""Retry delays: per-key exponential backoff, capped, as client-go's item rate limiter does."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExponentialBackoff:
    """Delay for the n-th consecutive failure of a key: base * 2**n, at most `cap` seconds."""

    base: float = 0.005
    cap: float = 60.0
    _failures: dict[str, int] = field(default_factory=dict)

    def next_delay(self, key: str) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return float(min(self.cap, self.base * (2**n)))

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)
