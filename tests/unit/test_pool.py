"""The apiserver connection pool (vkprovider.kube.pool): after a burst, a trickle of requests
keeps only the connections it needs; the rest idle out. Against a real aiohttp server on
localhost (the order of reuse does not depend on TLS); connections are counted from the kernel's
table of TCP sockets."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from tests.localhttp import serving
from vkprovider.kube.pool import NewestFirst


def _established_to(port: int) -> int:
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if int(remote.rsplit(":", 1)[1], 16) == port and state == "01":
                count += 1
    return count


async def _open_after_burst_and_trickle(connector: aiohttp.TCPConnector, keepalive: float) -> int:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)  # concurrent requests need connections of their own
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/", slow)
    async with serving(app) as port, aiohttp.ClientSession(connector=connector) as session:

        async def get() -> None:
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                await resp.read()

        await asyncio.gather(*(get() for _ in range(20)))
        assert _established_to(port) == 20
        deadline = time.monotonic() + 3 * keepalive + 0.1
        while time.monotonic() < deadline:
            await get()
            await asyncio.sleep(0.02)
        return _established_to(port)


@pytest.mark.asyncio
async def test_after_a_burst_a_trickle_keeps_one_connection_and_the_rest_idle_out() -> None:
    assert await _open_after_burst_and_trickle(NewestFirst(keepalive_timeout=0.5), 0.5) <= 2


@pytest.mark.asyncio
async def test_aiohttps_own_order_keeps_as_many_as_requests_come_within_a_keepalive() -> None:
    # Why the pool exists: oldest first, every connection is reused once per (connections x
    # request interval), so about keepalive / interval stay open (1.5 s / 0.07 s here, all 20;
    # with the default 15 s and a request every half second, 30). 1.5 s, not 0.5: on a loaded CI
    # machine the interval grew and only 3 of 0.5 / 0.07 stayed. Should aiohttp return to newest
    # first itself, this fails, and vkprovider.kube.pool can go.
    assert await _open_after_burst_and_trickle(aiohttp.TCPConnector(keepalive_timeout=1.5), 1.5) >= 4
