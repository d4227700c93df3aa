"""What one client may hold of the kubelet port, and the listener that enforces it.

One provider serves every tenant of a front end, so no client may take more than its share:
- `StreamLimits`: the bounds of a streaming session (exec, attach, port-forward): streams and
  port-forward pairs per SPDY session, frame and WebSocket message sizes, the terminal-resize
  buffer, the bytes a session may hold, the rate of frames that carry no data, its idle
  timeout. Each limit hit is counted by name
  (`vkprovider_kubelet_limits_hit_total{limit}`).
- `ConnectionGuard`: connections in total and, per client address, those that have not yet sent
  a whole request (a slow or idle client holds a connection without any right to it; one that
  presented a client certificate our CA signed, like the kube-apiserver carrying every user's
  streams from one address, is bounded by the total only: refusing a burst of its connections
  would refuse its users); the time any client has to send its request headers, and to send
  the next one on a kept-alive connection.
- `GuardedSite`: an aiohttp site whose listener wraps each connection's protocol with the guard
  and bounds the TLS handshake by the header timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import web

MiB = 1024 * 1024


def _uncounted(limit: str) -> None:
    """No metric (unit tests, tools)."""


@dataclass(frozen=True)
class StreamLimits:
    """Bounds of one streaming session; `hit(name)` is told each time one is reached."""

    max_streams: int = 256  # open SPDY streams per session (an exec needs at most 5)
    max_port_forward_pairs: int = 100  # pairs per port-forward session, each a member stream
    max_frame_bytes: int = 1 * MiB  # one SPDY frame (Go peers send 32 KiB)
    max_message_bytes: int = 1 * MiB  # one WebSocket message
    resize_buffer_bytes: int = 4096  # an unfinished terminal-size message
    session_buffer_bytes: int = 1 * MiB  # received, not yet consumed, per session
    outbox_bytes: int = 256 * 1024  # answers and data waiting for a client that does not read
    idle_seconds: float = 4 * 3600.0  # no byte either way (the kubelet's streaming idle timeout)
    #: Frames that carry no data (PING, SYN_STREAM, RST_STREAM, SETTINGS, empty DATA, ...): each
    #: costs a decode and often an answer, so a flood of them is a CPU attack; beyond the rate
    #: (after the burst) reading pauses until the budget refills.
    control_frames_per_second: float = 100.0
    control_frame_burst: int = 1000
    hit: Callable[[str], None] = field(default=_uncounted, compare=False)


DEFAULT_LIMITS = StreamLimits()


def max_sessions(budget_bytes: int, limits: StreamLimits) -> int:
    """Streaming sessions a memory budget holds, each at its worst: its receive buffer, its
    outbox, one frame or message being read, and 64 KiB for the transport's own buffers."""
    worst = limits.session_buffer_bytes + limits.outbox_bytes + max(limits.max_frame_bytes, limits.max_message_bytes)
    return max(1, budget_bytes // (worst + 64 * 1024))


class ConnectionGuard:
    """Admission and header deadlines of the connections of one listener."""

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        max_pending_per_address: int = 64,
        header_seconds: float = 10.0,
        idle_seconds: float = 60.0,
        hit: Callable[[str], None] = _uncounted,
    ) -> None:
        self.max_connections = max_connections
        self.max_pending_per_address = max_pending_per_address
        self.header_seconds = header_seconds
        self.idle_seconds = idle_seconds
        self._hit = hit
        self._open: set[_Guarded] = set()
        self._pending: dict[str, int] = {}
        self._by_transport: dict[int, _Guarded] = {}

    @property
    def open(self) -> int:
        return len(self._open)

    def pending(self, address: str) -> int:
        return self._pending.get(address, 0)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, factory)

    def request_started(self, transport: Any) -> None:
        """A whole request's headers arrived on `transport`: no header deadline until it ends."""
        guarded = self._by_transport.get(id(transport))
        if guarded is not None:
            guarded.request_started()

    def request_ended(self, transport: Any, *, upgraded: bool) -> None:
        """The response went; a kept-alive connection has `idle_seconds` for its next request,
        an upgraded one is the streaming session's to time."""
        guarded = self._by_transport.get(id(transport))
        if guarded is not None:
            guarded.request_ended(upgraded=upgraded)

    # -- used by _Guarded ------------------------------------------------------------------------

    def _admit(self, guarded: _Guarded, *, known: bool) -> str | None:
        """None if admitted, else the limit that refuses it; a `known` client (a verified
        certificate) is not counted per address."""
        if len(self._open) >= self.max_connections:
            return "connections"
        if not known and self._pending.get(guarded.address, 0) >= self.max_pending_per_address:
            return "pending_per_address"
        self._open.add(guarded)
        if not known:
            self._pending[guarded.address] = self._pending.get(guarded.address, 0) + 1
        self._by_transport[id(guarded.transport)] = guarded
        return None

    def _settled(self, guarded: _Guarded) -> None:
        left = self._pending.get(guarded.address, 0) - 1
        if left > 0:
            self._pending[guarded.address] = left
        else:
            self._pending.pop(guarded.address, None)

    def _closed(self, guarded: _Guarded) -> None:
        self._open.discard(guarded)
        self._by_transport.pop(id(guarded.transport), None)

    def _count(self, limit: str) -> None:
        self._hit(limit)


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the guard: refused at once when over a
    limit, closed when its headers do not come in time."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self._pending = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream server's, TLS or not
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        # Only a certificate our client CA verified shows here (unverified ones fail the handshake).
        known = bool(transport.get_extra_info("peercert"))
        refused = self._guard._admit(self, known=known)
        if refused is not None:
            self._guard._count(refused)
            self.transport.abort()
            return
        self._pending = not known
        self._arm(self._guard.header_seconds, "header_timeout")
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def _arm(self, seconds: float, limit: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expired, limit)

    def _expired(self, limit: str) -> None:
        self._timer = None
        self._guard._count(limit)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def request_started(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            self._pending = False
            self._guard._settled(self)

    def request_ended(self, *, upgraded: bool) -> None:
        if not upgraded and self.transport is not None and not self.transport.is_closing():
            self._arm(self._guard.idle_seconds, "keepalive_idle")

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is None:
            return
        if self._pending:
            self._pending = False
            self._guard._settled(self)
        self._guard._closed(self)
        self._inner.connection_lost(exc)


class GuardedSite(web.BaseSite):
    """A TCP site (like aiohttp's TCPSite) whose connections pass `guard` first."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.wrap(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            # A client that never finishes its TLS handshake is held no longer than one that
            # never finishes its headers.
            ssl_handshake_timeout=self._guard.header_seconds if self._ssl_context else None,
        )
