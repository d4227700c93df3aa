"""An aiohttp application served on a free loopback port for the length of a test: the
stand-in member or client end of the streaming protocols' tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """Serve `app` on 127.0.0.1; the port it listens on."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        assert runner.addresses
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
