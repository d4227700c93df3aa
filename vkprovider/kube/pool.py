"""The connection pool toward one apiserver: idle connections handed out newest first.

aiohttp (since 3.11) hands out its idle keep-alive connections oldest first. Then any trickle of
requests (a member's health check every 2 s, a status write now and then) cycles through every
connection a burst opened, none ever idles out, and each holds its TLS buffers (about 180 KiB in
this process) and a socket on the apiserver for good: 60 of them after one burst of pods. Handed
out newest first, the connections a trickle needs stay warm and the rest idle out after the
keep-alive timeout, as in Go's net/http pool (and aiohttp's own before 3.11).

aiohttp has no switch for the order, so the connector puts a released connection at the head of
its idle queue itself. That touches aiohttp's private queue: if a release ever changes it, the
order falls back to aiohttp's own, and a test (tests/unit/test_pool.py) says so.
"""

from __future__ import annotations

from typing import Any

import aiohttp

#: Seconds an idle connection is kept (aiohttp's default).
KEEPALIVE = 15.0


class NewestFirst(aiohttp.TCPConnector):
    """A TCPConnector that reuses the most recently released idle connection first."""

    def _release(self, key: Any, protocol: Any, *, should_close: bool = False) -> None:
        super()._release(key, protocol, should_close=should_close)
        idle = getattr(self, "_conns", {}).get(key)
        if idle and idle[-1][0] is protocol:
            idle.rotate(1)  # from the tail, where aiohttp put it, to the head it takes from
