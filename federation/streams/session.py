"""What every stream to a member's apiserver shares (exec, attach, port-forward): the channel
messages of its WebSocket (the channel number in the first byte), and the limits that end a
session nobody uses (idle) or one that has run too long (total).

Traffic either way counts as use: the pumps toward the member `touch` the session's Activity,
and so does every message from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from vkprovider.provider import ProviderError


@dataclass(frozen=True)
class StreamLimits:
    #: Seconds without a byte either way before the session is ended (the kubelet's
    #: streamingConnectionIdleTimeout is 4 h).
    idle: float = 4 * 3600.0
    #: Seconds a session may last at most; 0: no limit.
    total: float = 0.0


@dataclass
class Activity:
    last: float = field(default_factory=time.monotonic)
    #: The close code the member sent, None while it sent none. Not `ws.close_code`: aiohttp
    #: answers a close frame with its own, and when the member has already shut the connection
    #: (an apiserver does at once after a command's end) that answer fails and aiohttp records
    #: 1006 in place of the member's 1000.
    closed_with: int | None = None

    @property
    def closed_normally(self) -> bool:
        return self.closed_with == aiohttp.WSCloseCode.OK

    def touch(self) -> None:
        self.last = time.monotonic()


async def channels(
    ws: aiohttp.ClientWebSocketResponse, limits: StreamLimits, activity: Activity
) -> AsyncIterator[tuple[int, bytes]]:
    """(channel, bytes) of each non-empty message until the member closes; ProviderError once
    the session was idle for `limits.idle`."""
    while True:
        left = activity.last + limits.idle - time.monotonic()
        if left <= 0:
            raise ProviderError(f"the session was idle for {limits.idle:.0f}s and was closed")
        try:
            message = await ws.receive(timeout=left)
        except TimeoutError:
            continue  # the other direction may have been busy: the loop's check decides
        if message.type == aiohttp.WSMsgType.CLOSE:
            activity.closed_with = message.data
            return
        if message.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            return
        if message.type == aiohttp.WSMsgType.ERROR:
            raise ProviderError(f"the connection to the member broke: {message.data!r}")
        if message.type == aiohttp.WSMsgType.BINARY and len(message.data) > 1:
            activity.touch()
            yield message.data[0], message.data[1:]


@contextlib.asynccontextmanager
async def total_limit(limits: StreamLimits) -> AsyncIterator[None]:
    """Ends the session after `limits.total` seconds (when set), with a ProviderError."""
    if limits.total <= 0:
        yield
        return
    try:
        async with asyncio.timeout(limits.total):
            yield
    except TimeoutError:
        raise ProviderError(f"the session reached its limit of {limits.total:.0f}s and was closed") from None
